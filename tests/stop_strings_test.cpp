#include "engine/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace tandem {
namespace {

StopMatch stop(std::string_view text, std::vector<std::string> stops) { return find_stop(text, stops); }

TEST(FindStopTest, NoStopStrings) {
  const StopMatch m = stop("hello", {});
  EXPECT_EQ(m.pos, std::string::npos);
  EXPECT_EQ(m.safe_len, 5u);
  EXPECT_EQ(stop("hello", {""}).safe_len, 5u);  // empty stops are ignored
}

TEST(FindStopTest, FullMatch) {
  StopMatch m = stop("Hello<end_of_turn>more", {"<end_of_turn>"});
  EXPECT_EQ(m.pos, 5u);
  EXPECT_EQ(m.safe_len, 5u);
  m = stop("Hello<end_of_turn>", {"<end_of_turn>"});  // complete at the very end
  EXPECT_EQ(m.pos, 5u);
  EXPECT_EQ(m.safe_len, 5u);
  m = stop("<end_of_turn>", {"<end_of_turn>"});
  EXPECT_EQ(m.pos, 0u);
  EXPECT_EQ(m.safe_len, 0u);
}

TEST(FindStopTest, PartialMatchAtEndIsHeldBack) {
  StopMatch m = stop("Hello<end_of", {"<end_of_turn>"});
  EXPECT_EQ(m.pos, std::string::npos);
  EXPECT_EQ(m.safe_len, 5u);
  EXPECT_EQ(stop("Hello<", {"<end_of_turn>"}).safe_len, 5u);
  EXPECT_EQ(stop("<end", {"<end_of_turn>"}).safe_len, 0u);
  // A '<' in the middle is not held back, only a tail that could grow into a stop.
  EXPECT_EQ(stop("a < b", {"<end_of_turn>"}).safe_len, 5u);
  EXPECT_EQ(stop("Hello<x", {"<end_of_turn>"}).safe_len, 7u);
}

TEST(FindStopTest, SeveralStopsEarliestWins) {
  StopMatch m = stop("a END b STOP", {"STOP", "END"});
  EXPECT_EQ(m.pos, 2u);
  EXPECT_EQ(m.safe_len, 2u);
  // Partial of one stop, none of the other.
  m = stop("hi <|eo", {"</s>", "<|eot_id|>"});
  EXPECT_EQ(m.pos, std::string::npos);
  EXPECT_EQ(m.safe_len, 3u);
  // Two stops partially matching different tails: the longer tail decides.
  m = stop("xab", {"bz", "abz"});
  EXPECT_EQ(m.safe_len, 1u);
}

TEST(FindStopTest, OverlappingStops) {
  EXPECT_EQ(stop("xxabcd", {"bcd", "abc"}).pos, 2u);
  EXPECT_EQ(stop("xxbcd", {"abc", "bcd"}).pos, 2u);
  // Self-overlapping stop: the longest tail that is a prefix is held back.
  EXPECT_EQ(stop("xaa", {"aab"}).safe_len, 1u);
  EXPECT_EQ(stop("xaaa", {"aab"}).safe_len, 2u);
  EXPECT_EQ(stop("xaba", {"abab"}).safe_len, 1u);
  EXPECT_EQ(stop("xabab", {"abab"}).pos, 1u);
  // A stop inside another: the shorter one completes first.
  const StopMatch m = stop("x</s", {"</s>", "</"});
  EXPECT_EQ(m.pos, 1u);
}

TEST(FindStopTest, StreamingNeverEmitsPartOfAStop) {
  // Feed a reply one byte at a time; what is emitted never contains a stop
  // or a piece of one, and everything before the stop comes out.
  const std::string reply = "The answer is <4>.<end_of_turn>ignored";
  const std::vector<std::string> stops = {"<end_of_turn>", "<eos>"};
  std::string emitted;
  size_t done = 0;
  for (size_t n = 1; n <= reply.size(); ++n) {
    const std::string_view text(reply.data(), n);
    const StopMatch m = find_stop(text, stops);
    ASSERT_GE(m.safe_len, done);
    emitted += text.substr(done, m.safe_len - done);
    done = m.safe_len;
    if (m.pos != std::string::npos) break;
  }
  EXPECT_EQ(emitted, "The answer is <4>.");
}

}  // namespace
}  // namespace tandem
