// Parsing and validation of OpenAI-style request bodies; see openai_request.h.
//
// Internally a failed check throws `Reject` (an ApiError); the public entry points catch it
// and return the error, so each helper can stay a few lines long. Nothing here echoes raw
// request bytes except strings nlohmann has already checked to be valid UTF-8 (clipped),
// and error_json() replaces any invalid byte anyway.
#include "apps/serve/openai_request.h"

#include "runtime/grammar/structured_output.h"
#include "runtime/request/context_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

namespace troupe::api {
namespace {

using json = nlohmann::json;

struct Reject {
  ApiError e;
};

[[noreturn]] void reject(const std::string& param, std::string message) {
  ApiError e;
  e.message = std::move(message);
  e.param = param;
  throw Reject{std::move(e)};
}

std::string q(const std::string& name) { return "'" + name + "'"; }

// A user-supplied string, shortened for use inside an error message.
std::string clip(std::string_view s, size_t max_len = 64) {
  if (s.size() <= max_len) return std::string(s);
  return std::string(s.substr(0, max_len)) + "...";
}

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// ---- body ------------------------------------------------------------------------------

// Bracket depth outside strings, so that a deeply nested body is refused before any parser
// sees it. Only needs to be exact for valid JSON: anything else fails to parse afterwards.
bool depth_within(std::string_view s, int32_t max_depth) {
  int64_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

json parse_object(std::string_view body, const Limits& lim) {
  if (!depth_within(body, lim.max_json_depth))
    reject("", "request body is nested deeper than " + std::to_string(lim.max_json_depth) + " levels");
  json j;
  try {
    j = json::parse(body.begin(), body.end());  // rejects invalid UTF-8 and trailing data
  } catch (const json::parse_error& e) {
    reject("", "request body is not valid JSON (error at byte " + std::to_string(e.byte) + ")");
  } catch (const json::out_of_range&) {
    reject("", "request body contains a number that is out of range");
  } catch (const json::exception&) { reject("", "request body is not valid JSON"); }
  if (!j.is_object()) reject("", "request body must be a JSON object");
  return j;
}

// ---- typed fields ----------------------------------------------------------------------
// An absent field and an explicit null both mean "use the default", as in OpenAI's API.

const json* field(const json& o, const char* key) {
  auto it = o.find(key);
  return (it == o.end() || it->is_null()) ? nullptr : &*it;
}

std::optional<bool> opt_bool(const json& o, const char* key) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) reject(key, q(key) + " must be a boolean");
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& o, const char* key) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) reject(key, q(key) + " must be a string");
  return v->get<std::string>();
}

// An integer in [lo, hi]. JSON integers, and floats with no fraction (10.0, as pydantic
// accepts), are integers; 1.5, "10", true are not. |lo|, |hi| must fit in int32 or so,
// which keeps the double comparisons exact.
int64_t to_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  auto range = [&](const std::string& got) {
    reject(name, q(name) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + got);
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo) range(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) range(std::to_string(i));
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) reject(name, q(name) + " must be an integer, got " + num_str(d));
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) range(num_str(d));
    return static_cast<int64_t>(d);
  }
  reject(name, q(name) + " must be an integer");
}

std::optional<int64_t> opt_int(const json& o, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  return to_int(*v, key, lo, hi);
}

// A finite number in [lo, hi] (or (lo, hi] when lo_open).
std::optional<float> opt_real(const json& o, const char* key, double lo, double hi, bool lo_open = false) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) reject(key, q(key) + " must be a number");
  const double d = v->get<double>();
  const bool low_ok = lo_open ? d > lo : d >= lo;
  if (!std::isfinite(d) || !low_ok || d > hi)
    reject(key,
           q(key) + " must be in " + (lo_open ? "(" : "[") + num_str(lo) + ", " + num_str(hi) + "], got " + num_str(d));
  return static_cast<float>(d);
}

int32_t token_id(const json& v, const std::string& name, const Limits& lim) {
  if (!v.is_number_integer()) reject(name, q(name) + " must contain integer token ids");
  const bool in_vocab = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(std::max(lim.vocab_size, 0))
                                               : (v.get<int64_t>() >= 0 && v.get<int64_t>() < lim.vocab_size);
  if (!in_vocab)
    reject(name, "token id " + v.dump() + " in " + q(name) + " is outside the vocabulary [0, " +
                     std::to_string(lim.vocab_size) + ")");
  return static_cast<int32_t>(v.get<int64_t>());
}

