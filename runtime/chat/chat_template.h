// ChatTemplate: renders HF chat templates (the Jinja2 subset real models ship) into the
// prompt text. Behaves like transformers' apply_chat_template environment:
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus loopcontrols,
// transformers' tojson (ensure_ascii=False, insertion-ordered keys), raise_exception and
// strftime_now. Undefined variables render empty and are falsy.
//
// Supported: {{ }}, {% if/elif/else %}, {% for [if] %}{% else %}, loop.*, {% set %}
// (names, tuples, ns.attr, block set), break/continue, {% generation %}, comments and
// whitespace control; literals, lists, dicts, tuples, attribute/subscript/slice access,
// arithmetic, comparison, logic, `in`, `is` tests, inline if; the filters, tests,
// methods and functions listed in jinja_builtins.cpp. Anything else (macro, call, filter
// blocks, include, ...) is a parse error naming the construct and its line.
// Limits: upper/lower/title map ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic only;
// dict keys are strings.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace troupe {

namespace jinja {
struct Stmt;
}

struct ChatMessage {
  std::string role;
  std::string content;
};

// Every render is bounded; exceeding a limit is an error naming it.
struct TemplateBudget {
  uint64_t max_loop_iterations = 100000;  // all loop iterations together (also caps range())
  uint64_t max_output_bytes = 4 << 20;    // output, and any single string/list built on the way
  double max_seconds = 1.0;               // wall time of one render
  uint32_t max_depth = 64;                // nesting of statements and expressions, and of values
                                          // (lists/dicts, template variables included)
};

class ChatTemplate {
 public:
  // Parses once; errors name the unsupported construct and line, e.g.
  // "chat template line 3: unsupported tag 'macro'".
  static Result<ChatTemplate> parse(const std::string& source);

  // Variables: messages (list of {role, content}), add_generation_prompt, bos_token, eos_token.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                             const std::string& bos_token, const std::string& eos_token,
                             const TemplateBudget& budget = {}) const;

  // General entry: a JSON object of variables (messages may carry any fields, tools, ...).
  // nlohmann::json sorts object keys; pass an ordered_json when `tojson` output must keep
  // the caller's key order (as Python dicts do).
  Result<std::string> render_json(const nlohmann::json& vars, const TemplateBudget& budget = {}) const;
  Result<std::string> render_json(const nlohmann::ordered_json& vars, const TemplateBudget& budget = {}) const;

 private:
  std::shared_ptr<const std::vector<jinja::Stmt>> body_;
};

}  // namespace troupe
