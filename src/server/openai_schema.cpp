#include "server/openai_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace tandem::server {

using nlohmann::json;

void throw_invalid(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

json error_json(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type()}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param().empty()) err["param"] = e.param();
  if (!e.code().empty()) err["code"] = e.code();
  return json{{"error", err}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string clip(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

std::string clip_json(const json& v, size_t max) {
  if (v.is_string()) return clip(dump_json(json(clip(v.get_ref<const std::string&>(), max))), max + 8);
  if ((v.is_array() || v.is_object()) && v.size() > max) return v.is_array() ? "[...]" : "{...}";
  return clip(dump_json(v), max);
}

namespace {

const char* type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

[[noreturn]] void wrong_type(const std::string& key, const char* want, const json& v) {
  throw_invalid(key, fmt::format("'{}' must be {}, got {}", key, want, type_name(v)));
}

// The field's value, or nullptr when absent or null (OpenAI treats an explicit
// null as "use the default").
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// At most this many block ids: a 128k context in blocks of 16 tokens is 8,192.
constexpr size_t kMaxTransferBlocks = 65536;

KvTransferParams parse_kv_transfer(const json& j) {
  KvTransferParams t;
  if (j.is_null()) return t;
  if (!j.is_object()) wrong_type("kv_transfer_params", "an object", j);
  t.present = true;
  auto flag = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return false;
    if (!it->is_boolean()) wrong_type(std::string("kv_transfer_params.") + key, "a boolean", *it);
    return it->get<bool>();
  };
  t.do_remote_decode = flag("do_remote_decode");
  t.do_remote_prefill = flag("do_remote_prefill");
  if (t.do_remote_decode && t.do_remote_prefill)
    throw_invalid("kv_transfer_params", "'do_remote_decode' and 'do_remote_prefill' cannot both be true");
  if (!t.do_remote_prefill) return t;
  auto text = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty() ||
        it->get_ref<const std::string&>().size() > 255)
      throw_invalid(std::string("kv_transfer_params.") + key, fmt::format("'{}' must be a name of 1 to 255 bytes", key));
    return it->get<std::string>();
  };
  t.remote_host = text("remote_host");
  if (const auto it = j.find("remote_engine_id"); it != j.end() && it->is_string())
    t.remote_engine_id = clip(it->get_ref<const std::string&>(), 255);
  const auto port = j.find("remote_port");
  if (port == j.end() || !port->is_number_integer() || port->get<int64_t>() < 1 || port->get<int64_t>() > 65535)
    throw_invalid("kv_transfer_params.remote_port", "'remote_port' must be a port number (1 to 65535)");
  t.remote_port = static_cast<int32_t>(port->get<int64_t>());
  const auto ids = j.find("remote_block_ids");
  if (ids == j.end() || !ids->is_array() || ids->size() > kMaxTransferBlocks)
    throw_invalid("kv_transfer_params.remote_block_ids",
                  fmt::format("'remote_block_ids' must be a list of at most {} block ids", kMaxTransferBlocks));
  for (const json& id : *ids) {
    if (!id.is_number_unsigned())
      throw_invalid("kv_transfer_params.remote_block_ids", "'remote_block_ids' must hold non-negative integers");
    t.remote_block_ids.push_back(id.get<uint64_t>());
  }
  return t;
}

std::optional<bool> get_bool(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(key, "a string", *v);
  return v->get<std::string>();
}

// Integers in [lo, hi]. JSON integers beyond int64 arrive as unsigned or as
// doubles; both are out of any range we accept, so they fail the range check.
std::optional<int64_t> get_int(const json& obj, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) wrong_type(key, "an integer", *v);
  bool in_range;
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) && static_cast<int64_t>(u) <= hi;
    if (in_range) x = static_cast<int64_t>(u);
  } else {
    x = v->get<int64_t>();
    in_range = x >= lo && x <= hi;
  }
  if (!in_range || x < lo)
    throw_invalid(key, fmt::format("'{}' must be an integer between {} and {}, got {}", key, lo, hi, clip_json(*v)));
  return x;
}

struct Range {
  double lo, hi;
  bool lo_open = false;
};

