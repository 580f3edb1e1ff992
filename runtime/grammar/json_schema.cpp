// json_schema_to_gbnf of runtime/grammar/json_schema.h: one rule per subschema (named by
// its place, shared when two bodies are equal), primitives written once.
#include "runtime/grammar/json_schema.h"

#include <cctype>
#include <map>
#include <set>

namespace troupe {
namespace {

using ojson = nlohmann::ordered_json;

// Bounded whitespace between tokens (as llama.cpp's converter writes it).
constexpr const char* kPrimitives[][2] = {
    {"ws", R"(| " " | "\n" [ \t]{0,20})"},
    {"char", R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))"},
    {"string", R"("\"" char* "\"")"},
    {"integer", R"("-"? ("0" | [1-9] [0-9]{0,15}))"},
    {"uinteger", R"(("0" | [1-9] [0-9]{0,15}))"},
    {"number", R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?)"},
    {"boolean", R"("true" | "false")"},
    {"null", R"("null")"},
    {"value", R"(object | array | string | number | boolean | null)"},
    {"object", R"("{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}")"},
    {"array", R"("[" ws ( value ( ws "," ws value )* )? ws "]")"},
    {"date", R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))"},
    {"time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
    {"uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
};
// What each primitive uses, so that only what is needed is written.
const std::map<std::string, std::vector<std::string>> kUses = {
    {"string", {"char"}},
    {"value", {"object", "array", "string", "number", "boolean", "null"}},
    {"object", {"ws", "string", "value"}},
    {"array", {"ws", "value"}},
};

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   "$defs",    "definitions"};

class SchemaWriter {
 public:
  SchemaWriter(const ojson& root, const SchemaLimits& lim, std::string root_name)
      : root_(root), lim_(lim), root_name_(std::move(root_name)) {}

  Result<std::string> run() {
    std::string body = visit(root_, "#", 0);
    if (!err_.empty()) return make_error(err_);
    std::string out = root_name_ + " ::= " + body + "\n";
    for (const auto& [name, text] : rules_) out += name + " ::= " + text + "\n";
    std::set<std::string> done;
    std::vector<std::string> todo(used_.begin(), used_.end());
    while (!todo.empty()) {
      const std::string p = todo.back();
      todo.pop_back();
      if (!done.insert(p).second) continue;
      for (const auto& prim : kPrimitives)
        if (p == prim[0]) out += p + " ::= " + prim[1] + "\n";
      if (auto it = kUses.find(p); it != kUses.end()) todo.insert(todo.end(), it->second.begin(), it->second.end());
    }
    if (out.size() > lim_.max_grammar_bytes)
      return make_error("json_schema: the schema's grammar is over " + std::to_string(lim_.max_grammar_bytes) +
                        " bytes");
    return out;
  }

