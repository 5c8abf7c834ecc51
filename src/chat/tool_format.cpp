#include "chat/tool_format.h"

#include <nlohmann/json.hpp>

namespace tandem {

ToolSyntax tool_syntax(ChatFamily f) {
  ToolSyntax s;
  s.args_key = "arguments";
  switch (f) {
    case ChatFamily::kChatML:
      s.open = "<tool_call>\n";
      s.close = "}\n</tool_call>";
      s.separator = "\n";
      s.text_marker = true;
      break;
    case ChatFamily::kGemma:
      s.open = "```tool_call\n";
      s.close = "}\n```";
      s.separator = "\n";
      s.text_marker = true;
      break;
    case ChatFamily::kLlama3:
      s.marker = "<|python_tag|>";
      s.close = "}";
      s.separator = "\n";
      s.args_key = "parameters";
      s.bare_start = true;
      break;
    case ChatFamily::kMistral:
      s.marker = "[TOOL_CALLS]";
      s.prefix = "[";
      s.close = "}";
      s.separator = ", ";
      s.suffix = "]";
      break;
    case ChatFamily::kLlama2:
    // Harmony's own calls ("to=functions.x ... <|call|>") are not rendered: gpt-oss gets the plain JSON form.
    case ChatFamily::kGptOss:
      s.close = "}";
      s.separator = "\n";
      break;
  }
  return s;
}

namespace {

using nlohmann::json;

json function_json(const ToolFunction& t) {
  json fn = {{"name", t.name}};
  if (!t.description.empty()) fn["description"] = t.description;
  fn["parameters"] = t.parameters.empty() ? json::object() : json::parse(t.parameters);
  return {{"type", "function"}, {"function", fn}};
}

std::string call_body(const ToolSyntax& s, const ToolCall& c) {
  const json args = c.arguments.empty() ? json::object() : json::parse(c.arguments);
  return s.name_lead() + c.name + s.args_lead() + args.dump();
}

// The calls as the model writes them, with the control-token marker spelled out.
std::string calls_text(const ToolSyntax& s, const std::vector<ToolCall>& calls) {
  std::string out = s.marker + s.prefix;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out += s.separator;
    out += s.open + call_body(s, calls[i]) + s.close;
  }
  return out + s.suffix;
}

std::string result_text(ChatFamily f, const ToolChatMessage& m) {
  switch (f) {
    case ChatFamily::kChatML: return "<tool_response>\n" + m.content + "\n</tool_response>";
    case ChatFamily::kMistral:
      return "[TOOL_RESULTS]" + json{{"call_id", m.tool_call_id}, {"content", m.content}}.dump() + "[/TOOL_RESULTS]";
    case ChatFamily::kLlama3: return m.content;
    case ChatFamily::kGemma:
    case ChatFamily::kLlama2:
    case ChatFamily::kGptOss: return "```tool_output\n" + m.content + "\n```";
  }
  return m.content;
}

}  // namespace

std::string describe_tools(ChatFamily f, const std::vector<ToolFunction>& tools) {
  std::string list;
  for (const ToolFunction& t : tools) list += function_json(t).dump() + "\n";
  switch (f) {
    case ChatFamily::kChatML:
      // Qwen 2.5's own wording, which its models were trained on.
      return "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
             list +
             "</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call>";
    case ChatFamily::kLlama3:
      return "You have access to the following functions. To call a function, respond with a JSON object of the "
             "form {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use "
             "variables.\n\n" +
             list;
    case ChatFamily::kMistral: {
      json arr = json::array();
      for (const ToolFunction& t : tools) arr.push_back(function_json(t));
      return "[AVAILABLE_TOOLS]" + arr.dump() + "[/AVAILABLE_TOOLS]";
    }
    case ChatFamily::kGemma:
    case ChatFamily::kLlama2:
    case ChatFamily::kGptOss: {
      const std::string fence = f == ChatFamily::kGemma ? "```tool_call\n" : "";
      const std::string end = f == ChatFamily::kGemma ? "\n```" : "";
      return "You have access to the following functions:\n" + list +
             "\nTo call a function, answer with " + (fence.empty() ? "" : "a fenced block:\n") + fence +
             "{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}" + end +
             "\nThe function's result comes back in a ```tool_output block.";
    }
  }
  return list;
}

std::vector<ChatMessage> tool_conversation(ChatFamily f, const std::vector<ToolChatMessage>& msgs,
                                           const std::string& tools_text) {
  const ToolSyntax syn = tool_syntax(f);
  std::vector<ChatMessage> out;
  size_t i = 0;
  if (!tools_text.empty()) {
    if (!msgs.empty() && msgs[0].role == "system") {
      out.push_back({"system", msgs[0].content + "\n\n" + tools_text});
      i = 1;
    } else {
      out.push_back({"system", tools_text});
    }
  }
  for (; i < msgs.size(); ++i) {
    const ToolChatMessage& m = msgs[i];
    if (m.role == "tool") {
      if (f == ChatFamily::kLlama3) {
        out.push_back({"ipython", m.content});
        continue;
      }
      // Consecutive results share one user turn, as Qwen's template writes them.
      std::string text = result_text(f, m);
      while (i + 1 < msgs.size() && msgs[i + 1].role == "tool") text += "\n" + result_text(f, msgs[++i]);
      out.push_back({"user", text});
      continue;
    }
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      std::string text = m.content;
      if (!text.empty()) text += "\n";
      out.push_back({"assistant", text + calls_text(syn, m.tool_calls)});
      continue;
    }
    out.push_back({m.role, m.content});
  }
  return out;
}

