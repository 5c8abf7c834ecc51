#include "engine/tool_call_grammar.h"

#include "tokenizer/tokenizer.h"

namespace tandem {

ToolCallRecognizer::ToolCallRecognizer(const ToolCallGrammar& g) : g_(&g) {
  const ToolSyntax& s = g.syntax;
  if (g.forced) {
    phase_ = Phase::kLiteral;
    literal_ = s.prefix + s.open + s.name_lead();
    after_literal_ = Phase::kName;
  } else {
    phase_ = Phase::kWaiting;
    at_start_ = s.bare_start;
  }
  names_ = g.functions.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << g.functions.size()) - 1;
  after_next_ = s.separator + s.open + s.name_lead();
  after_end_ = s.suffix;
}

void ToolCallRecognizer::after_call() {
  ++calls_;
  next_alive_ = calls_ < g_->max_calls;
  end_alive_ = true;
  after_pos_ = 0;
  phase_ = (!next_alive_ && after_end_.empty()) ? Phase::kDone : Phase::kAfterCall;
  if (!next_alive_ && phase_ == Phase::kAfterCall) {
    // Only the suffix can follow.
    phase_ = Phase::kLiteral;
    literal_ = after_end_;
    pos_ = 0;
    after_literal_ = Phase::kDone;
  }
}

bool ToolCallRecognizer::feed(char c) {
  const ToolSyntax& s = g_->syntax;
  switch (phase_) {
    case Phase::kWaiting: {
      // Free text until it ends with the marker; the calls' grammar holds from there.
      if (at_start_) {
        const std::string lead = s.bare_lead();
        if (start_pos_ == 0 && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) return true;
        if (lead[start_pos_] == c) {
          if (++start_pos_ == lead.size()) {
            at_start_ = false;
            phase_ = Phase::kLiteral;
            literal_ = s.name_lead().substr(lead.size());
            pos_ = 0;
            after_literal_ = Phase::kName;
          }
          return true;
        }
        at_start_ = false;
      }
      if (!s.text_marker) return true;
      const std::string marker = s.prefix + s.open;
      tail_ += c;
      if (tail_.size() > marker.size()) tail_.erase(0, tail_.size() - marker.size());
      if (tail_ == marker) {
        phase_ = Phase::kLiteral;
        literal_ = s.name_lead();
        pos_ = 0;
        after_literal_ = Phase::kName;
      }
      return true;
    }
    case Phase::kLiteral:
      if (lead_ws_ >= 0) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return ++lead_ws_ <= kMaxWhitespace;
        lead_ws_ = -1;
      }
      if (pos_ >= literal_.size() || literal_[pos_] != c) return false;
      if (++pos_ == literal_.size()) {
        if (after_literal_ == Phase::kAfterCall) {
          after_call();
          return true;
        }
        phase_ = after_literal_;
        pos_ = 0;
        if (phase_ == Phase::kName) {
          names_ = g_->functions.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << g_->functions.size()) - 1;
        }
      }
      return true;
    case Phase::kName: {
      if (c == '"') {
        for (size_t i = 0; i < g_->functions.size(); ++i)
          if (((names_ >> i) & 1) && g_->functions[i].first.size() == pos_) {
            function_ = static_cast<int32_t>(i);
            JsonRecognizer::Limits lim;
            args_ = JsonRecognizer(lim, g_->functions[i].second.get());
            in_string_ = false;
            escape_ = 0;
            string_bytes_ = digits_ = whitespace_ = 0;
            phase_ = Phase::kLiteral;
            literal_ = s.args_lead().substr(1);
            pos_ = 0;
            after_literal_ = Phase::kArgs;
            return true;
          }
        return false;
      }
      uint64_t keep = 0;
      for (size_t i = 0; i < g_->functions.size(); ++i) {
        const std::string& n = g_->functions[i].first;
        if (((names_ >> i) & 1) && pos_ < n.size() && n[pos_] == c) keep |= uint64_t{1} << i;
      }
      if (!keep) return false;
      names_ = keep;
      ++pos_;
      return true;
    }
    case Phase::kArgs:
      if (args_.complete() && c == s.close[0]) {
        if (s.close.size() == 1) {
          after_call();
        } else {
          phase_ = Phase::kLiteral;
          literal_ = s.close;
          pos_ = 1;
          after_literal_ = Phase::kAfterCall;
        }
        return true;
      }
      return within_bounds(c) && args_.feed(c);
    case Phase::kAfterCall: {
      const bool next = next_alive_ && after_pos_ < after_next_.size() && after_next_[after_pos_] == c;
      const bool end = end_alive_ && after_pos_ < after_end_.size() && after_end_[after_pos_] == c;
      if (!next && !end) return false;
      next_alive_ = next;
      end_alive_ = end;
      ++after_pos_;
      if (next && after_pos_ == after_next_.size()) {
        phase_ = Phase::kName;
        pos_ = 0;
        names_ = g_->functions.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << g_->functions.size()) - 1;
      } else if (end && after_pos_ == after_end_.size()) {
        phase_ = Phase::kDone;
      }
      return true;
    }
    case Phase::kDone:
      return false;
  }
  return false;
}

