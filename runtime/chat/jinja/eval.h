// Evaluation side of the chat-template engine (private to runtime/): the renderer
// (jinja_eval.cpp) and the builtin filters, tests, methods and functions
// (jinja_builtins.cpp). Builtins report plain messages; the renderer adds the line.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/chat/chat_template.h"
#include "runtime/chat/jinja/ast.h"

namespace troupe::jinja {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  uint32_t max_depth = TemplateBudget{}.max_depth;  // the render's; bounds str()/tojson of nested values
  // The argument at `index` (after the subject) or passed as `name`; null when absent.
  const Value* get(size_t index, std::string_view name) const;
};

// Renders a parsed template with `vars` as globals under `budget`.
Result<std::string> render(const Body& body, const ValueDict& vars, const TemplateBudget& budget);

// Jinja's `obj.name` and `obj[key]`: missing members are Undefined (with a hint naming
// them); any access on an Undefined is an error, as in Jinja.
Result<Value> get_attr(const Value& obj, const std::string& name);
Result<Value> get_item(const Value& obj, const Value& key);
Result<Value> get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Items a for-loop visits: list items, dict keys, string characters; Undefined is empty.
Result<ValueList> iterate(const Value& v);

Result<Value> apply_filter(const std::string& name, const Value& subject, const CallArgs& args);
Result<bool> apply_test(const std::string& name, const Value& subject, const CallArgs& args);
Result<Value> call_method(const Value& object, const std::string& name, const CallArgs& args);
// range/namespace/dict/strftime_now; raise_exception fails with its message. `max_items`
// bounds what range() may build (the loop budget).
Result<Value> call_function(const std::string& name, const CallArgs& args, uint64_t max_items);

}  // namespace troupe::jinja