ToolCallParser::ToolCallParser(ToolSyntax syntax, bool forced) : syn_(std::move(syntax)) {
  trigger_ = syn_.prefix + syn_.open + syn_.name_lead();
  next_ = syn_.separator + syn_.open + syn_.name_lead();
  if (forced) {
    phase_ = Phase::kSkip;
    skip_ = trigger_.size();
    after_skip_ = Phase::kName;
  } else {
    phase_ = Phase::kContent;
    at_start_ = syn_.bare_start;
  }
}

void ToolCallParser::feed(std::string_view text, std::vector<Event>& out) {
  for (char c : text) {
    if (fed_ == open_at_) open(out);
    step(c, out);
    ++fed_;
  }
}

void ToolCallParser::open_at(size_t offset, std::vector<Event>& out) {
  open_at_ = offset;
  if (fed_ == open_at_) open(out);
}

void ToolCallParser::open(std::vector<Event>& out) {
  open_at_ = SIZE_MAX;
  if (phase_ != Phase::kContent) return;
  // What was held back as a possible text marker is content after all; the
  // text from here is the calls, laid out as forced ones after whitespace.
  if (!hold_.empty()) out.push_back({Event::kContent, 0, std::move(hold_)});
  hold_.clear();
  at_start_ = false;
  phase_ = Phase::kLeadSpace;
}

void ToolCallParser::finish(std::vector<Event>& out) {
  if (fed_ == open_at_) open(out);
  if (phase_ == Phase::kContent && !hold_.empty()) {
    out.push_back({Event::kContent, 0, std::move(hold_)});
    hold_.clear();
  }
}

namespace {
void append(std::vector<ToolCallParser::Event>& out, ToolCallParser::Event::Kind kind, int32_t index, char c) {
  if (out.empty() || out.back().kind != kind || out.back().index != index) out.push_back({kind, index, {}});
  out.back().text += c;
}
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
}  // namespace

void ToolCallParser::step(char c, std::vector<Event>& out) {
  switch (phase_) {
    case Phase::kContent: {
      // Content is held back while it could still be the start of the marker.
      hold_ += c;
      if (at_start_) {
        // Whitespace, then perhaps a bare call's lead (the grammar completes
        // bare_lead() to name_lead()).
        const size_t ws = hold_.find_first_not_of(" \t\n\r");
        if (ws == std::string::npos) return;
        const std::string lead = syn_.name_lead();
        const size_t n = hold_.size() - ws;
        if (n <= lead.size() && lead.compare(0, n, hold_, ws, n) == 0) {
          if (n == lead.size()) {
            hold_.clear();
            at_start_ = false;
            phase_ = Phase::kName;
          }
          return;
        }
        at_start_ = false;
      }
      if (!syn_.text_marker) {
        for (char h : hold_) append(out, Event::kContent, 0, h);
        hold_.clear();
        return;
      }
      size_t cut = 0;
      while (cut < hold_.size() && trigger_.compare(0, hold_.size() - cut, hold_, cut, std::string::npos) != 0) ++cut;
      for (size_t k = 0; k < cut; ++k) append(out, Event::kContent, 0, hold_[k]);
      hold_.erase(0, cut);
      if (hold_ == trigger_) {
        hold_.clear();
        phase_ = Phase::kName;
      }
      return;
    }
    case Phase::kLeadSpace:
      if (is_space(c)) return;
      // This byte is the first of the calls' lead.
      phase_ = Phase::kSkip;
      skip_ = trigger_.size();
      after_skip_ = Phase::kName;
      [[fallthrough]];
    case Phase::kSkip:
      if (--skip_ == 0) phase_ = after_skip_;
      return;
    case Phase::kName:
      if (c != '"') {
        hold_ += c;
        return;
      }
      out.push_back({Event::kCallStart, calls_, std::move(hold_)});
      hold_.clear();
      phase_ = Phase::kSkip;
      skip_ = syn_.args_lead().size() - 1;  // the quote is this character
      after_skip_ = Phase::kBeforeArgs;
      return;
    case Phase::kBeforeArgs:
      if (is_space(c)) return;
      phase_ = Phase::kArgs;
      depth_ = 0;
      [[fallthrough]];
    case Phase::kArgs:
      append(out, Event::kArguments, calls_, c);
      if (in_string_) {
        if (escape_) escape_ = false;
        else if (c == '\\') escape_ = true;
        else if (c == '"') in_string_ = false;
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if ((c == '}' || c == ']') && --depth_ == 0) {
        phase_ = Phase::kAfterArgs;
        ++calls_;
      }
      return;
    case Phase::kAfterArgs:
      if (is_space(c)) return;
      // The body's closing brace opened `close`.
      phase_ = Phase::kSkip;
      skip_ = syn_.close.size() - 1;
      after_skip_ = Phase::kAfterCall;
      if (skip_ == 0) phase_ = Phase::kAfterCall;
      hold_.clear();
      return;
    case Phase::kAfterCall:
      hold_ += c;
      if (hold_ == next_) {
        hold_.clear();
        phase_ = Phase::kName;
      } else if (!syn_.suffix.empty() && hold_ == syn_.suffix) {
        phase_ = Phase::kDone;
      } else if (next_.compare(0, hold_.size(), hold_) != 0 && syn_.suffix.compare(0, hold_.size(), hold_) != 0) {
        phase_ = Phase::kDone;
      }
      return;
    case Phase::kDone:
      return;
  }
}

}  // namespace tandem