bool ToolCallRecognizer::open() {
  if (phase_ != Phase::kWaiting) return false;
  const ToolSyntax& s = g_->syntax;
  at_start_ = false;
  phase_ = Phase::kLiteral;
  literal_ = s.prefix + s.open + s.name_lead();
  pos_ = 0;
  lead_ws_ = 0;
  after_literal_ = Phase::kName;
  return true;
}

bool ToolCallRecognizer::within_bounds(char c) {
  if (in_string_) {
    ++string_bytes_;
    if (escape_ == -1) {
      escape_ = c == 'u' ? 4 : 0;
      return true;
    }
    if (escape_ > 0) {
      --escape_;  // an escape begun is always let finish
      return true;
    }
    if (c == '"') {
      in_string_ = false;
      return true;
    }
    if (string_bytes_ > kMaxStringBytes) return false;
    if (c == '\\') escape_ = -1;
    return true;
  }
  if (c == '"') {
    in_string_ = true;
    string_bytes_ = 0;
    digits_ = whitespace_ = 0;
    return true;
  }
  digits_ = (c >= '0' && c <= '9') ? digits_ + 1 : 0;
  whitespace_ = (c == ' ' || c == '\n' || c == '\t' || c == '\r') ? whitespace_ + 1 : 0;
  return digits_ <= kMaxDigits && whitespace_ <= kMaxWhitespace;
}

bool ToolCallRecognizer::may_end() const {
  switch (phase_) {
    case Phase::kWaiting:
    case Phase::kDone: return true;
    case Phase::kAfterCall: return after_pos_ == 0 && after_end_.empty();  // the separator not begun
    default: return false;
  }
}

bool ToolCallRecognizer::complete() const { return phase_ == Phase::kDone; }

ToolCallConstraint::ToolCallConstraint(std::shared_ptr<const std::vector<std::string>> pieces, const Tokenizer& tok,
                                       std::shared_ptr<const ToolCallGrammar> grammar)
    : pieces_(std::move(pieces)), tok_(tok), grammar_(std::move(grammar)), rec_(*grammar_) {}

int32_t tool_marker_token(const ToolSyntax& s, const Tokenizer& tok) {
  if (s.marker.empty()) return -1;
  const int32_t id = tok.find_token(s.marker);
  if (id < 0 || tok.is_eog(id) || !tok.token_to_piece(id).empty()) return -1;
  return id;
}

bool ToolCallConstraint::allows(int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= pieces_->size()) return false;
  // The marker opens calls while they have not begun (the recognizer is
  // waiting only in auto mode).
  if (token == grammar_->syntax.marker_token) return !rec_.active();
  if (tok_.is_eog(token)) return rec_.may_end();
  const std::string& piece = (*pieces_)[static_cast<size_t>(token)];
  if (piece.empty()) return !rec_.active();
  ToolCallRecognizer r = rec_;
  return r.feed(piece);
}

void ToolCallConstraint::accept(int32_t token) {
  if (token == grammar_->syntax.marker_token && token >= 0) {
    rec_.open();
    return;
  }
  if (token >= 0 && static_cast<size_t>(token) < pieces_->size() && !tok_.is_eog(token))
    rec_.feed((*pieces_)[static_cast<size_t>(token)]);
}

}  // namespace tandem
