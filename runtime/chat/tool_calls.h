// Tool calling on chat completions: the tools a request offers, written into the prompt;
// earlier calls and their results, written as the model saw them; the model's output parsed
// back into calls; and, for tool_choice "required" or a named function, the grammar that
// makes the output one (or several) well-formed calls whose arguments match the function's
// JSON schema (runtime/grammar/json_schema.h).
//
// The prompt format is Hermes / Qwen2.5's (a system section listing the functions as JSON
// inside <tools></tools>, calls as {"name", "arguments"} inside <tool_call></tool_call>,
// results inside <tool_response></tool_response> in a user turn), written by the server
// rather than by the model's chat template, so a template that knows nothing of tools (the
// default model's) still gets them. The parser reads that format (a block may hold one
// call object or a list of them, as SmolLM2 writes), Mistral's `[TOOL_CALLS][...]` and
// Llama-3.x's `<|python_tag|>` / bare `{"name": ..., "parameters": ...}` JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/result.h"

namespace troupe {

struct ToolFunction {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // a JSON schema
};

struct ToolChoice {
  enum class Kind { Auto, None, Required, Named };
  Kind kind = Kind::Auto;
  std::string name;  // Named
};

struct ToolCall {
  std::string id;  // filled by the server ("call_...")
  std::string name;
  std::string arguments;  // JSON text
};

// The system-prompt section that lists the functions and says how to call them.
std::string tools_system_prompt(const std::vector<ToolFunction>& tools);

// An assistant turn's calls as the model writes them (for earlier turns in `messages`).
std::string render_tool_calls(const std::vector<ToolCall>& calls);

// A tool result as the next user turn carries it.
std::string render_tool_response(const std::string& content);

// For Required (any offered function) or Named: the output is tool-call blocks only, one
// (parallel false or Named) or one or more, each call's arguments valid for its function.
Result<std::string> tool_call_grammar(const std::vector<ToolFunction>& tools, const ToolChoice& choice, bool parallel);

struct ParsedToolCalls {
  std::string content;          // the text before the first call (trimmed), or all of it
  std::vector<ToolCall> calls;  // empty: no call (or one that did not parse / names no offered tool)
};
ParsedToolCalls parse_tool_calls(const std::string& text, const std::vector<ToolFunction>& tools);

// While streaming: how many leading bytes of `text` are surely content (before any call
// marker, and not a suffix that might be the start of one).
size_t tool_content_prefix(const std::string& text);

}  // namespace troupe