std::optional<double> get_number(const json& obj, const char* key, Range r) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double x = v->get<double>();
  const bool ok = std::isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) && x <= r.hi;
  if (!ok)
    throw_invalid(key, fmt::format("'{}' must be a number in {}{}, {}], got {}", key, r.lo_open ? "(" : "[",
                                   r.lo, r.hi, clip_json(*v)));
  return x;
}

void reject_if_present(const json& obj, const char* key, const char* why) {
  const json* v = field(obj, key);
  if (!v) return;
  const bool empty = (v->is_string() && v->get<std::string>().empty()) || (v->is_boolean() && !v->get<bool>()) ||
                     ((v->is_object() || v->is_array()) && v->empty());
  if (!empty) throw_invalid(key, fmt::format("'{}' is not supported: {}", key, why));
}

// {"token id": bias, ...}, bias in [-100, 100] as OpenAI takes it. Whether
// an id is inside the vocabulary is the engine's check.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v, const ParseLimits& lim) {
  if (!v.is_object()) wrong_type("logit_bias", "an object of token ids to numbers", v);
  if (v.size() > static_cast<size_t>(lim.max_logit_bias))
    throw_invalid("logit_bias", fmt::format("'logit_bias' has {} entries; at most {} are allowed", v.size(),
                                            lim.max_logit_bias));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, val] : v.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 || id > INT32_MAX)
      throw_invalid("logit_bias", fmt::format("'logit_bias' keys must be token ids, got '{}'", clip(key)));
    if (!val.is_number() || !(val.get<double>() >= -100.0 && val.get<double>() <= 100.0))
      throw_invalid("logit_bias", fmt::format("'logit_bias' values must be numbers in [-100, 100], got {} for token {}",
                                              clip_json(val), key));
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(val.get<double>()));
  }
  return out;
}

std::vector<std::string> parse_stop(const json& obj, const ParseLimits& lim) {
  const json* v = field(obj, "stop");
  if (!v) return {};
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().size() > static_cast<size_t>(lim.max_stop_bytes))
      throw_invalid("stop", fmt::format("'stop' has {} bytes; at most {} are allowed",
                                        v->get_ref<const std::string&>().size(), lim.max_stop_bytes));
    return {v->get<std::string>()};
  }
  if (!v->is_array()) wrong_type("stop", "a string or an array of strings", *v);
  if (v->size() > static_cast<size_t>(lim.max_stop))
    throw_invalid("stop", fmt::format("'stop' has {} strings; at most {} are allowed", v->size(), lim.max_stop));
  std::vector<std::string> out;
  for (const json& s : *v) {
    if (!s.is_string()) throw_invalid("stop", fmt::format("'stop' must hold strings, got {}", type_name(s)));
    out.push_back(s.get<std::string>());
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].size() > static_cast<size_t>(lim.max_stop_bytes))
      throw_invalid("stop", fmt::format("'stop' string {} has {} bytes; at most {} are allowed", i, out[i].size(),
                                        lim.max_stop_bytes));
  return out;
}

int32_t checked_token(const json& t, const char* param = "prompt") {
  if (!t.is_number_integer())
    throw_invalid(param, fmt::format("token ids in '{}' must be integers, got {}", param, type_name(t)));
  if (t.is_number_unsigned() ? t.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                             : (t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max()))
    throw_invalid(param, fmt::format("token id {} in '{}' is out of range", clip_json(t), param));
  return static_cast<int32_t>(t.get<int64_t>());
}

// A string's text, moved out of the tree.
std::string take(json& v) { return std::move(v.get_ref<std::string&>()); }