std::vector<int32_t> token_list(const json& v, const std::string& name, const Limits& lim) {
  if (!v.is_array()) reject(name, q(name) + " must be an array of token ids");
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const json& t : v) out.push_back(token_id(t, name, lim));
  return out;
}

// ---- model, prompts, messages ----------------------------------------------------------

std::string parse_model(const json& o, const Limits& lim) {
  const std::string model = opt_string(o, "model").value_or("");
  const auto& names = lim.model_names;
  if (field(o, "model") && !names.empty() && std::find(names.begin(), names.end(), model) == names.end()) {
    ApiError e;
    e.status = 404;
    e.message = "The model `" + clip(model, 256) + "` does not exist.";
    e.param = "model";
    e.code = "model_not_found";
    throw Reject{std::move(e)};
  }
  return model;
}

Prompt one_prompt(const json& v, const Limits& lim) {
  Prompt p;
  if (v.is_string()) {
    p.text = v.get<std::string>();
    if (p.text->empty()) reject("prompt", "'prompt' must not be empty");
  } else if (v.is_array()) {
    p.token_ids = token_list(v, "prompt", lim);
    if (p.token_ids.empty()) reject("prompt", "'prompt' must not be empty");
  } else {
    reject("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
  }
  return p;
}

// string | [int...] | [string...] | [[int...]...]
std::vector<Prompt> parse_prompts(const json& o, const Limits& lim) {
  const json* v = field(o, "prompt");
  if (!v) reject("prompt", "'prompt' is required");
  if (v->is_string()) return {one_prompt(*v, lim)};
  if (!v->is_array()) reject("prompt", "'prompt' must be a string, an array of token ids, or an array of those");
  if (v->empty()) reject("prompt", "'prompt' must not be empty");
  if ((*v)[0].is_number()) return {one_prompt(*v, lim)};  // one prompt of token ids
  if (v->size() > static_cast<size_t>(lim.max_prompts))
    reject("prompt", "'prompt' has " + std::to_string(v->size()) + " prompts; at most " +
                         std::to_string(lim.max_prompts) + " are allowed");
  const bool strings = (*v)[0].is_string();
  std::vector<Prompt> out;
  for (const json& p : *v) {
    if (p.is_string() != strings || !(p.is_string() || p.is_array()))
      reject("prompt", "'prompt' must be a list of strings or a list of token-id lists, not a mix");
    out.push_back(one_prompt(p, lim));
  }
  return out;
}

bool known_role(const std::string& r) {
  return r == "system" || r == "user" || r == "assistant" || r == "developer" || r == "tool";
}

// String content, or text parts joined with "\n" (as vLLM joins them).
std::string content_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) reject("messages", where + ".content must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      reject("messages", where + ".content[" + std::to_string(i) + "]: only text content parts are supported");
    const json* t = field(part, "text");
    if (!t || !t->is_string()) reject("messages", where + ".content[" + std::to_string(i) + "].text must be a string");
    if (i > 0) text += '\n';
    text += t->get<std::string>();
  }
  return text;
}

ChatMessage one_message(const json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) reject("messages", where + " must be an object");
  const json* role = field(m, "role");
  if (!role || !role->is_string() || !known_role(role->get<std::string>()))
    reject("messages", where + ".role must be one of system, user, assistant, developer, tool");
  ChatMessage out{role->get<std::string>(), ""};
  const json* content = field(m, "content");
  if (content)
    out.content = content_text(*content, where);
  else if (out.role != "assistant")
    reject("messages", where + ".content is required");
  if (const json* calls = field(m, "tool_calls"); calls && out.role == "assistant") {
    // An earlier turn's calls, written back as the model wrote them.
    if (!calls->is_array()) reject("messages", where + ".tool_calls must be an array");
    std::vector<ToolCall> tc;
    for (size_t k = 0; k < calls->size(); ++k) {
      const json& c = (*calls)[k];
      const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
      const json* fn = c.is_object() ? field(c, "function") : nullptr;
      const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!name || !name->is_string()) reject("messages", at + ".function.name must be a string");
      const json* args = field(*fn, "arguments");
      if (args && !args->is_string()) reject("messages", at + ".function.arguments must be a string");
      tc.push_back({"", name->get<std::string>(), args ? args->get<std::string>() : "{}"});
    }
    const std::string text = render_tool_calls(tc);
    out.content = out.content.empty() ? text : out.content + "\n" + text;
  }
  if (out.role == "tool") {  // a result: the next user turn carries it (Hermes / Qwen2.5)
    out.role = "user";
    out.content = render_tool_response(out.content);
    out.is_tool_result = true;
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const json& o, const Limits& lim) {
  const json* v = field(o, "messages");
  if (!v) reject("messages", "'messages' is required");
  if (!v->is_array()) reject("messages", "'messages' must be an array");
  if (v->empty()) reject("messages", "'messages' must not be empty");
  if (v->size() > static_cast<size_t>(lim.max_messages))
    reject("messages", "'messages' has " + std::to_string(v->size()) + " entries; at most " +
                           std::to_string(lim.max_messages) + " are allowed");
  std::vector<ChatMessage> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    ChatMessage m = one_message((*v)[i], i);
    if (m.is_tool_result && !out.empty() && out.back().is_tool_result)  // results of parallel calls: one turn
      out.back().content += "\n" + m.content;
    else
      out.push_back(std::move(m));
  }
  return out;
}