 private:
  std::string fail(const std::string& where, const std::string& what) {
    if (err_.empty()) err_ = "json_schema: " + what + (where == "#" ? "" : " (at " + where + ")");
    return "null";
  }
  std::string use(const std::string& prim) {
    used_.insert(prim);
    return prim;
  }
  // A rule for the body, shared with an equal body written before.
  std::string rule(const std::string& hint, const std::string& body) {
    if (auto it = by_body_.find(body); it != by_body_.end()) return it->second;
    std::string name;
    for (char c : hint.substr(hint.size() > 40 ? hint.size() - 40 : 0))
      name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    name = "s-" + name + "-" + std::to_string(rules_.size());
    rules_.emplace_back(name, body);
    by_body_.emplace(body, name);
    return name;
  }
  int32_t length(const ojson& s, const char* key, const std::string& where, int32_t dflt) {
    if (!s.contains(key)) return dflt;
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > lim_.max_length) {
      fail(where, std::string("'") + key + "' must be an integer in [0, " + std::to_string(lim_.max_length) + "]");
      return dflt;
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }
  static std::string repeat(const std::string& x, int32_t lo, int32_t hi) {  // hi -1: unbounded
    if (hi == -1) return lo == 0 ? x + "*" : lo == 1 ? x + "+" : x + "{" + std::to_string(lo) + ",}";
    if (lo == hi) return x + "{" + std::to_string(lo) + "}";
    return x + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  std::string visit(const ojson& s, const std::string& where, int depth) {
    if (!err_.empty()) return "null";
    if (depth > lim_.max_depth) return fail(where, "nested deeper than " + std::to_string(lim_.max_depth) + " levels");
    if (s.is_boolean()) return s.get<bool>() ? use("value") : fail(where, "the schema 'false' matches nothing");
    if (!s.is_object()) return fail(where, "a schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      static const std::set<std::string> known = {
          "type",   "enum",     "const",    "properties", "required",  "additionalProperties",
          "items",  "minItems", "maxItems", "minLength",  "maxLength", "pattern",
          "format", "anyOf",    "oneOf",    "allOf",      "$ref",      "minimum"};
      if (!known.count(k) && !kAnnotations.count(k)) return fail(where, "unsupported keyword '" + k + "'");
    }
    if (s.contains("$ref")) return ref(s["$ref"], where, depth);
    if (s.contains("const")) return gbnf_literal(s["const"].dump());
    if (s.contains("enum")) {
      const ojson& e = s["enum"];
      if (!e.is_array() || e.empty()) return fail(where, "'enum' must be a non-empty array");
      if (e.size() > lim_.max_enum) return fail(where, "'enum' has over " + std::to_string(lim_.max_enum) + " values");
      std::string body;
      for (const auto& v : e) body += (body.empty() ? "" : " | ") + gbnf_literal(v.dump());
      return rule(where, body);
    }
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) {
        const ojson& a = s[k];
        if (!a.is_array() || a.empty()) return fail(where, std::string("'") + k + "' must be a non-empty array");
        std::string body;
        for (size_t i = 0; i < a.size(); ++i)
          body += (body.empty() ? "" : " | ") + visit(a[i], where + "/" + k + "/" + std::to_string(i), depth + 1);
        return rule(where, body);
      }
    if (s.contains("allOf")) {
      const ojson& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) return fail(where, "'allOf' is supported with exactly one schema");
      return visit(a[0], where + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const auto& x : t) {
          if (!x.is_string()) return fail(where, "'type' must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return fail(where, "'type' must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
      types.push_back("string");
    } else {
      return use("value");
    }
    std::string body;
    for (const auto& t : types) body += (body.empty() ? "" : " | ") + typed(s, t, where, depth);
    return types.size() == 1 ? body : rule(where, body);
  }

  std::string ref(const ojson& r, const std::string& where, int depth) {
    if (!r.is_string()) return fail(where, "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return it->second;
    if (target == "#") {
      refs_[target] = root_name_;
      return root_name_;
    }
    if (target.rfind("#/$defs/", 0) != 0 && target.rfind("#/definitions/", 0) != 0)
      return fail(where,
                  "'$ref' must be '#', '#/$defs/...' or '#/definitions/...', got '" + target.substr(0, 100) + "'");
    const ojson* node = nullptr;
    try {
      node = &root_.at(ojson::json_pointer(target.substr(1)));
    } catch (const ojson::exception&) {
      return fail(where, "'$ref' '" + target.substr(0, 100) + "' names no definition");
    }
    // Named before it is visited, so that a recursive definition refers to itself.
    std::string name;
    for (char c : target.substr(target.rfind('/') + 1)) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    name = "ref-" + name + "-" + std::to_string(refs_.size());
    refs_[target] = name;
    const std::string body = visit(*node, target, depth + 1);
    rules_.emplace_back(name, body);
    return name;
  }

  std::string typed(const ojson& s, const std::string& t, const std::string& where, int depth) {
    if (t == "null") return use("null");
    if (t == "boolean") return use("boolean");
    if (t == "number") return use("number");
    if (t == "integer") {
      if (s.contains("minimum")) {
        const ojson& m = s["minimum"];
        if (!m.is_number() || m.get<double>() < 0 || m.get<double>() > 0)
          return fail(where, "'minimum' is supported only as 0 (on integers)");
        return use("uinteger");
      }
      return use("integer");
    }
    if (s.contains("minimum")) return fail(where, "'minimum' is supported only as 0 (on integers)");
    if (t == "string") return string(s, where);
    if (t == "array") return array(s, where, depth);
    if (t == "object") return object(s, where, depth);
    return fail(where, "unknown type '" + t.substr(0, 40) + "'");
  }

  std::string string(const ojson& s, const std::string& where) {
    const int32_t lo = length(s, "minLength", where, 0);
    const int32_t hi = length(s, "maxLength", where, -1);
    if (hi >= 0 && hi < lo) return fail(where, "'maxLength' is below 'minLength'");
    const bool sized = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("pattern")) {
      if (sized || s.contains("format")) return fail(where, "'pattern' cannot be combined with lengths or 'format'");
      if (!s["pattern"].is_string()) return fail(where, "'pattern' must be a string");
      auto body = regex_to_gbnf_body(s["pattern"].get<std::string>(), true, true, lim_.max_length);
      if (!body) return fail(where, "'pattern': " + body.error().message);
      return rule(where, "\"\\\"\" " + *body + " \"\\\"\"");
    }
    if (s.contains("format")) {
      if (sized) return fail(where, "'format' cannot be combined with lengths");
      const ojson& f = s["format"];
      const std::string fmt = f.is_string() ? f.get<std::string>() : "";
      std::string inner;
      if (fmt == "date" || fmt == "time" || fmt == "uuid")
        inner = use(fmt);
      else if (fmt == "date-time")
        inner = use("date") + " \"T\" " + use("time");
      else
        return fail(where, "unsupported format '" + fmt.substr(0, 40) + "' (date, time, date-time and uuid are)");
      return rule(where, "\"\\\"\" " + inner + " \"\\\"\"");
    }
    if (!sized) return use("string");
    return rule(where, "\"\\\"\" " + repeat(use("char"), lo, hi) + " \"\\\"\"");
  }

