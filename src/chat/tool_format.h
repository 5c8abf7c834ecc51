// Tool calling in each chat family's own syntax: how the tools are described
// to the model, how a call looks in its output (ToolSyntax), how calls and
// tool results in the history are written back, and how generated text is
// read back into calls (ToolCallParser, incrementally for streaming).
//
// A call's body is always `{"name": "NAME", "<args_key>": {...}}`; the
// families differ in what surrounds it:
//   chatml  <tool_call>\n BODY \n</tool_call>      (Qwen 2.5 / Hermes)
//   llama3  BODY                                 (Llama 3.1's JSON calls; key "parameters")
//   mistral [TOOL_CALLS][BODY, BODY]             ([TOOL_CALLS] is a control token)
//   gemma   ```tool_call\n BODY \n```            (Gemma 3 has no native format: ours)
//   llama2  BODY                                 (no native format)
// With tool_choice "auto" the model chooses; a call opens with the family's
// marker: text for chatml and gemma; a control token for mistral
// ([TOOL_CALLS]) and llama3 (<|python_tag|>), recognized by its id since it
// spells no text; and for llama3 also the body itself as the answer's first
// text (Llama 3.x writes bare JSON calls). llama2 has none: no "auto".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"

namespace tandem {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object
};

struct ToolFunction {
  std::string name;
  std::string description;
  std::string parameters;  // JSON text of the parameters' schema
};

// How calls are written in a family's output. Generated calls:
// prefix, then per call open + BODY + close, separator between calls, then suffix.
struct ToolSyntax {
  std::string marker;     // a control token before the calls in the history (its text never reaches the output)
  std::string prefix;     // once, before the first call
  std::string open;       // before each call
  std::string close;      // after each call
  std::string separator;  // between two calls
  std::string suffix;     // once, after the last call
  std::string args_key;   // "arguments" or "parameters"
  bool text_marker = false;  // prefix + open is text the model writes on its own: it opens calls
  // The vocab's id of `marker` when it is a control token (set where the
  // vocab is known, tool_marker_token): generated, it opens calls.
  int32_t marker_token = -1;
  // A call may also open the answer (after whitespace) with no marker: its
  // body's first bytes, bare_lead(), decide it.
  bool bare_start = false;
  // The text between `open` and the name, and between the name and the arguments.
  std::string name_lead() const { return "{\"name\": \""; }
  std::string args_lead() const { return "\", \"" + args_key + "\": "; }
  // At the answer's start, the text that opens a bare call; the rest of
  // name_lead() is then held to by the grammar.
  std::string bare_lead() const { return "{\"name\""; }
  // Whether the model can open calls itself, so "auto" can leave it the choice.
  bool model_opens() const { return text_marker || marker_token >= 0 || bare_start; }
};

ToolSyntax tool_syntax(ChatFamily f);

// The system text that describes the tools and the call syntax.
std::string describe_tools(ChatFamily f, const std::vector<ToolFunction>& tools);

// A message of an OpenAI conversation: role "system", "user", "assistant"
// (with tool_calls, perhaps no content) or "tool" (a result, for tool_call_id).
struct ToolChatMessage {
  std::string role;
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;
};

// The conversation as the chat template renders it: the tools' description
// joined to the system text (or made the system message), assistant calls
// written in the family's syntax, and tool results as the family takes them
// (consecutive results share one turn).
std::vector<ChatMessage> tool_conversation(ChatFamily f, const std::vector<ToolChatMessage>& msgs,
                                           const std::string& tools_text);

// Reads generated text back into content and calls. The text is fed as it
// is generated; in "auto" mode (forced = false) it is content until the
// family's marker, in forced mode calls from the first byte. A control-token
// marker spells nothing, so whoever saw its id says where the calls begin
// (open_at). The layout is the one ToolCallConstraint enforces, so it is
// read without backtracking.
class ToolCallParser {
 public:
  struct Event {
    enum Kind : uint8_t { kContent, kCallStart, kArguments } kind;
    int32_t index = 0;  // the call, for kCallStart / kArguments
    std::string text;   // content, the name (kCallStart), or an arguments fragment
  };
  ToolCallParser(ToolSyntax syntax, bool forced);
  // Appends the events this text completes to `out`.
  void feed(std::string_view text, std::vector<Event>& out);
  // The family's control-token marker was generated where the text had
  // `offset` bytes: calls begin there (it may lie ahead of the text fed).
  void open_at(size_t offset, std::vector<Event>& out);
  // The end of the output: content held back as a possible marker is released.
  void finish(std::vector<Event>& out);
  int32_t calls() const { return calls_; }

 private:
  enum class Phase : uint8_t { kContent, kLeadSpace, kSkip, kName, kBeforeArgs, kArgs, kAfterArgs, kAfterCall, kDone };
  void step(char c, std::vector<Event>& out);
  void open(std::vector<Event>& out);
  ToolSyntax syn_;
  std::string trigger_;  // prefix + open + name lead
  std::string next_;     // separator + open + name lead
  Phase phase_;
  Phase after_skip_ = Phase::kName;
  size_t skip_ = 0;
  std::string hold_;  // content that may be the start of the trigger; the name so far; after-call text
  int32_t calls_ = 0;
  int32_t depth_ = 0;
  bool in_string_ = false, escape_ = false;
  bool at_start_ = false;  // bare_start: only whitespace so far
  size_t fed_ = 0;         // bytes fed
  size_t open_at_ = SIZE_MAX;
};

}  // namespace tandem
