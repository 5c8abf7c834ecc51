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

#include "engine/json_schema.h"
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
  // With a schema (kept by the caller), the document must also satisfy it
  // (engine/json_schema.h says what is enforced); its root decides the
  // document's type instead of object_only.
  explicit JsonRecognizer(const Limits& lim, const CompiledSchema* schema = nullptr);

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
  bool end_value();
  bool number_step(char c);
  bool number_terminal() const;
  // Schema checks (no-ops without a schema).
  bool match_literal(char c);
  bool key_start();
  bool key_char(char c);
  bool may_close(bool object) const;
  bool close(bool object);
  bool more_possible(bool object) const;
  int32_t value_node() const;

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

  // With a schema: the open containers' nodes, and the candidates (object
  // keys, or enum values) that the current key or value may still become.
  struct Frame {
    int32_t node = 0;
    int32_t child = 0;  // the node of the next value: the current key's, or the items'
    uint64_t used = 0;  // object: properties given so far
    int32_t items = 0;  // array: values so far
  };
  const CompiledSchema* schema_ = nullptr;
  std::vector<Frame> frames_;
  uint64_t cand_ = 0;
  int32_t cand_pos_ = 0;
  bool literal_value_ = false;  // the current value must be one of its node's literals
  bool int_only_ = false;       // the current number must be an integer
};

class Tokenizer;

// A constraint a sequence's output follows to its end (response_format, tool
// calls): told each token chosen; complete() once nothing more may follow,
// which ends the output.
class OutputConstraint : public TokenConstraint {
 public:
  virtual void accept(int32_t token) = 0;
  virtual bool complete() const = 0;
};

// Every token's text as decoding writes it: what a JsonConstraint reads.
std::shared_ptr<const std::vector<std::string>> token_pieces(const Tokenizer& tok);

// Tokens that keep the output one JSON object (of the schema, when given): a token's bytes (its piece)
// must be a valid continuation; an end-of-generation token only once the
// object is complete (the engine ends the output there anyway); empty pieces
// (control tokens) never, so the output cannot stall on them.
class JsonConstraint : public OutputConstraint {
 public:
  // pieces: every token's text, as decoding writes it (shared by all requests).
  // schema: also what the object must satisfy (json_schema), or null.
  JsonConstraint(std::shared_ptr<const std::vector<std::string>> pieces, const Tokenizer& tok,
                 std::shared_ptr<const CompiledSchema> schema = nullptr)
      : pieces_(std::move(pieces)), tok_(tok), schema_(std::move(schema)),
        rec_(JsonRecognizer::Limits{}, schema_.get()) {}
  bool allows(int32_t token) const override;
  void accept(int32_t token) override;  // the token chosen
  bool complete() const override { return rec_.complete(); }

 private:
  std::shared_ptr<const std::vector<std::string>> pieces_;
  const Tokenizer& tok_;
  std::shared_ptr<const CompiledSchema> schema_;
  JsonRecognizer rec_;
};

}  // namespace tandem
