// Constrained decoding of tool calls: the output is one or more calls in the
// chat family's syntax (chat/tool_format.h), each naming one of the allowed
// functions with arguments that fit that function's parameter schema. In
// "auto" mode the output is free text until the family's marker (its text,
// its control token, or a bare call's lead at the start), and held to the
// calls from there on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/tool_format.h"
#include "engine/json_grammar.h"
#include "engine/json_schema.h"

namespace tandem {

struct ToolCallGrammar {
  ToolSyntax syntax;
  // The functions a call may name, each with its compiled parameter schema
  // (whose root is an object). At most 64.
  std::vector<std::pair<std::string, std::shared_ptr<const CompiledSchema>>> functions;
  bool forced = true;     // calls from the first byte; false: after the marker ("auto")
  int32_t max_calls = 1;  // calls in one output (parallel_tool_calls)
};

// The vocab's id of the syntax's marker when it is a control token (it
// spells no text, so only its id shows it was generated); -1 otherwise.
int32_t tool_marker_token(const ToolSyntax& s, const Tokenizer& tok);

// Byte by byte, as JsonRecognizer: whether the text so far can still become
// the calls the grammar allows. Inside the arguments, values are bounded so
// that every call ends within a known length: a string at most
// kMaxStringBytes, at most kMaxDigits digits in a row, at most
// kMaxWhitespace whitespace characters in a row (a small model sampling a
// value can otherwise run on until max_tokens cuts the JSON short).
class ToolCallRecognizer {
 public:
  static constexpr int32_t kMaxStringBytes = 256;
  static constexpr int32_t kMaxDigits = 18;  // a number's integer, fraction or exponent digits
  static constexpr int32_t kMaxWhitespace = 4;
  explicit ToolCallRecognizer(const ToolCallGrammar& g);
  bool feed(char c);  // false when `c` cannot come next; the state is then unspecified
  bool feed(std::string_view s) {
    for (char c : s)
      if (!feed(c)) return false;
    return true;
  }
  // The marker's control token was generated: the calls begin, after at
  // most kMaxWhitespace whitespace bytes (SentencePiece vocabs spell the
  // next piece with a leading space). False when they cannot begin here
  // (forced, or already begun).
  bool open();
  bool may_end() const;   // the output may end here
  bool complete() const;  // nothing may follow
  bool active() const { return phase_ != Phase::kWaiting; }  // auto: past the marker

 private:
  enum class Phase : uint8_t { kWaiting, kLiteral, kName, kArgs, kAfterCall, kDone };
  void after_call();
  bool within_bounds(char c);  // the arguments' value bounds, for the next byte
  const ToolCallGrammar* g_;
  Phase phase_;
  std::string tail_;     // kWaiting: the last bytes, as long as the marker
  bool at_start_ = false;  // kWaiting with bare_start: no text but whitespace yet
  size_t start_pos_ = 0;   // kWaiting: bytes of bare_lead() matched
  std::string literal_;  // kLiteral: the text that must come
  size_t pos_ = 0;       // kLiteral: bytes of it matched; kName: the name's bytes so far
  int32_t lead_ws_ = -1;  // kLiteral after open(): whitespace bytes before it; -1: none may come
  Phase after_literal_ = Phase::kName;
  uint64_t names_ = 0;   // kName: the functions whose names still match
  int32_t function_ = -1;
  JsonRecognizer args_;  // kArgs: the arguments so far
  bool in_string_ = false;
  int8_t escape_ = 0;    // -1: after a backslash; k > 0: hex digits of \u left
  int32_t string_bytes_ = 0, digits_ = 0, whitespace_ = 0;
  int32_t calls_ = 0;
  std::string after_next_, after_end_;  // kAfterCall: separator + open + lead, and suffix
  size_t after_pos_ = 0;
  bool next_alive_ = false, end_alive_ = false;
};

class ToolCallConstraint : public OutputConstraint {
 public:
  ToolCallConstraint(std::shared_ptr<const std::vector<std::string>> pieces, const Tokenizer& tok,
                     std::shared_ptr<const ToolCallGrammar> grammar);
  bool allows(int32_t token) const override;
  void accept(int32_t token) override;
  bool complete() const override { return rec_.complete(); }

 private:
  std::shared_ptr<const std::vector<std::string>> pieces_;
  const Tokenizer& tok_;
  std::shared_ptr<const ToolCallGrammar> grammar_;
  ToolCallRecognizer rec_;
};

}  // namespace tandem