// A string or an array of token ids (one prompt), or an array of strings or
// of token-id arrays (one prompt each).
void parse_prompt(json& obj, ApiRequest& r, const ParseLimits& lim) {
  json* v = const_cast<json*>(field(obj, "prompt"));
  if (!v) throw_invalid("prompt", "missing required field 'prompt'");
  const auto tokens = [](const json& a) {
    Prompt p;
    p.is_tokens = true;
    p.tokens.reserve(a.size());
    for (const json& t : a) p.tokens.push_back(checked_token(t));
    return p;
  };
  if (v->is_string()) {
    r.prompts.push_back({take(*v), {}, false});
    return;
  }
  if (!v->is_array()) wrong_type("prompt", "a string, an array of strings or an array of token ids", *v);
  if (v->empty()) throw_invalid("prompt", "'prompt' is empty");
  if (!(*v)[0].is_string() && !(*v)[0].is_array()) {
    r.prompts.push_back(tokens(*v));
    return;
  }
  if (v->size() > static_cast<size_t>(lim.max_prompts))
    throw_invalid("prompt", fmt::format("'prompt' holds {} prompts; at most {} are allowed", v->size(),
                                        lim.max_prompts));
  const bool strings = (*v)[0].is_string();
  for (size_t i = 0; i < v->size(); ++i) {
    json& e = (*v)[i];
    if (strings ? !e.is_string() : !e.is_array())
      throw_invalid("prompt", fmt::format("'prompt[{}]' is {}: a list of prompts holds only strings or only "
                                          "arrays of token ids",
                                          i, type_name(e)));
    if (strings) r.prompts.push_back({take(e), {}, false});
    else if (e.empty()) throw_invalid("prompt", fmt::format("'prompt[{}]' is empty", i));
    else r.prompts.push_back(tokens(e));
  }
}

std::string message_content(json& c, size_t i) {
  const std::string key = fmt::format("messages[{}].content", i);
  if (c.is_null()) return {};
  if (c.is_string()) return take(c);
  if (!c.is_array()) wrong_type(key, "a string or an array of content parts", c);
  std::string text;
  for (const json& part : c) {
    if (!part.is_object()) throw_invalid(key, fmt::format("'{}' parts must be objects", key));
    const auto type = get_string(part, "type");
    if (type != "text")
      throw_invalid(key, fmt::format("'{}' part of type '{}' is not supported (text only)", key,
                                     clip(type.value_or(""))));
    const auto t = get_string(part, "text");
    if (!t) throw_invalid(key, fmt::format("'{}' text part has no 'text'", key));
    text += *t;
  }
  return text;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}].