// tools, tool_choice, parallel_tool_calls (chat only): the functions are checked and written
// into the system message; "required" or a named function constrains the answer to calls.
void parse_tools(const json& o, GenerationRequest& r) {
  const json* tools = field(o, "tools");
  const json* choice = field(o, "tool_choice");
  if (!r.is_chat) {
    if (tools || choice) reject(tools ? "tools" : "tool_choice", "tools are supported on /v1/chat/completions only");
    return;
  }
  if (auto p = opt_bool(o, "parallel_tool_calls")) r.parallel_tool_calls = *p;
  if (tools) {
    if (!tools->is_array()) reject("tools", "'tools' must be an array");
    if (tools->size() > 128) reject("tools", "'tools' has over 128 functions");
    for (size_t k = 0; k < tools->size(); ++k) {
      const json& t = (*tools)[k];
      const std::string at = "tools[" + std::to_string(k) + "]";
      const json* type = t.is_object() ? field(t, "type") : nullptr;
      if (!type || !type->is_string() || type->get<std::string>() != "function")
        reject("tools", at + ".type must be 'function'");
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object()) reject("tools", at + ".function must be an object");
      const json* name = field(*fn, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty() || name->get<std::string>().size() > 64)
        reject("tools", at + ".function.name must be a string of 1 to 64 characters");
      ToolFunction f;
      f.name = name->get<std::string>();
      for (const auto& g : r.tools)
        if (g.name == f.name) reject("tools", at + ": function '" + f.name + "' is listed twice");
      if (const json* d = field(*fn, "description")) {
        if (!d->is_string()) reject("tools", at + ".function.description must be a string");
        f.description = d->get<std::string>();
      }
      if (const json* p = field(*fn, "parameters")) {
        if (!p->is_object()) reject("tools", at + ".function.parameters must be a JSON schema object");
        f.parameters = nlohmann::ordered_json::parse(p->dump());
      }
      r.tools.push_back(std::move(f));
    }
  }
  if (choice) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "auto")
        r.tool_choice.kind = ToolChoice::Kind::Auto;
      else if (c == "none")
        r.tool_choice.kind = ToolChoice::Kind::None;
      else if (c == "required")
        r.tool_choice.kind = ToolChoice::Kind::Required;
      else
        reject("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a function, got '" + clip(c) + "'");
    } else if (choice->is_object()) {
      const json* fn = field(*choice, "function");
      const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!name || !name->is_string())
        reject("tool_choice", "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      r.tool_choice = {ToolChoice::Kind::Named, name->get<std::string>()};
    } else {
      reject("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r.tool_choice.kind != ToolChoice::Kind::None && r.tool_choice.kind != ToolChoice::Kind::Auto && r.tools.empty())
      reject("tool_choice", "'tool_choice' needs 'tools'");
  }
  if (r.tools.empty()) return;
  // The functions go into the system message (a new first one if there is none) -- with
  // tool_choice "none" too, as vLLM does: the model still sees what was called before.
  const std::string section = tools_system_prompt(r.tools);
  if (!r.messages.empty() && (r.messages[0].role == "system" || r.messages[0].role == "developer"))
    r.messages[0].content += "\n\n" + section;
  else
    r.messages.insert(r.messages.begin(), ChatMessage{"system", section});
  if (r.tool_choice.kind == ToolChoice::Kind::Auto || r.tool_choice.kind == ToolChoice::Kind::None) return;
  if (r.seq.sampling.grammar.size() || r.seq.sampling.json_object)
    reject("tool_choice", "a forced tool call cannot be combined with response_format or guided decoding");
  auto g = tool_call_grammar(r.tools, r.tool_choice, r.parallel_tool_calls);
  const char* param = r.tool_choice.kind == ToolChoice::Kind::Named ? "tool_choice" : "tools";
  if (!g) reject(param, g.error().message);
  if (std::string why = grammar_problem(*g); !why.empty()) reject(param, "tools: " + why);
  r.seq.sampling.grammar = std::move(*g);
}

