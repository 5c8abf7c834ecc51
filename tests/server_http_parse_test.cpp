// The strict HTTP/1.1 parser: what it accepts, every ambiguity it refuses,
// chunked bodies split at every byte, and a seeded fuzz of mutated requests.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/http_parse.h"

namespace tandem::server::http {
namespace {

struct Parsed {
  Parse status;
  RequestHead head;
  size_t consumed = 0;
  ParseError err;
};

Parsed head(const std::string& text, HeadLimits lim = {}) {
  Parsed p;
  p.status = parse_head(text, lim, p.head, p.consumed, p.err);
  return p;
}

void expect_error(const std::string& text, int status, const std::string& says) {
  const Parsed p = head(text);
  ASSERT_EQ(p.status, Parse::kError) << text;
  EXPECT_EQ(p.err.status, status) << text << ": " << p.err.message;
  EXPECT_NE(p.err.message.find(says), std::string::npos) << p.err.message;
}

TEST(HttpParse, RequestHeadAndPipelinedRest) {
  const std::string a = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: 5\r\n"
                        "X-Thing:  spaced value \t\r\n\r\n";
  const Parsed p = head(a + "hello" + "GET /health HTTP/1.1\r\n");
  ASSERT_EQ(p.status, Parse::kDone) << p.err.message;
  EXPECT_EQ(p.consumed, a.size());
  EXPECT_EQ(p.head.method, "POST");
  EXPECT_EQ(p.head.path, "/v1/completions");
  EXPECT_EQ(p.head.target, "/v1/completions?x=1");
  EXPECT_EQ(p.head.content_length, 5);
  EXPECT_FALSE(p.head.chunked);
  EXPECT_TRUE(p.head.keep_alive);
  ASSERT_NE(p.head.find("x-thing"), nullptr);
  EXPECT_EQ(*p.head.find("x-thing"), "spaced value");
  EXPECT_EQ(head("GET / HTTP/1.1\r\nHost: x\r\n").status, Parse::kIncomplete);
  // Empty lines before a request are skipped.
  EXPECT_EQ(head("\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n").status, Parse::kDone);
}

TEST(HttpParse, ConnectionHandlingByVersion) {
  EXPECT_FALSE(head("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").head.keep_alive);
  EXPECT_FALSE(head("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(head("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
                  .head.expect_continue);
  EXPECT_TRUE(head("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n").head.chunked);
}

TEST(HttpParse, AmbiguousFramingIsRefused) {
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400,
               "both Transfer-Encoding and Content-Length");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", 400,
               "more than one Content-Length");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\n", 400, "not a number");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\n", 400, "not a number");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, "too large");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "not supported");
  expect_error("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
               "not supported");
  expect_error("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0");
  expect_error("GET / HTTP/1.1\r\n\r\n", 400, "needs a Host");
  expect_error("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host");
  expect_error("GET / HTTP/1.1\r\nHost: a\r\nExpect: wishes\r\n\r\n", 417, "Expect");
}

