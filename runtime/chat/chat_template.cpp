// ChatTemplate: parse once (lexer + parser), render many times under a budget.
#include "runtime/chat/chat_template.h"

#include "runtime/chat/jinja/eval.h"

namespace troupe {

Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  auto tokens = jinja::lex(source);
  if (!tokens.ok()) return tokens.error();
  auto body = jinja::parse(tokens.value());
  if (!body.ok()) return body.error();
  ChatTemplate t;
  t.body_ = std::make_shared<const jinja::Body>(std::move(body.value()));
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                         const std::string& bos_token, const std::string& eos_token,
                                         const TemplateBudget& budget) const {
  if (!body_) return make_error("chat template was not parsed");
  jinja::ValueList list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::ValueDict d;
    d.entries.emplace_back("role", jinja::Value::string(m.role));
    d.entries.emplace_back("content", jinja::Value::string(m.content));
    list.push_back(jinja::Value::make_dict(std::move(d)));
  }
  jinja::ValueDict vars;
  vars.entries.emplace_back("messages", jinja::Value::make_list(std::move(list)));
  vars.entries.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  vars.entries.emplace_back("bos_token", jinja::Value::string(bos_token));
  vars.entries.emplace_back("eos_token", jinja::Value::string(eos_token));
  return jinja::render(*body_, vars, budget);
}

template <typename Json>
static Result<std::string> render_vars(const std::shared_ptr<const jinja::Body>& body_, const Json& vars,
                                       const TemplateBudget& budget) {
  if (!body_) return make_error("chat template was not parsed");
  if (vars.is_null()) return jinja::render(*body_, {}, budget);  // `{}` converts to null
  if (!vars.is_object()) return make_error("chat template variables must be a JSON object");
  // Each variable is a value like any other: nested at most max_depth deep.
  jinja::ValueDict globals;
  for (auto it = vars.begin(); it != vars.end(); ++it) {
    auto v = jinja::from_json(it.value(), budget.max_depth);
    if (!v.ok()) return make_error("chat template variable '" + it.key() + "': " + v.error().message);
    globals.entries.emplace_back(it.key(), std::move(v.value()));
  }
  return jinja::render(*body_, globals, budget);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::json& vars, const TemplateBudget& budget) const {
  return render_vars(body_, vars, budget);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& vars, const TemplateBudget& budget) const {
  return render_vars(body_, vars, budget);
}

}  // namespace troupe
