#include "engine/json_grammar.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonRecognizer::JsonRecognizer(const Limits& lim, const CompiledSchema* schema) : lim_(lim), schema_(schema) {
  if (schema_) lim_.object_only = false;  // the root node says what the document is
}

bool JsonRecognizer::end_value() {
  if (literal_value_) {
    const std::vector<std::string>& lits = schema_->nodes[value_node()].literals;
    bool whole = false;
    for (size_t i = 0; i < lits.size(); ++i)
      whole |= ((cand_ >> i) & 1) && static_cast<int32_t>(lits[i].size()) == cand_pos_;
    if (!whole) return false;
    literal_value_ = false;
  }
  int_only_ = false;
  expect_ = depth_ == 0 ? Expect::kDone : Expect::kCommaOrEnd;
  return true;
}

// The node of the value being read or about to start.
int32_t JsonRecognizer::value_node() const {
  return frames_.empty() ? schema_->root : frames_.back().child;
}

bool JsonRecognizer::match_literal(char c) {
  if (!literal_value_) return true;
  const std::vector<std::string>& lits = schema_->nodes[value_node()].literals;
  for (size_t i = 0; i < lits.size(); ++i)
    if (((cand_ >> i) & 1) && (static_cast<int32_t>(lits[i].size()) <= cand_pos_ || lits[i][cand_pos_] != c))
      cand_ &= ~(uint64_t{1} << i);
  ++cand_pos_;
  return cand_ != 0;
}

bool JsonRecognizer::key_start() {
  if (!schema_) return true;
  const SchemaNode& n = schema_->nodes[frames_.back().node];
  cand_pos_ = 0;
  if (!n.closed) return true;
  const size_t np = n.properties.size();
  cand_ = (np == 64 ? ~uint64_t{0} : (uint64_t{1} << np) - 1) & ~frames_.back().used;
  return cand_ != 0;
}

// A character of a key, its closing quote included.
bool JsonRecognizer::key_char(char c) {
  if (!schema_) return true;
  Frame& f = frames_.back();
  const SchemaNode& n = schema_->nodes[f.node];
  if (!n.closed) {
    f.child = 0;
    return true;
  }
  if (c == '\\') return false;  // declared names are matched as written
  for (size_t i = 0; i < n.properties.size(); ++i) {
    if (!((cand_ >> i) & 1)) continue;
    const std::string& name = n.properties[i].first;
    const bool ends = static_cast<int32_t>(name.size()) == cand_pos_;
    if (c == '"' && ends) {
      f.used |= uint64_t{1} << i;
      f.child = n.properties[i].second;
      return true;
    }
    if (c == '"' || ends || name[cand_pos_] != c) cand_ &= ~(uint64_t{1} << i);
  }
  ++cand_pos_;
  return c != '"' && cand_ != 0;
}

// Whether the innermost container may close now.
bool JsonRecognizer::may_close(bool object) const {
  if (!schema_) return true;
  const Frame& f = frames_.back();
  const SchemaNode& n = schema_->nodes[f.node];
  return object ? (f.used & n.required) == n.required : f.items >= n.min_items;
}

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
  if (schema_) {
    if (!frames_.empty() && !((stack_ >> (depth_ - 1)) & 1)) {  // an array's next item
      Frame& f = frames_.back();
      if (f.items >= schema_->nodes[f.node].max_items) return false;
      ++f.items;
    }
    const SchemaNode& n = schema_->nodes[value_node()];
    uint8_t type = 0;
    switch (c) {
      case '{': type = SchemaNode::kObject; break;
      case '[': type = SchemaNode::kArray; break;
      case '"': type = SchemaNode::kString; break;
      case 't': case 'f': type = SchemaNode::kBoolean; break;
      case 'n': type = SchemaNode::kNull; break;
      default: type = SchemaNode::kNumber | SchemaNode::kInteger; break;
    }
    if (!(n.types & type)) return false;
    int_only_ = (n.types & SchemaNode::kNumber) == 0;
    if (!n.literals.empty()) {
      literal_value_ = true;
      cand_ = n.literals.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
      cand_pos_ = 0;
      if (!match_literal(c)) return false;
    }
  }
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= std::min(lim_.max_depth, 64)) return false;
      if (schema_) {
        const int32_t id = value_node();
        frames_.push_back({id, c == '[' ? schema_->nodes[id].items : 0, 0, 0});
      }
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
  if (lex_ != Lex::kNone && lex_ != Lex::kNumber) {  // inside a string or a literal
    if (key_ ? !key_char(c) : !match_literal(c)) return false;
  }
  switch (lex_) {
    case Lex::kString:
      if (c == '"') {
        lex_ = Lex::kNone;
        if (!key_) return end_value();
        key_ = false;
        expect_ = Expect::kColon;
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
        return end_value();
      }
      return true;
    case Lex::kNumber:
      if (number_step(c)) return !(int_only_ && (c == '.' || c == 'e' || c == 'E')) && match_literal(c);
      if (!number_terminal()) return false;
      lex_ = Lex::kNone;  // c ends the number; it is read below
      if (!end_value()) return false;
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
      if (c == ']') return close(false);
      return start_value(c);
    case Expect::kValue:
      return start_value(c);
    case Expect::kFirstKeyOrEnd:
      if (c == '}') return close(true);
      [[fallthrough]];
    case Expect::kKey:
      if (c != '"') return false;
      lex_ = Lex::kString;
      key_ = true;
      return key_start();
    case Expect::kColon:
      if (c != ':') return false;
      expect_ = Expect::kValue;
      return true;
    case Expect::kCommaOrEnd:
      if (c == ',') {
        expect_ = in_object ? Expect::kKey : Expect::kValue;
        return more_possible(in_object);
      }
      if (c != (in_object ? '}' : ']')) return false;
      return close(in_object);
  }
  return false;
}

std::shared_ptr<const std::vector<std::string>> token_pieces(const Tokenizer& tok) {
  auto v = std::make_shared<std::vector<std::string>>(static_cast<size_t>(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id) (*v)[static_cast<size_t>(id)] = tok.token_to_piece(id);
  return v;
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

bool JsonRecognizer::close(bool object) {
  if (!may_close(object)) return false;
  --depth_;
  if (schema_) frames_.pop_back();
  return end_value();
}

// At a comma: whether another key (object) or item (array) may follow. A
// comma after which nothing may come would leave the output at a dead end.
bool JsonRecognizer::more_possible(bool object) const {
  if (!schema_) return true;
  const Frame& f = frames_.back();
  const SchemaNode& n = schema_->nodes[f.node];
  if (!object) return f.items < n.max_items;
  if (!n.closed) return true;
  const size_t np = n.properties.size();
  return ((np == 64 ? ~uint64_t{0} : (uint64_t{1} << np) - 1) & ~f.used) != 0;
}

bool JsonRecognizer::complete() const {
  if (lex_ == Lex::kNone) return expect_ == Expect::kDone;
  // A top-level number has no closing character: it is whole when it could end here.
  if (lex_ != Lex::kNumber || depth_ != 0 || !number_terminal()) return false;
  if (!literal_value_) return true;
  JsonRecognizer r = *this;
  return r.end_value();
}

}  // namespace tandem