// ---- generation parameters -------------------------------------------------------------

void parse_max_tokens(const json& o, const Limits& lim, GenerationRequest& r) {
  const int64_t hi = lim.max_context > 0 ? lim.max_context : std::numeric_limits<int32_t>::max();
  const auto max_tokens = opt_int(o, "max_tokens", 1, hi);
  const auto max_completion = opt_int(o, "max_completion_tokens", 1, hi);
  if (max_completion)
    r.max_tokens = static_cast<int32_t>(*max_completion);  // the newer name wins
  else if (max_tokens)
    r.max_tokens = static_cast<int32_t>(*max_tokens);
}

void parse_sampling(const json& o, SamplingParams& s) {
  s.temperature = opt_real(o, "temperature", 0, 2).value_or(s.temperature);
  s.top_p = opt_real(o, "top_p", 0, 1, /*lo_open=*/true).value_or(s.top_p);
  s.min_p = opt_real(o, "min_p", 0, 1).value_or(s.min_p);
  s.presence_penalty = opt_real(o, "presence_penalty", -2, 2).value_or(s.presence_penalty);
  s.frequency_penalty = opt_real(o, "frequency_penalty", -2, 2).value_or(s.frequency_penalty);
  s.repetition_penalty = opt_real(o, "repetition_penalty", 0, 2, /*lo_open=*/true).value_or(s.repetition_penalty);
  const int64_t top_k = opt_int(o, "top_k", -1, std::numeric_limits<int32_t>::max()).value_or(0);
  s.top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);  // -1 (vLLM) and 0 both mean off
}

// Completions: "logprobs": int. Chat: "logprobs": bool + "top_logprobs": int.
void parse_logprobs(const json& o, const Limits& lim, GenerationRequest& r) {
  if (!r.is_chat) {
    const auto n = opt_int(o, "logprobs", 0, lim.max_top_logprobs);
    r.logprobs = n.has_value();
    r.top_logprobs = static_cast<int32_t>(n.value_or(0));
    return;
  }
  r.logprobs = opt_bool(o, "logprobs").value_or(false);
  const auto top = opt_int(o, "top_logprobs", 0, lim.max_top_logprobs);
  if (top && !r.logprobs) reject("top_logprobs", "'logprobs' must be true when 'top_logprobs' is given");
  r.top_logprobs = static_cast<int32_t>(top.value_or(0));
}

void parse_stop(const json& o, const Limits& lim, GenerationRequest& r) {
  if (const json* v = field(o, "stop")) {
    const json list = v->is_string() ? json::array({*v}) : *v;
    if (!list.is_array()) reject("stop", "'stop' must be a string or an array of strings");
    if (list.size() > static_cast<size_t>(lim.max_stop))
      reject("stop", "'stop' has " + std::to_string(list.size()) + " entries; at most " + std::to_string(lim.max_stop) +
                         " are allowed");
    for (const json& s : list) {
      if (!s.is_string()) reject("stop", "'stop' must be a string or an array of strings");
      const auto& str = s.get_ref<const std::string&>();
      if (str.empty() || str.size() > static_cast<size_t>(lim.max_stop_len))
        reject("stop", "each stop string must be 1 to " + std::to_string(lim.max_stop_len) + " bytes, got " +
                           std::to_string(str.size()));
      r.stop.push_back(str);
    }
  }
  if (const json* v = field(o, "stop_token_ids")) {
    if (v->is_array() && v->size() > static_cast<size_t>(lim.max_stop_token_ids))
      reject("stop_token_ids", "'stop_token_ids' has " + std::to_string(v->size()) + " entries; at most " +
                                   std::to_string(lim.max_stop_token_ids) + " are allowed");
    r.seq.stop_token_ids = token_list(*v, "stop_token_ids", lim);
  }
}