TEST(HttpParse, MalformedLinesAreRefused) {
  using namespace std::string_literals;
  expect_error("GET / HTTP/1.1\r\nHost: x\r\nX-Key: abc\0\r\n\r\n"s, 400, "invalid byte 0x00");
  expect_error("GET / HTTP/1.1\r\nHost: x\r\nX-Key: a\x01z\r\n\r\n", 400, "invalid byte 0x01");
  expect_error("GET / HTTP/1.1\r\nHost: x\r\nX-Key: a\x7fz\r\n\r\n", 400, "invalid byte 0x7F");
  expect_error("GET / HTTP/1.1\r\nHost: x\r\nX-Key: a\r\n b\r\n\r\n", 400, "folded");
  expect_error("GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, "whitespace before ':'");
  expect_error("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, "no ':'");
  expect_error("GET / HTTP/1.1\nHost: x\r\n\r\n", 400, "bare LF");
  expect_error("GET / HTTP/1.1\r\nHost: x\rY: z\r\n\r\n", 400, "bare CR");
  expect_error("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "not supported");
  expect_error("GET / FTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line");
  expect_error("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line");
  expect_error("GET http://evil/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, "starting with '/'");
  expect_error("GET /a\x01 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid byte");
  expect_error("G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "method");
  // A bare LF is refused as soon as it is seen, not once 16 KiB have come.
  const Parsed early = head("GET / HTTP/1.1\nHost");
  EXPECT_EQ(early.status, Parse::kError);
}

TEST(HttpParse, HeadLimits) {
  HeadLimits lim;
  lim.max_head_bytes = 256;
  lim.max_headers = 4;
  Parsed p = head("GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(300, 'a'), lim);
  EXPECT_EQ(p.status, Parse::kError);
  EXPECT_EQ(p.err.status, 431);
  std::string many = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 5; ++i) many += "X" + std::to_string(i) + ": y\r\n";
  p = head(many + "\r\n", lim);
  EXPECT_EQ(p.status, Parse::kError);
  EXPECT_EQ(p.err.status, 431);
}

// Decodes `wire` fed in pieces of `step` bytes.
std::string decode(const std::string& wire, size_t step, Parse& status, ParseError& err, size_t& rest,
                   size_t max_body = 1 << 20) {
  ChunkedDecoder d(max_body);
  std::string out;
  size_t off = 0;
  status = Parse::kIncomplete;
  while (off < wire.size() && status == Parse::kIncomplete) {
    const std::string piece = wire.substr(off, step);
    size_t used = 0;
    status = d.feed(piece, used, out, err);
    EXPECT_LE(used, piece.size());
    off += used;
    if (status == Parse::kIncomplete) {
      EXPECT_EQ(used, piece.size());
    }
  }
  rest = wire.size() - off;
  return out;
}

TEST(HttpParse, ChunkedBodiesAtEverySplit) {
  const std::string wire = "5;name=value\r\nhello\r\n1A\r\n" + std::string(26, 'z') + "\r\n0\r\nTrailer: x\r\n\r\nGET";
  for (size_t step = 1; step <= wire.size(); ++step) {
    Parse st;
    ParseError err;
    size_t rest = 0;
    const std::string body = decode(wire, step, st, err, rest);
    ASSERT_EQ(st, Parse::kDone) << "step " << step << ": " << err.message;
    EXPECT_EQ(body, "hello" + std::string(26, 'z'));
    EXPECT_EQ(rest, 3u) << "the pipelined bytes after the body stay unread";
  }
}

TEST(HttpParse, ChunkedErrors) {
  const auto bad = [](const std::string& wire, int status, size_t max_body = 1 << 20) {
    Parse st;
    ParseError err;
    size_t rest = 0;
    decode(wire, 7, st, err, rest, max_body);
    EXPECT_EQ(st, Parse::kError) << wire;
    EXPECT_EQ(err.status, status) << wire << ": " << err.message;
  };
  bad("x\r\n", 400);                           // no size
  bad("5\r\nhelloXY", 400);                    // data not followed by CRLF
  bad("5\nhello\r\n", 400);                    // bare LF
  bad("fffffffffffffffff\r\n", 413);           // size beyond 15 hex digits
  bad("10\r\n", 413, 8);                       // over the body limit before any data
  bad("4\r\nabcd\r\n4\r\nefgh\r\n", 413, 6);   // over it in the second chunk
  bad("5 x\r\n", 400);                         // junk after the size
  bad("0\r\nBad\x01Trailer\r\n\r\n", 400);
  std::string many = "0\r\n";
  for (int i = 0; i < 70; ++i) many += "T: x\r\n";
  bad(many + "\r\n", 431);
}

// Mutated requests in random splits: never a crash or an out-of-bounds read
// (the suite runs under ASan too), every verdict well-formed, and a request
// that parses always reports consistent framing.
TEST(HttpParse, SeededFuzz) {
  const std::string seeds[] = {
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{\"a\":1}   ",
      "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
      "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
  };
  std::mt19937 rng(20261204);
  int done = 0, errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seeds[iter % 3];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[at] = static_cast<char>(rng() % 256); break;
        case 1: s.insert(at, 1, "\r\n:; \t\0\x7f"[rng() % 8]); break;
        case 2: s.erase(at, 1 + rng() % 8); break;
        case 3: s.insert(at, s.substr(rng() % s.size(), rng() % 16)); break;
        case 4: s.resize(at); break;
      }
    }
    RequestHead h;
    size_t used = 0;
    ParseError err;
    const Parse p = parse_head(s, HeadLimits{}, h, used, err);
    if (p == Parse::kError) {
      ++errors;
      EXPECT_GE(err.status, 400);
      EXPECT_FALSE(err.message.empty());
      continue;
    }
    if (p == Parse::kIncomplete) continue;
    ++done;
    ASSERT_LE(used, s.size());
    EXPECT_FALSE(h.chunked && h.content_length > 0);
    if (!h.chunked) continue;
    ChunkedDecoder d(1 << 16);
    std::string body;
    size_t off = used;
    Parse st = Parse::kIncomplete;
    while (off < s.size() && st == Parse::kIncomplete) {
      const size_t n = 1 + rng() % 9;
      size_t u = 0;
      st = d.feed(std::string_view(s).substr(off, n), u, body, err);
      ASSERT_LE(u, n);
      off += u;
      if (st == Parse::kIncomplete && u == 0) break;
    }
    EXPECT_LE(body.size(), size_t{1} << 16);
  }
  EXPECT_GT(done, 100);
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace tandem::server::http