std::vector<ToolCall> parse_message_calls(const json& v, size_t i) {
  const std::string key = fmt::format("messages[{}].tool_calls", i);
  if (!v.is_array()) wrong_type(key, "an array", v);
  std::vector<ToolCall> out;
  for (size_t k = 0; k < v.size(); ++k) {
    const std::string at = fmt::format("{}[{}]", key, k);
    const json& c = v[k];
    if (!c.is_object()) wrong_type(at, "an object", c);
    const json* id = field(c, "id");
    if (!id || !id->is_string() || id->get_ref<const std::string&>().empty())
      throw_invalid(at + ".id", fmt::format("'{}.id' must be a non-empty string", at));
    if (const json* t = field(c, "type"); t && *t != "function")
      throw_invalid(at + ".type", fmt::format("'{}.type' must be 'function', got {}", at, clip_json(*t)));
    const json* fn = field(c, "function");
    if (!fn || !fn->is_object()) throw_invalid(at + ".function", fmt::format("'{}.function' must be an object", at));
    const json* name = field(*fn, "name");
    if (!name || !name->is_string())
      throw_invalid(at + ".function.name", fmt::format("'{}.function.name' must be a string", at));
    std::string args = "{}";
    if (const json* a = field(*fn, "arguments")) {
      if (!a->is_string()) wrong_type(at + ".function.arguments", "a string of JSON", *a);
      json parsed = json::parse(a->get_ref<const std::string&>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        throw_invalid(at + ".function.arguments",
                      fmt::format("'{}.function.arguments' must be a JSON object as text, got {}", at, clip_json(*a)));
      args = a->get<std::string>();
    }
    out.push_back({id->get<std::string>(), name->get<std::string>(), std::move(args)});
  }
  return out;
}

void parse_messages(json& obj, ApiRequest& r, const ParseLimits& lim) {
  json* v = const_cast<json*>(field(obj, "messages"));
  if (!v) throw_invalid("messages", "missing required field 'messages'");
  if (!v->is_array()) wrong_type("messages", "an array", *v);
  if (v->empty()) throw_invalid("messages", "'messages' is empty");
  // Templating costs time per message whatever their text: bound the count first.
  if (v->size() > static_cast<size_t>(lim.max_messages))
    throw_invalid("messages", fmt::format("'messages' holds {} messages; at most {} are allowed", v->size(),
                                          lim.max_messages));
  std::vector<std::string> call_ids;  // of the assistant's calls so far
  for (size_t i = 0; i < v->size(); ++i) {
    json& m = (*v)[i];
    if (!m.is_object()) throw_invalid("messages", fmt::format("messages[{}] must be an object, got {}", i, type_name(m)));
    const json* role = field(m, "role");
    if (!role || !role->is_string())
      throw_invalid("messages", fmt::format("messages[{}] needs a string 'role'", i));
    std::string rl = role->get<std::string>();
    if (rl == "developer") rl = "system";  // OpenAI's newer name for the system role
    if (rl != "system" && rl != "user" && rl != "assistant" && rl != "tool")
      throw_invalid("messages", fmt::format("messages[{}].role '{}' is not supported (system, developer, user, "
                                            "assistant, tool)", i, clip(role->get<std::string>())));
    ToolChatMessage msg;
    msg.role = rl;
    if (rl == "assistant") {
      if (const json* tc = field(m, "tool_calls")) {
        msg.tool_calls = parse_message_calls(*tc, i);
        for (const ToolCall& c : msg.tool_calls) call_ids.push_back(c.id);
      }
    }
    if (rl == "tool") {
      const std::string key = fmt::format("messages[{}].tool_call_id", i);
      const json* id = field(m, "tool_call_id");
      if (!id || !id->is_string()) throw_invalid(key, fmt::format("'{}' must be a string naming a call", key));
      msg.tool_call_id = id->get<std::string>();
      if (std::find(call_ids.begin(), call_ids.end(), msg.tool_call_id) == call_ids.end())
        throw_invalid(key, fmt::format("'{}' is {}, which no earlier assistant tool call has as its id", key,
                                       clip_json(*id)));
    }
    auto it = m.find("content");
    if ((it == m.end() || it->is_null()) && rl != "assistant")
      throw_invalid("messages", fmt::format("messages[{}] needs 'content'", i));
    msg.content = it == m.end() ? std::string() : message_content(*it, i);
    r.messages.push_back(std::move(msg));
  }
}

bool valid_function_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// "tools": [{"type": "function", "function": {"name", "description", "parameters"}}].
void parse_tools(const json& v, ApiRequest& r, const ParseLimits& lim) {
  if (!v.is_array()) wrong_type("tools", "an array", v);
  if (v.size() > static_cast<size_t>(lim.max_tools))
    throw_invalid("tools", fmt::format("'tools' holds {} tools; at most {} are allowed", v.size(), lim.max_tools));
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    const json& t = v[i];
    if (!t.is_object()) wrong_type(at, "an object", t);
    const json* type = field(t, "type");
    if (!type || *type != "function")
      throw_invalid(at + ".type", fmt::format("'{}.type' must be 'function', got {}", at,
                                              type ? clip_json(*type) : std::string("nothing")));
    const json* fn = field(t, "function");
    if (!fn || !fn->is_object()) throw_invalid(at + ".function", fmt::format("'{}.function' must be an object", at));
    const json* name = field(*fn, "name");
    if (!name || !name->is_string() || !valid_function_name(name->get<std::string>()))
      throw_invalid(at + ".function.name",
                    fmt::format("'{}.function.name' must be 1 to 64 letters, digits, '_' or '-', got {}", at,
                                name ? clip_json(*name) : std::string("nothing")));
    ToolFunction f;
    f.name = name->get<std::string>();
    for (const ToolFunction& seen : r.tools)
      if (seen.name == f.name)
        throw_invalid(at + ".function.name", fmt::format("'{}.function.name' '{}' is given twice", at, f.name));
    if (const json* d = field(*fn, "description")) {
      if (!d->is_string()) wrong_type(at + ".function.description", "a string", *d);
      f.description = d->get<std::string>();
    }
    json params = {{"type", "object"}, {"properties", json::object()}};
    const std::string pkey = at + ".function.parameters";
    if (const json* p = field(*fn, "parameters")) {
      if (!p->is_object()) wrong_type(pkey, "a JSON schema object", *p);
      params = *p;
      if (!params.contains("type")) params["type"] = "object";
      if (params["type"] != "object")
        throw_invalid(pkey, fmt::format("'{}' must describe an object (\"type\": \"object\"), got type {}", pkey,
                                        clip_json(params["type"])));
    }
    try {
      r.tool_schemas.push_back(std::make_shared<const CompiledSchema>(compile_schema(params)));
    } catch (const Error& e) {
      throw_invalid(pkey, fmt::format("'{}': {}", pkey, e.what()));
    }
    f.parameters = params.dump();
    r.tools.push_back(std::move(f));
  }
}