// Keys are decimal token ids ("123"); values finite numbers in [-100, 100].
void parse_logit_bias(const json& o, const Limits& lim, SamplingParams& s) {
  const json* v = field(o, "logit_bias");
  if (!v) return;
  if (!v->is_object()) reject("logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
  if (v->size() > static_cast<size_t>(lim.max_logit_bias))
    reject("logit_bias", "'logit_bias' has " + std::to_string(v->size()) + " entries; at most " +
                             std::to_string(lim.max_logit_bias) + " are allowed");
  for (const auto& [key, bias] : v->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id >= lim.vocab_size)
      reject("logit_bias",
             "'logit_bias' key '" + clip(key) + "' is not a token id in [0, " + std::to_string(lim.vocab_size) + ")");
    if (!bias.is_number()) reject("logit_bias", "'logit_bias' values must be numbers");
    const double b = bias.get<double>();
    if (!std::isfinite(b) || b < -100 || b > 100)
      reject("logit_bias", "'logit_bias' values must be in [-100, 100], got " + num_str(b));
    s.logit_bias[static_cast<int32_t>(id)] = static_cast<float>(b);
  }
}

// Any JSON integer that fits in int64 or uint64; negative seeds wrap to uint64. Floats
// (1.5, and 2^64, which nlohmann can only read as a float) are refused.
void parse_seed(const json& o, GenerationRequest& r) {
  const json* v = field(o, "seed");
  if (!v) return;
  if (!v->is_number_integer()) reject("seed", "'seed' must be an integer in the int64 or uint64 range");
  r.seq.sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  r.has_seed = true;
}

void parse_stream(const json& o, GenerationRequest& r) {
  r.stream = opt_bool(o, "stream").value_or(false);
  const json* so = field(o, "stream_options");
  if (!so) return;
  if (!so->is_object()) reject("stream_options", "'stream_options' must be an object");
  if (!r.stream) reject("stream_options", "'stream_options' is only allowed when 'stream' is true");
  const json* usage = field(*so, "include_usage");
  if (usage && !usage->is_boolean()) reject("stream_options", "'stream_options.include_usage' must be a boolean");
  r.include_usage = usage && usage->get<bool>();
}

void parse_misc(const json& o, GenerationRequest& r) {
  if (!r.is_chat) r.echo = opt_bool(o, "echo").value_or(false);  // chat: ignored
  r.seq.ignore_eos = opt_bool(o, "ignore_eos").value_or(false);
  r.seq.priority = static_cast<int32_t>(
      opt_int(o, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()).value_or(0));
  r.user = opt_string(o, "user").value_or("");
}

// num_speculative_tokens: this request's draft limit, 0 (none) up to the server's
// --num-speculative-tokens; asking for drafts from a server without --speculative is an error.
void parse_speculative(const json& o, GenerationRequest& r, const Limits& lim) {
  const json* v = field(o, "num_speculative_tokens");
  if (!v || v->is_null()) return;
  if (lim.num_speculative_tokens <= 0) {
    if (v->is_number_integer() && v->get<int64_t>() == 0) {
      r.seq.num_speculative_tokens = 0;
      return;
    }
    reject("num_speculative_tokens", "speculative decoding is off on this server (start it with --speculative)");
  }
  r.seq.num_speculative_tokens =
      static_cast<int32_t>(*opt_int(o, "num_speculative_tokens", 0, lim.num_speculative_tokens));
}

// {"type": "text"} (the default), {"type": "json_object"} (JSON mode: the output is one
// JSON object, runtime/sample/json_constraint.h) or {"type": "json_schema", ...}
// (parse_structured_output).
void parse_response_format(const json& o, GenerationRequest& r) {
  const json* v = field(o, "response_format");
  if (!v || v->is_null()) return;
  if (!v->is_object()) reject("response_format", "'response_format' must be an object");
  const json* t = field(*v, "type");
  if (!t || !t->is_string()) reject("response_format", "'response_format.type' must be a string");
  const std::string type = t->get<std::string>();
  if (type == "text") return;
  if (type == "json_schema") return;  // parse_structured_output
  if (type != "json_object")
    reject("response_format",
           "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '" + clip(type) + "'");
  if (r.seq.ignore_eos) reject("response_format", "'ignore_eos' cannot be combined with a json_object response_format");
  r.seq.sampling.json_object = true;
}

