#include "engine/json_grammar.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

void JsonRecognizer::end_value() { expect_ = depth_ == 0 ? Expect::kDone : Expect::kCommaOrEnd; }

bool JsonRecognizer::number_step(char c) {
  const bool digit = is_digit(c), exp = c == 'e' || c == 'E';
  switch (num_) {
    case Num::kMinus:
      if (c == '0') num_ = Num::kZero;
      else if (digit) num_ = Num::kInt;
      else return false;
      return true;
    case Num::kZero:
    case Num::kInt:
      if (digit && num_ == Num::kInt) return true;
      if (c == '.') num_ = Num::kDot;
      else if (exp) num_ = Num::kExp;
      else return false;
      return true;
    case Num::kDot:
      if (!digit) return false;
      num_ = Num::kFrac;
      return true;
    case Num::kFrac:
      if (digit) return true;
      if (!exp) return false;
      num_ = Num::kExp;
      return true;
    case Num::kExp:
      if (c == '+' || c == '-') num_ = Num::kExpSign;
      else if (digit) num_ = Num::kExpDigits;
      else return false;
      return true;
    case Num::kExpSign:
    case Num::kExpDigits:
      if (!digit) return false;
      num_ = Num::kExpDigits;
      return true;
  }
  return false;
}

bool JsonRecognizer::number_terminal() const {
  return num_ == Num::kZero || num_ == Num::kInt || num_ == Num::kFrac || num_ == Num::kExpDigits;
}

bool JsonRecognizer::start_value(char c) {
  if (lim_.object_only && depth_ == 0 && c != '{') return false;
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= std::min(lim_.max_depth, 64)) return false;
      stack_ = (stack_ & ~(uint64_t{1} << depth_)) | (uint64_t{c == '{'} << depth_);
      ++depth_;
      expect_ = c == '{' ? Expect::kFirstKeyOrEnd : Expect::kFirstValueOrEnd;
      return true;
    case '"':
      lex_ = Lex::kString;
      key_ = false;
      return true;
    case 't':
    case 'f':
    case 'n':
      lex_ = Lex::kLiteral;
      literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      pos_ = 1;
      return true;
    default:
      if (c != '-' && !is_digit(c)) return false;
      lex_ = Lex::kNumber;
      num_ = c == '-' ? Num::kMinus : c == '0' ? Num::kZero : Num::kInt;
      return true;
  }
}

bool JsonRecognizer::feed(char c) {
  switch (lex_) {
    case Lex::kString:
      if (c == '"') {
        lex_ = Lex::kNone;
        if (key_) expect_ = Expect::kColon;
        else end_value();
      } else if (c == '\\') {
        lex_ = Lex::kEscape;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return false;  // control characters must be escaped
      }
      return true;
    case Lex::kEscape:
      if (c == 'u') {
        lex_ = Lex::kUnicode;
        pos_ = 0;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      lex_ = Lex::kString;
      return true;
    case Lex::kUnicode:
      if (!is_hex(c)) return false;
      if (++pos_ == 4) lex_ = Lex::kString;
      return true;
    case Lex::kLiteral:
      if (c != literal_[pos_]) return false;
      if (literal_[++pos_] == '\0') {
        lex_ = Lex::kNone;
        end_value();
      }
      return true;
    case Lex::kNumber:
      if (number_step(c)) return true;
      if (!number_terminal()) return false;
      lex_ = Lex::kNone;  // c ends the number; it is read below
      end_value();
      break;
    case Lex::kNone:
      break;
  }

  if (is_ws(c)) return ++whitespace_ <= lim_.max_whitespace;
  whitespace_ = 0;
  const bool in_object = depth_ > 0 && ((stack_ >> (depth_ - 1)) & 1);
  switch (expect_) {
    case Expect::kDone:
      return false;
    case Expect::kFirstValueOrEnd:
      if (c == ']') {
        --depth_;
        end_value();
        return true;
      }
      return start_value(c);
    case Expect::kValue:
      return start_value(c);
    case Expect::kFirstKeyOrEnd:
      if (c == '}') {
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::kKey:
      if (c != '"') return false;
      lex_ = Lex::kString;
      key_ = true;
      return true;
    case Expect::kColon:
      if (c != ':') return false;
      expect_ = Expect::kValue;
      return true;
    case Expect::kCommaOrEnd:
      if (c == ',') {
        expect_ = in_object ? Expect::kKey : Expect::kValue;
        return true;
      }
      if (c != (in_object ? '}' : ']')) return false;
      --depth_;
      end_value();
      return true;
  }
  return false;
}

bool JsonConstraint::allows(int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= pieces_->size()) return false;
  if (tok_.is_eog(token)) return rec_.complete();
  const std::string& piece = (*pieces_)[static_cast<size_t>(token)];
  if (piece.empty()) return false;
  JsonRecognizer r = rec_;
  return r.feed(piece);
}

void JsonConstraint::accept(int32_t token) {
  if (token >= 0 && static_cast<size_t>(token) < pieces_->size() && !tok_.is_eog(token))
    rec_.feed((*pieces_)[static_cast<size_t>(token)]);
}

bool JsonRecognizer::complete() const {
  if (lex_ == Lex::kNone) return expect_ == Expect::kDone;
  // A top-level number has no closing character: it is whole when it could end here.
  return lex_ == Lex::kNumber && depth_ == 0 && number_terminal();
}

}  // namespace tandem
