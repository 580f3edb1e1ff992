// Parsing and validation of OpenAI-style request bodies (/v1/completions,
// /v1/chat/completions, /tokenize, /detokenize) into typed structs, and OpenAI's error JSON.
// Pure functions: no I/O, no model; the caller passes the limits that depend on the model.
// Every invalid input becomes an ApiError naming the parameter (RELIABILITY.md's HTTP list).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/chat/tool_calls.h"
#include "runtime/sample/sampler.h"

namespace troupe::api {

struct ApiError {
  int status = 400;                            // HTTP status
  std::string message;                         // human-readable, names the parameter
  std::string type = "invalid_request_error";  // OpenAI error type
  std::string param;                           // offending parameter ("" if none)
  std::string code;                            // optional OpenAI code ("" → null)
};

// {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
std::string error_json(const ApiError& e);

// Compact JSON text; invalid UTF-8 in strings (e.g. a partial token's bytes) becomes U+FFFD.
std::string to_json_text(const nlohmann::json& j);

// Caps (flags of `troupe serve`) and model facts used for validation.
struct Limits {
  int32_t vocab_size = 0;   // token ids must be in [0, vocab_size)
  int32_t max_context = 0;  // prompt + max_tokens must fit
  int32_t max_n = 16;
  int32_t max_top_logprobs = 20;
  int32_t max_stop = 4;        // stop strings
  int32_t max_stop_len = 256;  // bytes per stop string
  int32_t max_stop_token_ids = 64;
  int32_t max_logit_bias = 1024;         // entries
  int32_t max_prompts = 64;              // completions: prompts in one request (list form)
  int32_t max_messages = 1024;           // chat: messages
  int32_t max_json_depth = 64;           // nesting depth of the body
  int32_t num_speculative_tokens = 0;    // the server's draft limit (--speculative; 0: off)
  std::vector<std::string> model_names;  // accepted values of "model" (empty list: any)
};

struct ChatMessage {
  std::string role;             // system | user | assistant | developer | tool
  std::string content;          // string content, or the concatenation of the text parts
  bool is_tool_result = false;  // a "tool" message, now a user turn of <tool_response>s
};

// A prompt for /v1/completions: text or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<int32_t> token_ids;  // used when text is empty (nullopt)
};

struct GenerationRequest {
  bool is_chat = false;
  std::string model;
  std::vector<Prompt> prompts;        // completions: one or more (each yields n choices)
  std::vector<ChatMessage> messages;  // chat
  std::optional<int32_t> max_tokens;  // max_tokens or max_completion_tokens; nullopt: up to the context
  // The sequence every choice starts from: sampling (temperature, top_p, top_k, min_p,
  // penalties, logit_bias, seed), stop_token_ids, ignore_eos, priority.
  SeqRequest seq;
  bool has_seed = false;
  bool logprobs = false;     // completions: logprobs:int → logprobs=true, top_logprobs=int
  int32_t top_logprobs = 0;  // chat: logprobs:bool + top_logprobs:int
  int32_t n = 1;
  std::vector<std::string> stop;
  bool echo = false;  // completions only
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;            // accepted and ignored
  // Chat tool calling (runtime/chat/tool_calls.h): the functions offered (already written
  // into the system message), tool_choice and parallel_tool_calls. With Required or Named,
  // seq.sampling.grammar makes the answer calls only.
  std::vector<ToolFunction> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  bool tools_active() const { return is_chat && !tools.empty() && tool_choice.kind != ToolChoice::Kind::None; }
};

// Parses a /v1/completions (is_chat = false) or /v1/chat/completions body.
// Token-id prompts are range-checked here; text prompts are length-checked by the caller
// after tokenization (check_prompt_fits).
std::variant<GenerationRequest, ApiError> parse_generation(std::string_view body, bool is_chat, const Limits& lim);

// After tokenization: prompt non-empty, prompt + max_tokens within the context (the rule of
// runtime/request/context_fit.h). Returns the effective max_tokens (the request's, or what is left of the context).
std::variant<int32_t, ApiError> check_prompt_fits(size_t prompt_tokens, const GenerationRequest& r, const Limits& lim);

// /tokenize: {"model"?, "prompt": str} or {"model"?, "messages": [...], "add_generation_prompt"?: bool}
// plus "add_special_tokens"?: bool (default true).
struct TokenizeRequest {
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
std::variant<TokenizeRequest, ApiError> parse_tokenize(std::string_view body, const Limits& lim);

// /detokenize: {"model"?, "tokens": [int...]}
std::variant<std::vector<int32_t>, ApiError> parse_detokenize(std::string_view body, const Limits& lim);

}  // namespace troupe::api