// json_schema, guided_* and structured_outputs (runtime/grammar/structured_output.h): the
// body is read again keeping key order, so properties come in the schema's order.
void parse_structured_output(std::string_view body, const json& o, GenerationRequest& r) {
  if (!has_structured_output(o)) return;
  const StructuredOutput so = structured_output(nlohmann::ordered_json::parse(body.begin(), body.end()));
  if (!so.ok()) reject(so.param, so.error);
  if (so.grammar.empty()) return;
  if (r.seq.sampling.json_object)
    reject(so.param, "a json_object response_format cannot be combined with '" + so.param + "'");
  if (r.seq.ignore_eos) reject(so.param, "'ignore_eos' cannot be combined with structured output");
  r.seq.sampling.grammar = so.grammar;
}

// The sampler's own checks, as a 400 naming the parameter (its message starts with it).
void validate_sampling(const GenerationRequest& r, const Limits& lim) {
  const Status st = r.seq.sampling.validate(lim.vocab_size);
  if (st.ok()) return;
  const std::string msg = st.error().message;
  reject(msg.substr(0, msg.find(' ')), msg);
}

template <typename T, typename F>
std::variant<T, ApiError> guarded(F&& f) {
  try {
    return f();
  } catch (Reject& r) { return std::move(r.e); }
}

}  // namespace

std::string error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return to_json_text(json{{"error", err}});
}

std::variant<GenerationRequest, ApiError> parse_generation(std::string_view body, bool is_chat, const Limits& lim) {
  return guarded<GenerationRequest>([&] {
    const json o = parse_object(body, lim);
    GenerationRequest r;
    r.is_chat = is_chat;
    r.model = parse_model(o, lim);
    r.n = static_cast<int32_t>(opt_int(o, "n", 1, lim.max_n).value_or(1));  // before any fan-out
    if (is_chat)
      r.messages = parse_messages(o, lim);
    else
      r.prompts = parse_prompts(o, lim);
    parse_max_tokens(o, lim, r);
    parse_sampling(o, r.seq.sampling);
    parse_logprobs(o, lim, r);
    r.seq.sampling.logprobs = r.top_logprobs;
    r.seq.sampling.report_logprob = r.logprobs;  // no log-softmax pass per token unless asked for
    parse_stop(o, lim, r);
    parse_logit_bias(o, lim, r.seq.sampling);
    parse_seed(o, r);
    parse_stream(o, r);
    parse_misc(o, r);
    parse_speculative(o, r, lim);
    parse_response_format(o, r);
    parse_structured_output(body, o, r);
    parse_tools(o, r);
    validate_sampling(r, lim);
    return r;
  });
}

std::variant<int32_t, ApiError> check_prompt_fits(size_t prompt_tokens, const GenerationRequest& r, const Limits& lim) {
  const ContextFit f = fit_to_context(prompt_tokens, r.max_tokens, lim.max_context, r.is_chat ? "messages" : "prompt");
  if (!f.ok()) return ApiError{400, f.error, "invalid_request_error", f.param, ""};
  return f.max_new_tokens;
}

std::string to_json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body, const Limits& lim) {
  return guarded<TokenizeRequest>([&] {
    const json o = parse_object(body, lim);
    parse_model(o, lim);
    TokenizeRequest t;
    const bool has_prompt = field(o, "prompt") != nullptr, has_messages = field(o, "messages") != nullptr;
    if (has_prompt == has_messages)
      reject(has_prompt ? "messages" : "prompt", "exactly one of 'prompt' or 'messages' is required");
    if (has_prompt)
      t.prompt = opt_string(o, "prompt");
    else
      t.messages = parse_messages(o, lim);
    t.add_special_tokens = opt_bool(o, "add_special_tokens").value_or(true);
    t.add_generation_prompt = opt_bool(o, "add_generation_prompt").value_or(true);
    return t;
  });
}

std::variant<std::vector<int32_t>, ApiError> parse_detokenize(std::string_view body, const Limits& lim) {
  return guarded<std::vector<int32_t>>([&] {
    const json o = parse_object(body, lim);
    parse_model(o, lim);
    const json* tokens = field(o, "tokens");
    if (!tokens) reject("tokens", "'tokens' is required");
    return token_list(*tokens, "tokens", lim);
  });
}

}  // namespace troupe::api
