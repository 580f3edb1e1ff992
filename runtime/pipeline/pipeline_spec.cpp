#include "runtime/pipeline/pipeline_spec.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <set>

namespace troupe {
namespace {

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

Result<std::vector<std::string>> template_refs(const std::string& t) {
  std::vector<std::string> out;
  for (size_t i = 0; (i = t.find("{{", i)) != std::string::npos;) {
    const size_t e = t.find("}}", i + 2);
    if (e == std::string::npos) return make_error("an unclosed '{{' at byte " + std::to_string(i));
    const std::string name = trim(t.substr(i + 2, e - i - 2));
    const size_t dot = name.find('.');
    const bool ok = dot == std::string::npos ? valid_name(name)
                                             : name.substr(0, dot) == "input" && valid_name(name.substr(dot + 1));
    if (!ok) return make_error("'{{" + t.substr(i + 2, std::min<size_t>(e - i - 2, 40)) + "}}' is not a reference");
    out.push_back(name);
    i = e + 2;
  }
  return out;
}

Result<std::string> render_template(const std::string& t,
                                    const std::function<const std::string*(const std::string&)>& lookup) {
  std::string out;
  size_t at = 0;
  for (size_t i = 0; (i = t.find("{{", at)) != std::string::npos;) {
    const size_t e = t.find("}}", i + 2);
    if (e == std::string::npos) return make_error("an unclosed '{{'");
    out.append(t, at, i - at);
    const std::string name = trim(t.substr(i + 2, e - i - 2));
    const std::string* v = lookup(name);
    if (!v) return make_error("'{{" + name + "}}' has no value");
    out += *v;
    at = e + 2;
  }
  out.append(t, at, std::string::npos);
  return out;
}

Result<PipelineSpec> parse_pipeline(const nlohmann::json& j, const PipelineLimits& lim) {
  using nlohmann::json;
  if (!j.is_object()) return make_error("a pipeline spec is a JSON object");
  PipelineSpec spec;
  if (!j.contains("name") || !j["name"].is_string() || !valid_name(j["name"].get<std::string>()))
    return make_error("'name' must be 1-64 letters, digits, '_' or '-'");
  spec.name = j["name"].get<std::string>();
  if (!j.contains("nodes") || !j["nodes"].is_array() || j["nodes"].empty())
    return make_error("'nodes' must be a non-empty array");
  if (j["nodes"].size() > static_cast<size_t>(lim.max_nodes))
    return make_error("the spec has " + std::to_string(j["nodes"].size()) + " nodes (limit " +
                      std::to_string(lim.max_nodes) + ")");
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "nodes" && k != "budget_tokens" && k != "output" && k != "description")
      return make_error("unknown field '" + k + "'");
  spec.budget_tokens = lim.max_budget_tokens;
  if (j.contains("budget_tokens")) {
    if (!j["budget_tokens"].is_number_integer() || j["budget_tokens"].get<int64_t>() < 1 ||
        j["budget_tokens"].get<int64_t>() > lim.max_budget_tokens)
      return make_error("'budget_tokens' must be 1.." + std::to_string(lim.max_budget_tokens));
    spec.budget_tokens = j["budget_tokens"].get<int64_t>();
  }
  std::vector<PipelineNode> nodes;
  std::map<std::string, size_t> index;
  std::set<std::string> inputs;
  for (size_t i = 0; i < j["nodes"].size(); ++i) {
    const json& n = j["nodes"][i];
    const std::string where = "node " + std::to_string(i);
    if (!n.is_object()) return make_error(where + ": must be an object");
    if (!n.contains("id") || !n["id"].is_string() || !valid_name(n["id"].get<std::string>()) ||
        n["id"].get<std::string>() == "input" || n["id"].get<std::string>() == "item")
      return make_error(where + ": 'id' must be 1-64 letters, digits, '_' or '-' (not 'input' or 'item')");
    PipelineNode x;
    x.id = n["id"].get<std::string>();
    const std::string at = "node '" + x.id + "'";
    if (index.count(x.id)) return make_error(at + ": the id is used twice");
    if (!n.contains("type") || !n["type"].is_string()) return make_error(at + ": 'type' must be a string");
    const std::string type = n["type"].get<std::string>();
    static const std::map<std::string, PipelineNodeKind> kinds = {{"generate", PipelineNodeKind::Generate},
                                                                  {"fork", PipelineNodeKind::Fork},
                                                                  {"join", PipelineNodeKind::Join},
                                                                  {"map", PipelineNodeKind::Map},
                                                                  {"tool", PipelineNodeKind::Tool}};
    auto kt = kinds.find(type);
    if (kt == kinds.end())
      return make_error(at + ": unknown type '" + type + "' (known: generate, fork, join, map, tool" +
                        (type == "loop" ? "; loop nodes are not built yet)" : ")"));
    x.kind = kt->second;
    // The fields each kind takes; anything else is refused (a typo would otherwise be ignored).
    std::set<std::string> allowed = {"id", "type"};
    const bool generates =
        x.kind == PipelineNodeKind::Generate || x.kind == PipelineNodeKind::Fork || x.kind == PipelineNodeKind::Map;
    if (generates) allowed.insert({"prompt", "max_tokens", "temperature", "top_p", "seed", "stop"});
    if (x.kind == PipelineNodeKind::Fork) allowed.insert("n");
    if (x.kind == PipelineNodeKind::Map) allowed.insert("over");
    if (x.kind == PipelineNodeKind::Join) allowed.insert({"from", "mode"});
    if (x.kind == PipelineNodeKind::Tool) allowed.insert({"tool", "input", "pattern"});
    for (const auto& [k, v] : n.items())
      if (!allowed.count(k)) return make_error(at + ": unknown field '" + k + "' for a " + type + " node");
    auto str = [&](const char* k, std::string& out, bool required) -> Status {
      if (!n.contains(k)) return required ? make_error(at + ": '" + k + "' is required") : Status{};
      if (!n[k].is_string()) return make_error(at + ": '" + std::string(k) + "' must be a string");
      out = n[k].get<std::string>();
      if (out.size() > lim.max_template_bytes)
        return make_error(at + ": '" + std::string(k) + "' is over " + std::to_string(lim.max_template_bytes) +
                          " bytes");
      return {};
    };
    if (generates) {
      TROUPE_TRY(str("prompt", x.prompt, true));
      if (n.contains("max_tokens")) {
        if (!n["max_tokens"].is_number_integer() || n["max_tokens"].get<int64_t>() < 1 ||
            n["max_tokens"].get<int64_t>() > lim.max_tokens_per_node)
          return make_error(at + ": 'max_tokens' must be 1.." + std::to_string(lim.max_tokens_per_node));
        x.max_tokens = n["max_tokens"].get<int32_t>();
      }
      if (n.contains("temperature")) {
        if (!n["temperature"].is_number() || !(n["temperature"].get<double>() >= 0) ||
            n["temperature"].get<double>() > 2)
          return make_error(at + ": 'temperature' must be 0..2");
        x.temperature = n["temperature"].get<double>();
      }
      if (n.contains("top_p")) {
        if (!n["top_p"].is_number() || !(n["top_p"].get<double>() > 0) || n["top_p"].get<double>() > 1)
          return make_error(at + ": 'top_p' must be in (0, 1]");
        x.top_p = n["top_p"].get<double>();
      }
      if (n.contains("seed")) {
        if (!n["seed"].is_number_integer()) return make_error(at + ": 'seed' must be an integer");
        x.seed = n["seed"].get<int64_t>();
      }
      if (n.contains("stop")) {
        const json& s = n["stop"];
        if (!s.is_array() || s.size() > 4) return make_error(at + ": 'stop' must be an array of at most 4 strings");
        for (const auto& v : s) {
          if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 64)
            return make_error(at + ": each 'stop' must be a string of 1-64 bytes");
          x.stop.push_back(v.get<std::string>());
        }
      }
    }
    if (x.kind == PipelineNodeKind::Fork) {
      if (!n.contains("n") || !n["n"].is_number_integer() || n["n"].get<int64_t>() < 1 ||
          n["n"].get<int64_t>() > lim.max_fanout)
        return make_error(at + ": 'n' must be 1.." + std::to_string(lim.max_fanout) + " (the server's fan-out limit)");
      x.n = n["n"].get<int32_t>();
    }
    if (x.kind == PipelineNodeKind::Map) TROUPE_TRY(str("over", x.over, true));
    if (x.kind == PipelineNodeKind::Join) {
      TROUPE_TRY(str("from", x.from, true));
      x.mode = "concat";
      TROUPE_TRY(str("mode", x.mode, false));
      if (x.mode != "concat" && x.mode != "vote" && x.mode != "first")
        return make_error(at + ": 'mode' must be concat, vote or first");
    }
    if (x.kind == PipelineNodeKind::Tool) {
      TROUPE_TRY(str("tool", x.tool, true));
      TROUPE_TRY(str("input", x.input, true));
      TROUPE_TRY(str("pattern", x.pattern, false));
      if (x.tool != "calculator" && x.tool != "regex_extract" && x.tool != "json_extract")
        return make_error(at + ": tool '" + x.tool +
                          "' is not allowed (allowed: calculator, regex_extract, "
                          "json_extract)");
      if (x.tool != "calculator" && x.pattern.empty())
        return make_error(at + ": tool '" + x.tool + "' needs a 'pattern'");
    }
    // What it reads: template references and named nodes.
    auto add_dep = [&](const std::string& d) {
      if (std::find(x.deps.begin(), x.deps.end(), d) == x.deps.end()) x.deps.push_back(d);
    };
    for (const std::string* t : {&x.prompt, &x.input}) {
      auto refs = template_refs(*t);
      if (!refs) return make_error(at + ": " + refs.error().message);
      for (const std::string& r : *refs) {
        if (r.rfind("input.", 0) == 0) {
          inputs.insert(r.substr(6));
        } else if (r == "item") {
          if (x.kind != PipelineNodeKind::Map) return make_error(at + ": '{{item}}' is only known inside a map");
        } else {
          add_dep(r);
        }
      }
    }
    if (!x.from.empty()) add_dep(x.from);
    if (!x.over.empty()) add_dep(x.over);
    index[x.id] = nodes.size();
    nodes.push_back(std::move(x));
  }
  for (const PipelineNode& x : nodes)
    for (const std::string& d : x.deps) {
      if (!index.count(d)) return make_error("node '" + x.id + "': references '" + d + "', which is no node");
      if (d == x.id) return make_error("node '" + x.id + "': reads its own output (a cycle)");
    }
  // Order: every node after what it reads (Kahn, ties in spec order); what is left is a cycle.
  std::vector<int> pending(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) pending[i] = static_cast<int>(nodes[i].deps.size());
  std::vector<bool> placed(nodes.size(), false);
  for (size_t done = 0; done < nodes.size();) {
    size_t pick = nodes.size();
    for (size_t i = 0; i < nodes.size() && pick == nodes.size(); ++i)
      if (!placed[i] && pending[i] == 0) pick = i;
    if (pick == nodes.size()) {
      size_t i = 0;
      while (placed[i]) ++i;  // (one is unplaced: done < size)
      return make_error("node '" + nodes[i].id + "': is on a cycle (only a loop node may repeat)");
    }
    placed[pick] = true;
    ++done;
    spec.nodes.push_back(nodes[pick]);
    for (size_t i = 0; i < nodes.size(); ++i)
      for (const std::string& d : nodes[i].deps)
        if (d == nodes[pick].id) --pending[i];
  }
  spec.inputs.assign(inputs.begin(), inputs.end());
  spec.output = spec.nodes.back().id;
  if (j.contains("output")) {
    if (!j["output"].is_string() || !index.count(j["output"].get<std::string>()))
      return make_error("'output' must name a node");
    spec.output = j["output"].get<std::string>();
  }
  return spec;
}

}  // namespace troupe
