#include "runtime/chat/tool_calls.h"

#include <algorithm>

#include "runtime/grammar/json_schema.h"

namespace troupe {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";
constexpr const char* kMarkers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool offered(const std::vector<ToolFunction>& tools, const std::string& name) {
  return std::any_of(tools.begin(), tools.end(), [&](const ToolFunction& f) { return f.name == name; });
}

// One call object: {"name": ..., "arguments" | "parameters": {...} or a JSON string}.
bool call_of(const ojson& j, const std::vector<ToolFunction>& tools, std::vector<ToolCall>& out) {
  if (!j.is_object()) return false;
  const auto n = j.find("name");
  if (n == j.end() || !n->is_string() || !offered(tools, n->get<std::string>())) return false;
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  std::string args = "{}";
  if (a != j.end()) {
    if (a->is_string()) {
      if (!ojson::accept(a->get<std::string>())) return false;
      args = a->get<std::string>();
    } else {
      args = a->dump();
    }
  }
  out.push_back({"", n->get<std::string>(), args});
  return true;
}

// A call object or a list of them.
bool calls_of(const std::string& text, const std::vector<ToolFunction>& tools, std::vector<ToolCall>& out) {
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const ojson::exception&) { return false; }
  if (j.is_array()) {
    if (j.empty()) return false;
    for (const auto& c : j)
      if (!call_of(c, tools, out)) return false;
    return true;
  }
  return call_of(j, tools, out);
}

}  // namespace

std::string tools_system_prompt(const std::vector<ToolFunction>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& f : tools) {
    ojson fn = {{"name", f.name}};
    if (!f.description.empty()) fn["description"] = f.description;
    fn["parameters"] = f.parameters;
    out += "\n" + ojson{{"type", "function"}, {"function", fn}}.dump();
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>";
  return out;
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  std::string out;
  for (const auto& c : calls) {
    ojson args;
    try {
      args = ojson::parse(c.arguments);
    } catch (const ojson::exception&) { args = c.arguments; }  // as given, a string
    if (!out.empty()) out += "\n";
    out += std::string(kOpen) + "\n" + ojson{{"name", c.name}, {"arguments", args}}.dump() + "\n" + kClose;
  }
  return out;
}

std::string render_tool_response(const std::string& content) {
  return "<tool_response>\n" + content + "\n</tool_response>";
}

Result<std::string> tool_call_grammar(const std::vector<ToolFunction>& tools, const ToolChoice& choice, bool parallel) {
  ojson any_of = ojson::array();
  ojson defs = ojson::object();
  for (const auto& f : tools) {
    if (choice.kind == ToolChoice::Kind::Named && f.name != choice.name) continue;
    ojson params = f.parameters;
    // Definitions move to the top, where the combined schema's $refs resolve.
    for (const char* key : {"$defs", "definitions"})
      if (params.is_object() && params.contains(key)) {
        for (const auto& [k, v] : params[key].items()) {
          if (defs.contains(k)) return make_error("tools: two functions define '" + k + "'");
          defs[k] = v;
        }
        params.erase(key);
      }
    any_of.push_back({{"type", "object"},
                      {"properties", {{"name", {{"const", f.name}}}, {"arguments", params}}},
                      {"required", {"name", "arguments"}},
                      {"additionalProperties", false}});
  }
  if (any_of.empty()) return make_error("tool_choice names a function that is not in 'tools'");
  ojson schema = any_of.size() == 1 ? any_of[0] : ojson{{"anyOf", any_of}};
  if (!defs.empty()) {
    schema["$defs"] = defs;
    schema["definitions"] = defs;
  }
  auto call = json_schema_to_gbnf(schema, {}, "tool-call");
  if (!call) return make_error("tools: " + call.error().message);
  std::string g = *call;
  const std::string block =
      gbnf_literal(std::string(kOpen) + "\n") + " tool-call " + gbnf_literal(std::string("\n") + kClose);
  const bool many = parallel && choice.kind != ToolChoice::Kind::Named;
  g += "root ::= " + block + (many ? " ( \"\\n\" " + block + " )*" : "") + "\n";
  return g;
}

ParsedToolCalls parse_tool_calls(const std::string& text, const std::vector<ToolFunction>& tools) {
  ParsedToolCalls none{text, {}};
  std::vector<ToolCall> calls;
  if (const size_t at = text.find(kOpen); at != std::string::npos) {  // Hermes / Qwen2.5 / SmolLM2
    size_t pos = at;
    while (pos != std::string::npos) {
      const size_t body = pos + std::string(kOpen).size();
      const size_t end = text.find(kClose, body);
      const std::string inner = text.substr(body, end == std::string::npos ? std::string::npos : end - body);
      if (!calls_of(trim(inner), tools, calls)) return none;
      if (end == std::string::npos) break;
      pos = text.find(kOpen, end);
      // only whitespace may stand between blocks
      const std::string gap =
          text.substr(end + std::string(kClose).size(),
                      pos == std::string::npos ? std::string::npos : pos - end - std::string(kClose).size());
      if (!trim(gap).empty()) return none;
    }
    return {trim(text.substr(0, at)), std::move(calls)};
  }
  if (const size_t at = text.find("[TOOL_CALLS]"); at != std::string::npos) {  // Mistral
    if (!calls_of(trim(text.substr(at + 12)), tools, calls)) return none;
    return {trim(text.substr(0, at)), std::move(calls)};
  }
  if (const size_t at = text.find("<|python_tag|>"); at != std::string::npos) {  // Llama 3.x
    std::string rest = text.substr(at + 14);
    size_t start = 0;
    for (;;) {  // calls separated by ';'
      const size_t semi = rest.find(';', start);
      const std::string one = trim(rest.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
      if (!one.empty() && !calls_of(one, tools, calls)) return none;
      if (semi == std::string::npos) break;
      start = semi + 1;
    }
    if (calls.empty()) return none;
    return {trim(text.substr(0, at)), std::move(calls)};
  }
  const std::string t = trim(text);  // Llama 3.x JSON: the whole answer is one call object
  if (!t.empty() && t.front() == '{' && calls_of(t, tools, calls)) return {"", std::move(calls)};
  return none;
}

size_t tool_content_prefix(const std::string& text) {
  if (const size_t b = text.find_first_not_of(" \t\r\n"); b != std::string::npos && text[b] == '{')
    return 0;  // maybe Llama 3.x's bare JSON call: held until the answer ends
  size_t cut = text.size();
  for (const char* m : kMarkers) {
    const std::string mk = m;
    if (const size_t at = text.find(mk); at != std::string::npos) cut = std::min(cut, at);
    // a tail that could become the marker
    for (size_t k = std::min(mk.size() - 1, text.size()); k > 0; --k)
      if (text.compare(text.size() - k, k, mk, 0, k) == 0) {
        cut = std::min(cut, text.size() - k);
        break;
      }
  }
  return cut;
}

}  // namespace troupe