  std::string array(const ojson& s, const std::string& where, int depth) {
    const int32_t lo = length(s, "minItems", where, 0);
    const int32_t hi = length(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) return fail(where, "'maxItems' is below 'minItems'");
    const std::string item = s.contains("items") ? visit(s["items"], where + "/items", depth + 1) : use("value");
    use("ws");
    if (hi == 0) return rule(where, "\"[\" ws \"]\"");
    const std::string more = repeat("( ws \",\" ws " + item + " )", std::max(lo - 1, 0), hi < 0 ? -1 : hi - 1);
    std::string inner = item + " " + more;
    if (lo == 0) inner = "( " + inner + " )?";
    return rule(where, "\"[\" ws " + inner + " ws \"]\"");
  }

  std::string object(const ojson& s, const std::string& where, int depth) {
    use("ws");
    struct Prop {
      std::string name, key, value;  // the name, its key as a GBNF literal, the value's rule
    };
    std::vector<Prop> props;
    std::set<std::string> names;
    if (s.contains("properties")) {
      const ojson& p = s["properties"];
      if (!p.is_object()) return fail(where, "'properties' must be an object");
      if (p.size() > lim_.max_properties)
        return fail(where, "over " + std::to_string(lim_.max_properties) + " properties");
      for (const auto& [k, v] : p.items()) {
        props.push_back({k, gbnf_literal(ojson(k).dump()), visit(v, where + "/properties/" + k, depth + 1)});
        names.insert(k);
      }
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const ojson& r = s["required"];
      if (!r.is_array()) return fail(where, "'required' must be an array");
      for (const auto& x : r) {
        if (!x.is_string()) return fail(where, "'required' must list strings");
        if (!names.count(x.get<std::string>()))
          return fail(where, "required property '" + x.get<std::string>().substr(0, 60) + "' is not in 'properties'");
        required.insert(x.get<std::string>());
      }
    }
    std::string extra;  // a rule for one additional key: value, or none
    if (s.contains("additionalProperties")) {
      const ojson& a = s["additionalProperties"];
      if (a.is_boolean()) {
        if (a.get<bool>()) extra = rule(where + "/additional", use("string") + " ws \":\" ws " + use("value"));
      } else {
        extra = rule(where + "/additional",
                     use("string") + " ws \":\" ws " + visit(a, where + "/additionalProperties", depth + 1));
      }
    }
    if (!err_.empty()) return "null";
    // S_i: properties i.. with none written yet; T_i: the same after at least one.
    std::string s_next = extra.empty() ? "\"\"" : "( " + extra + " ( ws \",\" ws " + extra + " )* )?";
    std::string t_next = extra.empty() ? "\"\"" : "( ws \",\" ws " + extra + " )*";
    size_t i = props.size();
    for (auto it = props.rbegin(); it != props.rend(); ++it) {
      --i;
      const std::string kv = it->key + " ws \":\" ws " + it->value;
      const bool req = required.count(it->name) > 0;
      const std::string t = rule(where + "/t" + std::to_string(i),
                                 req ? "ws \",\" ws " + kv + " " + t_next : "( ws \",\" ws " + kv + " )? " + t_next);
      const std::string sv =
          rule(where + "/s" + std::to_string(i), req ? kv + " " + t_next : kv + " " + t_next + " | " + s_next);
      t_next = t;
      s_next = sv;
    }
    return rule(where, "\"{\" ws " + s_next + " ws \"}\"");
  }

  const ojson& root_;
  SchemaLimits lim_;
  std::string root_name_;
  std::string err_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> by_body_;
  std::map<std::string, std::string> refs_;
  std::set<std::string> used_;
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaLimits& lim,
                                        const std::string& root_name) {
  return SchemaWriter(schema, lim, root_name).run();
}

}  // namespace troupe
