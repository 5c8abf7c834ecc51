// OpenAI API requests: parsing and validation of the JSON bodies of
// /v1/completions and /v1/chat/completions into engine parameters, and the
// OpenAI-style error object. No networking here, so all of it is unit-tested.
//
// Defaults follow OpenAI's documentation, not llama.cpp's CLI: temperature 1,
// top_p 1, no top-k or min-p unless asked, max_tokens 16 for completions and
// "until the context is full" for chat.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/tool_format.h"
#include "runtime/json_parse.h"
#include "engine/request.h"

namespace tandem::server {

// An error the HTTP layer answers with `status` and the body error_json().
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string type, std::string param = {},
           std::string code = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }  // "" when none
  const std::string& code() const { return code_; }    // "" when none

 private:
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the offending field.
[[noreturn]] void throw_invalid(const std::string& param, const std::string& message);

// {"error": {"message", "type", "param", "code"}}; param and code are null when empty.
nlohmann::json error_json(const ApiError& e);

// Serializes for the wire; invalid UTF-8 (a token piece can be half a
// character) becomes U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);

// A client's text or value as an error message quotes it: at most `max`
// bytes, cut at a character boundary, "..." marking the cut.
std::string clip(std::string_view s, size_t max = 120);
std::string clip_json(const nlohmann::json& v, size_t max = 120);

enum class Endpoint { kCompletions, kChat };

struct ParseLimits {
  JsonLimits json;             // nesting and size of the body
  int32_t max_n = 16;          // choices per prompt
  int32_t max_prompts = 64;    // prompts in one completions request
  int32_t max_choices = 64;    // prompts x n
  int32_t max_logprobs = 20;   // top alternatives per token
  int32_t max_stop = 4;        // stop strings (OpenAI's bound)
  int32_t max_stop_bytes = 256;   // one stop string: every step matches each against each choice's text
  int32_t max_logit_bias = 1024;  // logit_bias entries
  int32_t max_messages = 2048;    // chat messages (OpenAI's bound), checked before any templating
  // Logprob entries one request may produce: choices x tokens x (1 + top
  // alternatives). A 100-byte request could otherwise ask for a response of
  // tens of megabytes.
  int64_t max_logprob_entries = int64_t{1} << 20;
  int64_t max_cache_salt = 256;   // bytes of cache_salt
  int32_t max_tools = 64;         // tools in one request (the call grammar's bound)
};

// A completions prompt: text, or token ids when is_tokens.
struct Prompt {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

// vLLM's kv_transfer_params, as vllm-router's prefill/decode mode sends
// them: to the prefill instance {do_remote_decode: true, ...}, to the decode
// instance what the prefill instance answered (docs/scale-out.md, "Roles").
struct KvTransferParams {
  bool present = false;
  bool do_remote_decode = false;   // a prefill for another instance: keep the blocks for it
  bool do_remote_prefill = false;  // the prompt's blocks are at remote_host:remote_port
  std::string remote_engine_id;
  std::string remote_host;
  int32_t remote_port = 0;
  std::vector<uint64_t> remote_block_ids;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                    // "" when not given
  // completions: one prompt, or several (a list of strings or of token-id
  // lists); each is answered by n choices, prompt k's as choices k*n .. k*n+n-1
  std::vector<Prompt> prompts;
  // chat: roles system, user, assistant (perhaps with tool_calls) and tool
  std::vector<ToolChatMessage> messages;
  // chat: tool calling. tool_choice defaults to auto with tools, else none.
  enum class ToolChoice : uint8_t { kNone, kAuto, kRequired, kNamed };
  std::vector<ToolFunction> tools;
  std::vector<std::shared_ptr<const CompiledSchema>> tool_schemas;  // tools[i]'s parameters
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;

  RequestParams params;                 // params.logprobs: -1 none, else top-k count
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool echo = false;                    // completions: each choice's text starts with its prompt
  bool timings = false;                 // "timings": true: the phases, as llama.cpp's server reports them
  KvTransferParams kv_transfer;
};

// Throws ApiError(400) for malformed JSON, a body that is not an object,
// missing required fields, wrong types, values out of range, and features that
// are recognised but not implemented (suffix, functions; echo for chat). Unknown fields are ignored.
// The body's memory is released once its tree is built, and the prompt and
// message texts move out of the tree: a large request is held about twice at
// most, never three times.
ApiRequest parse_request(Endpoint ep, std::string body, const ParseLimits& lim = {});

// POST /tokenize, in vLLM's form ({"prompt", "add_special_tokens": default
// true}) or llama.cpp's ({"content", "add_special": default false}).
struct TokenizeRequest {
  std::string model;
  std::string text;
  bool add_special = true;  // BOS (and whatever else the vocabulary adds)
};
// The body is released once parsed and the text moved out of the tree, as in parse_request.
TokenizeRequest parse_tokenize(std::string body, const JsonLimits& lim = {});

// POST /detokenize: {"tokens": [ids]} (vLLM and llama.cpp alike).
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize(std::string_view body, const JsonLimits& lim = {});
ApiRequest parse_request_json(Endpoint ep, nlohmann::json body, const ParseLimits& lim = {});

// Throws ApiError(400) naming the product when the logprob entries the
// request asks for (ParseLimits::max_logprob_entries) exceed the bound.
// prompt_lengths: the tokens of each prompt; context: the tokens a choice
// may reach when max_tokens is not given.
void check_logprob_budget(const ApiRequest& r, const std::vector<size_t>& prompt_lengths, int64_t context,
                          const ParseLimits& lim);

}  // namespace tandem::server
