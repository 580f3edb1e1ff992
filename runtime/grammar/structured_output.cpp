#include "runtime/grammar/structured_output.h"

#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"

namespace troupe {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kFields[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                                   "structured_outputs"};

StructuredOutput fail(const std::string& param, const std::string& msg) { return {"", param, msg}; }

StructuredOutput from_schema(const ojson& schema, const std::string& param) {
  auto g = json_schema_to_gbnf(schema);
  if (!g) return fail(param, "'" + param + "': " + g.error().message);
  return {*g, param, ""};
}

StructuredOutput from_value(const std::string& kind, const ojson& v, const std::string& param) {
  if (kind == "json") {
    if (v.is_string()) {  // vLLM takes the schema as JSON text too
      ojson parsed;
      try {
        parsed = ojson::parse(v.get<std::string>());
      } catch (const ojson::exception&) { return fail(param, "'" + param + "' is a string but not JSON"); }
      return from_schema(parsed, param);
    }
    return from_schema(v, param);
  }
  if (kind == "regex") {
    if (!v.is_string()) return fail(param, "'" + param + "' must be a string");
    auto g = regex_to_gbnf(v.get<std::string>());
    if (!g) return fail(param, "'" + param + "': " + g.error().message);
    return {*g, param, ""};
  }
  if (kind == "choice") {
    if (!v.is_array() || v.empty()) return fail(param, "'" + param + "' must be a non-empty list of strings");
    if (v.size() > 4096) return fail(param, "'" + param + "' has over 4096 choices");
    std::vector<std::string> choices;
    for (const auto& c : v) {
      if (!c.is_string()) return fail(param, "'" + param + "' must be a non-empty list of strings");
      choices.push_back(c.get<std::string>());
    }
    auto g = choice_to_gbnf(choices);
    if (!g) return fail(param, "'" + param + "': " + g.error().message);
    return {*g, param, ""};
  }
  // grammar
  if (!v.is_string()) return fail(param, "'" + param + "' must be a string (a GBNF grammar with a root rule)");
  return {v.get<std::string>(), param, ""};
}

}  // namespace

bool has_structured_output(const nlohmann::json& body) {
  for (const char* f : kFields)
    if (body.contains(f) && !body[f].is_null()) return true;
  if (const auto it = body.find("response_format"); it != body.end() && it->is_object())
    if (const auto t = it->find("type"); t != it->end() && t->is_string() && t->get<std::string>() == "json_schema")
      return true;
  return false;
}

StructuredOutput structured_output(const ojson& body) {
  std::vector<StructuredOutput> found;
  if (const auto it = body.find("response_format"); it != body.end() && it->is_object()) {
    const auto t = it->find("type");
    if (t != it->end() && t->is_string() && t->get<std::string>() == "json_schema") {
      const auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        return fail("response_format", "'response_format.json_schema' must be an object with a 'schema'");
      const auto sc = js->find("schema");
      if (sc == js->end() || !(sc->is_object() || sc->is_boolean()))
        return fail("response_format", "'response_format.json_schema.schema' must be a JSON schema object");
      if (const auto n = js->find("name"); n != js->end() && !n->is_string())
        return fail("response_format", "'response_format.json_schema.name' must be a string");
      found.push_back(from_schema(*sc, "response_format"));
    }
  }
  static constexpr std::pair<const char*, const char*> kGuided[] = {
      {"guided_json", "json"}, {"guided_regex", "regex"}, {"guided_choice", "choice"}, {"guided_grammar", "grammar"}};
  for (const auto& [field, kind] : kGuided)
    if (const auto it = body.find(field); it != body.end() && !it->is_null())
      found.push_back(from_value(kind, *it, field));
  if (const auto it = body.find("structured_outputs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return fail("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [k, v] : it->items()) {
      if (v.is_null()) continue;
      if (k != "json" && k != "regex" && k != "choice" && k != "grammar")
        return fail("structured_outputs", "'structured_outputs." + k.substr(0, 40) +
                                              "' is not supported (json, regex, choice and grammar are)");
      found.push_back(from_value(k, v, "structured_outputs"));
    }
  }
  if (found.empty()) return {};
  if (found.size() > 1)
    return fail(found[1].param,
                "only one structured-output constraint may be given (response_format json_schema, "
                "guided_json, guided_regex, guided_choice, guided_grammar or one structured_outputs key)");
  StructuredOutput out = std::move(found[0]);
  if (!out.ok()) return out;
  if (std::string why = grammar_problem(out.grammar); !why.empty())
    return fail(out.param, "'" + out.param + "': " + why);
  return out;
}

std::string grammar_problem(const std::string& gbnf) {
  auto g = Grammar::compile(gbnf);
  if (!g) return g.error().message;
  const GrammarState start(**g);
  if (start.overflowed() || start.dead())
    return "the grammar is too ambiguous at its start (over " + std::to_string(GrammarState::kMaxStacks) + " parses)";
  return "";
}

}  // namespace troupe
