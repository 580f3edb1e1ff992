// libFuzzer target: chat templates (Jinja lexer, parser and renderer). The input is the
// template source; when it parses it is rendered under a small budget with a fixed
// conversation, once through render() and once through render_json() with tool calls and
// tools, the variables that real templates look at. Errors (parse errors, budget
// exceeded, raise_exception) are fine; crashes, leaks, hangs and stack overflows are not.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"

using namespace troupe;

namespace {

volatile size_t g_sink;

const std::vector<ChatMessage>& messages() {
  static const std::vector<ChatMessage> m = {
      {"system", "You are a helpful assistant."},
      {"user", "Hello! {{ not a template }} <|im_start|> caf\xC3\xA9"},
      {"assistant", "Hi, how can I help?"},
      {"user", "Count to 3.\n"},
  };
  return m;
}

const nlohmann::ordered_json& json_vars() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "What is the weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22C"},
      {"role": "assistant", "content": ["part", 1, 2.5, true]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "nested": {"a": {"b": {"c": [[[]]]}}}
  })");
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = ChatTemplate::parse(source);
  if (!t) {
    if (t.error().message.empty()) std::abort();
    return 0;
  }
  TemplateBudget budget;
  budget.max_loop_iterations = 2000;
  budget.max_output_bytes = 64 << 10;
  budget.max_seconds = 0.25;
  size_t n = 0;
  auto a = t->render(messages(), size % 2 == 0, "<s>", "</s>", budget);
  if (a) {
    if (a->size() > budget.max_output_bytes) std::abort();  // the output budget must hold
    n += a->size();
  } else if (a.error().message.empty()) {
    std::abort();
  }
  auto b = t->render_json(json_vars(), budget);
  if (b) {
    if (b->size() > budget.max_output_bytes) std::abort();
    n += b->size();
  }
  g_sink = n;
  return 0;
}
