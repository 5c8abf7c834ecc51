// A byte-level recognizer for one JSON document (RFC 8259), fed as it is
// generated: constrained decoding (response_format json_object) asks, for each
// candidate token, whether the text so far plus the token's bytes can still
// become a valid document. Bytes >= 0x80 are taken as they come inside
// strings (a token may end mid-character); UTF-8 is not checked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"

namespace tandem {

class JsonRecognizer {
 public:
  struct Limits {
    bool object_only = true;  // the document must be an object (OpenAI's json_object)
    int32_t max_whitespace = 20;  // in a row, outside strings: a model cannot pad forever
    int32_t max_depth = 64;   // at most 64: the open containers are bits of one word
  };
  JsonRecognizer() : JsonRecognizer(Limits{}) {}
  explicit JsonRecognizer(const Limits& lim) : lim_(lim) {}

  // False when `c` cannot come next; the state is then unspecified (feed a
  // copy to test a candidate).
  bool feed(char c);
  bool feed(std::string_view s) {
    for (char c : s)
      if (!feed(c)) return false;
    return true;
  }
  // A whole document has been read (only whitespace may follow).
  bool complete() const;

 private:
  enum class Expect : uint8_t { kValue, kFirstValueOrEnd, kFirstKeyOrEnd, kKey, kColon, kCommaOrEnd, kDone };
  enum class Lex : uint8_t { kNone, kString, kEscape, kUnicode, kLiteral, kNumber };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

  bool start_value(char c);
  void end_value();
  bool number_step(char c);
  bool number_terminal() const;

  Limits lim_;
  // Open containers, innermost in bit depth_ - 1, 1 = object. A plain word so
  // that testing a candidate token copies the state without allocating.
  uint64_t stack_ = 0;
  int32_t depth_ = 0;
  Expect expect_ = Expect::kValue;
  Lex lex_ = Lex::kNone;
  Num num_ = Num::kMinus;
  bool key_ = false;         // the string being read is an object key
  const char* literal_ = nullptr;
  int32_t pos_ = 0;          // literal: characters matched; \u: hex digits read
  int32_t whitespace_ = 0;   // in a row
};

class Tokenizer;

// Tokens that keep the output one JSON object: a token's bytes (its piece)
// must be a valid continuation; an end-of-generation token only once the
// object is complete (the engine ends the output there anyway); empty pieces
// (control tokens) never, so the output cannot stall on them.
class JsonConstraint : public TokenConstraint {
 public:
  // pieces: every token's text, as decoding writes it (shared by all requests).
  JsonConstraint(std::shared_ptr<const std::vector<std::string>> pieces, const Tokenizer& tok)
      : pieces_(std::move(pieces)), tok_(tok) {}
  bool allows(int32_t token) const override;
  void accept(int32_t token);  // the token chosen
  bool complete() const { return rec_.complete(); }

 private:
  std::shared_ptr<const std::vector<std::string>> pieces_;
  const Tokenizer& tok_;
  JsonRecognizer rec_;
};

}  // namespace tandem