void parse_tool_choice(const json& obj, ApiRequest& r) {
  using TC = ApiRequest::ToolChoice;
  r.tool_choice = r.tools.empty() ? TC::kNone : TC::kAuto;
  const json* v = field(obj, "tool_choice");
  if (!v) return;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s == "none") r.tool_choice = TC::kNone;
    else if (s == "auto") r.tool_choice = TC::kAuto;
    else if (s == "required") r.tool_choice = TC::kRequired;
    else
      throw_invalid("tool_choice", fmt::format("'tool_choice' must be 'none', 'auto', 'required' or "
                                               "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}",
                                               clip_json(*v)));
  } else if (v->is_object()) {
    const json* type = field(*v, "type");
    const json* fn = field(*v, "function");
    const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!type || *type != "function" || !name || !name->is_string())
      throw_invalid("tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                                   "{\"name\": ...}}");
    r.tool_choice = TC::kNamed;
    r.tool_choice_name = name->get<std::string>();
    if (std::none_of(r.tools.begin(), r.tools.end(), [&](const ToolFunction& f) { return f.name == r.tool_choice_name; }))
      throw_invalid("tool_choice", fmt::format("'tool_choice' names the function '{}', which is not among 'tools'",
                                               clip(r.tool_choice_name)));
  } else {
    wrong_type("tool_choice", "a string or an object", *v);
  }
  if (r.tool_choice != TC::kNone && r.tools.empty())
    throw_invalid("tool_choice", "'tool_choice' other than 'none' needs 'tools'");
}

}  // namespace

namespace {

json parse_body(std::string_view body, const JsonLimits& lim) {
  try {
    return parse_json(body, lim);
  } catch (const Error& e) {
    throw_invalid("", e.what());
  }
}

json parse_object(std::string_view body, const JsonLimits& lim) {
  json j = parse_body(body, lim);
  if (!j.is_object()) throw_invalid("", fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  return j;
}

std::string model_field(const json& j) {
  const json* m = field(j, "model");
  if (!m) return {};
  if (!m->is_string()) wrong_type("model", "a string", *m);
  return m->get<std::string>();
}

}  // namespace

ApiRequest parse_request(Endpoint ep, std::string body, const ParseLimits& lim) {
  json tree = parse_body(body, lim.json);
  body = std::string();
  return parse_request_json(ep, std::move(tree), lim);
}

TokenizeRequest parse_tokenize(std::string body, const JsonLimits& lim) {
  json j = parse_object(body, lim);
  body = std::string();
  TokenizeRequest r;
  r.model = model_field(j);
  // vLLM: "prompt", "add_special_tokens" (default true); llama.cpp: "content", "add_special" (default false).
  const bool vllm = field(j, "prompt") != nullptr;
  const char* key = vllm ? "prompt" : "content";
  json* text = const_cast<json*>(field(j, key));
  if (!text) throw_invalid("prompt", "missing required field 'prompt' (or llama.cpp's 'content')");
  if (!text->is_string()) wrong_type(key, "a string", *text);
  r.text = take(*text);
  r.add_special = get_bool(j, vllm ? "add_special_tokens" : "add_special").value_or(vllm);
  return r;
}

DetokenizeRequest parse_detokenize(std::string_view body, const JsonLimits& lim) {
  const json j = parse_object(body, lim);
  DetokenizeRequest r;
  r.model = model_field(j);
  const json* t = field(j, "tokens");
  if (!t) throw_invalid("tokens", "missing required field 'tokens'");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  for (const json& id : *t) r.tokens.push_back(checked_token(id, "tokens"));
  return r;
}

ApiRequest parse_request_json(Endpoint ep, json j, const ParseLimits& lim) {
  if (!j.is_object()) throw_invalid("", fmt::format("the request body must be a JSON object, got {}", type_name(j)));
  ApiRequest r;
  r.endpoint = ep;
  const bool chat = ep == Endpoint::kChat;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    r.model = m->get<std::string>();
  }
  if (chat) parse_messages(j, r, lim);
  else parse_prompt(j, r, lim);

  RequestParams& p = r.params;
  SamplingParams& s = p.sampling;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  s.min_p = 0.0f;
  s.repeat_penalty = 1.0f;
  s.seed = 0xFFFFFFFF;  // the sampler's "random seed"
  p.max_tokens = chat ? -1 : 16;

  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  constexpr float kTinyFloat = std::numeric_limits<float>::min();
  // echo (completions): the prompt leads each choice's text; with max_tokens
  // 0 it is all of it, which is how a prompt is scored (its logprobs).
  if (!chat) r.echo = get_bool(j, "echo").value_or(false);
  // max_tokens 0: the prompt alone, its logprobs with echo, else a cache
  // warm-up (as llama.cpp's clients send one): nothing is generated.
  if (auto v = get_int(j, "max_tokens", 0, kMaxInt)) p.max_tokens = static_cast<int32_t>(*v);
  if (auto v = get_int(j, "max_completion_tokens", 1, kMaxInt)) p.max_tokens = static_cast<int32_t>(*v);
  if (auto v = get_number(j, "temperature", {0, 2})) s.temperature = static_cast<float>(*v);
  // A positive value too small for a float keeps its meaning (the top token alone) rather than becoming 0.
  if (auto v = get_number(j, "top_p", {0, 1, true})) s.top_p = std::max(static_cast<float>(*v), kTinyFloat);
  if (auto v = get_int(j, "top_k", -1, kMaxTopK)) s.top_k = static_cast<int32_t>(*v);
  if (auto v = get_number(j, "min_p", {0, 1})) s.min_p = static_cast<float>(*v);
  if (auto v = get_number(j, "frequency_penalty", {-2, 2})) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = get_number(j, "presence_penalty", {-2, 2})) s.presence_penalty = static_cast<float>(*v);
  if (auto v = get_number(j, "repeat_penalty", {0, 10, true}))
    s.repeat_penalty = std::max(static_cast<float>(*v), kTinyFloat);
  if (auto v = get_int(j, "repeat_last_n", -1, kMaxInt)) s.repeat_last_n = static_cast<int32_t>(*v);
  if (const json* v = field(j, "seed")) {
    if (!v->is_number_integer()) wrong_type("seed", "an integer", *v);
    // Negative seeds keep their bits: all 64 count in the sampler.
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (auto v = get_int(j, "n", 1, lim.max_n)) p.n = static_cast<int32_t>(*v);
  if (r.prompts.size() * static_cast<size_t>(p.n) > static_cast<size_t>(lim.max_choices))
    throw_invalid("n", fmt::format("{} prompts x n = {} asks for {} choices; at most {} are allowed", r.prompts.size(),
                                   p.n, r.prompts.size() * p.n, lim.max_choices));
  if (auto v = get_int(j, "priority", -1000000, 1000000)) p.priority = static_cast<int32_t>(*v);
  // Speculative decoding per request (llama.cpp's field name for the cap):
  // "speculative": false opts out, "speculative.n_max" caps the drafts a step.
  if (auto v = get_bool(j, "speculative"); v && !*v) p.spec_max = 0;
  if (auto v = get_int(j, "speculative.n_max", 0, 64)) p.spec_max = static_cast<int32_t>(*v);
  if (auto v = get_bool(j, "ignore_eos")) p.stop_at_eog = !*v;
  // Sparse attention's budget for this request (an extension): 0 for dense
  // attention; a positive budget where the server runs --sparse-attention.
  if (auto v = get_int(j, "sparse_attention", 0, 1 << 24)) p.sparse_attention = static_cast<int32_t>(*v);
  p.stop = parse_stop(j, lim);
  if (const json* lb = field(j, "logit_bias")) s.logit_bias = parse_logit_bias(*lb, lim);

  if (chat) {
    const bool lp = get_bool(j, "logprobs").value_or(false);
    const auto top = get_int(j, "top_logprobs", 0, lim.max_logprobs);
    if (top && !lp) throw_invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    p.logprobs = lp ? static_cast<int32_t>(top.value_or(0)) : -1;
  } else {
    if (auto v = get_int(j, "logprobs", 0, lim.max_logprobs)) p.logprobs = static_cast<int32_t>(*v);
    if (r.echo) p.prompt_logprobs = p.logprobs;
  }

  r.stream = get_bool(j, "stream").value_or(false);
  r.timings = get_bool(j, "timings").value_or(false);
  if (auto v = get_string(j, "session")) {
    if (v->empty() || v->size() > 256)
      throw_invalid("session", "'session' must be a name of 1 to 256 characters");
    p.session = std::move(*v);
  }
  if (auto v = get_string(j, "cache_salt")) {
    if (v->empty() || v->size() > static_cast<size_t>(lim.max_cache_salt))
      throw_invalid("cache_salt", fmt::format("'cache_salt' must be a string of 1 to {} bytes", lim.max_cache_salt));
    p.cache_salt = std::move(*v);
  }
  if (const json* kt = field(j, "kv_transfer_params")) r.kv_transfer = parse_kv_transfer(*kt);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!r.stream) throw_invalid("stream_options", "'stream_options' is only allowed with 'stream': true");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }

  // Recognised but not implemented: refuse rather than silently answer
  // something else than what was asked.
  if (auto v = get_int(j, "best_of", 1, lim.max_n); v && *v != p.n)
    throw_invalid("best_of", "'best_of' other than 'n' is not supported");
  if (chat) reject_if_present(j, "echo", "chat does not echo its messages");
  reject_if_present(j, "suffix", "no insertion mode");
  reject_if_present(j, "functions", "the legacy 'functions' field is not supported; send 'tools'");
  if (const json* t = field(j, "tools")) {
    if (!chat) throw_invalid("tools", "'tools' is a chat completions field");
    parse_tools(*t, r, lim);
  }
  if (chat) {
    parse_tool_choice(j, r);
    r.parallel_tool_calls = get_bool(j, "parallel_tool_calls").value_or(true);
  }
  const bool calling = r.tool_choice != ApiRequest::ToolChoice::kNone;
  if (calling && p.logprobs >= 0)
    throw_invalid("logprobs", "'logprobs' is not supported together with tool calling");
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const std::string type = get_string(*rf, "type").value_or("text");
    if (calling && type != "text")
      throw_invalid("response_format", "'response_format' other than text cannot be combined with tool calling");
    if (type == "json_object") {
      p.json_object = true;
    } else if (type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      if (!js || !js->is_object() || !field(*js, "schema"))
        throw_invalid("response_format", "'response_format' json_schema needs {\"json_schema\": {\"schema\": {...}}}");
      try {
        p.json_schema = std::make_shared<const CompiledSchema>(compile_schema((*js)["schema"]));
      } catch (const Error& e) {
        throw_invalid("response_format", fmt::format("'response_format' json_schema: {}", e.what()));
      }
    } else if (type != "text") {
      throw_invalid("response_format", fmt::format("'response_format' type '{}' is not supported (only 'text', "
                                                   "'json_object' and 'json_schema')", type));
    }
  }
  return r;
}

void check_logprob_budget(const ApiRequest& r, const std::vector<size_t>& prompt_lengths, int64_t context,
                          const ParseLimits& lim) {
  const RequestParams& p = r.params;
  if (p.logprobs < 0 && p.prompt_logprobs < 0) return;
  const int64_t per_token = 1 + std::max(p.logprobs, p.prompt_logprobs);
  // Each choice: its generated tokens, and with echo its prompt's.
  int64_t total = 0, most_tokens = 0;
  for (size_t len : prompt_lengths) {
    const int64_t tokens = (p.max_tokens >= 0 ? p.max_tokens : context) +
                           (p.prompt_logprobs >= 0 ? static_cast<int64_t>(len) : 0);
    most_tokens = std::max(most_tokens, tokens);
    total += int64_t{p.n} * tokens * per_token;
  }
  if (total <= lim.max_logprob_entries) return;
  const int64_t choices = int64_t{p.n} * static_cast<int64_t>(prompt_lengths.size());
  throw_invalid("logprobs",
                fmt::format("{} choices x {} tokens x (1 + {} logprobs) asks for {} logprob entries; at most {} are "
                            "allowed per request (lower n, max_tokens or the logprobs)",
                            choices, most_tokens, per_token - 1, total, lim.max_logprob_entries));
}

}  // namespace tandem::server
