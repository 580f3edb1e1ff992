#include "runtime/pipeline/pipeline_runner.h"

#include <algorithm>
#include <cctype>

#include "runtime/pipeline/tools.h"

namespace troupe {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "\n" : "") + v[i];
  return s;
}

std::string normalized(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  std::string t = s.substr(b, s.find_last_not_of(" \t\r\n.") - b + 1);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

// A map's items: the node's list when it has several, else its text as a JSON array of
// strings or, failing that, its non-empty lines.
std::vector<std::string> items_of(const std::vector<std::string>& v) {
  if (v.size() != 1) return v;
  auto j = nlohmann::json::parse(v[0], nullptr, false);
  if (!j.is_discarded() && j.is_array()) {
    std::vector<std::string> out;
    for (const auto& x : j) out.push_back(x.is_string() ? x.get<std::string>() : x.dump());
    return out;
  }
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= v[0].size()) {
    size_t e = v[0].find('\n', at);
    if (e == std::string::npos) e = v[0].size();
    const std::string line = v[0].substr(at, e - at);
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
    at = e + 1;
  }
  return out;
}

}  // namespace

std::string majority_vote(const std::vector<std::string>& answers) {
  std::string best;
  size_t best_count = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const std::string k = normalized(answers[i]);
    size_t c = 0;
    for (const auto& a : answers) c += normalized(a) == k ? 1 : 0;
    if (c > best_count) {
      best_count = c;
      best = answers[i];
    }
  }
  return best;
}

Result<PipelineRun> run_pipeline(const PipelineSpec& spec, const std::map<std::string, std::string>& inputs,
                                 const GenerateFn& generate, const PipelineEventFn& on_event,
                                 const PipelineLimits& limits) {
  auto emit = [&](nlohmann::json e) {
    if (on_event) on_event(e);
  };
  PipelineRun run;
  auto fail = [&](const std::string& node, const std::string& type, const std::string& msg) -> Result<PipelineRun> {
    emit({{"event", "error"}, {"node", node}, {"type", type}, {"message", msg}});
    return make_error("node '" + node + "': " + msg);
  };
  for (const std::string& k : spec.inputs)
    if (!inputs.count(k)) {
      emit({{"event", "error"}, {"node", ""}, {"type", "missing_input"}, {"message", "input '" + k + "' is missing"}});
      return make_error("input '" + k + "' is missing (the spec's templates use {{input." + k + "}})");
    }
  std::map<std::string, std::string> text;  // each finished node's output, joined
  const std::string* item = nullptr;
  auto lookup = [&](const std::string& name) -> const std::string* {
    if (name == "item") return item;
    if (name.rfind("input.", 0) == 0) {
      auto it = inputs.find(name.substr(6));
      return it == inputs.end() ? nullptr : &it->second;
    }
    auto it = text.find(name);
    return it == text.end() ? nullptr : &it->second;
  };
  auto call = [&](const PipelineNode& x, const std::string& prompt, int32_t n) -> Result<GenerateResult> {
    const int64_t left = spec.budget_tokens - run.completion_tokens;
    if (left < n) return make_error("the run's token budget of " + std::to_string(spec.budget_tokens) + " is spent");
    GenerateCall c;
    c.node = x.id;
    c.prompt = prompt;
    c.n = n;
    c.max_tokens = static_cast<int32_t>(std::min<int64_t>(x.max_tokens, left / n));
    c.temperature = x.temperature;
    c.top_p = x.top_p;
    c.seed = x.seed;
    c.stop = x.stop;
    ++run.generate_calls;
    auto r = generate(c);
    if (!r) return r;
    if (r->texts.size() != static_cast<size_t>(n))
      return make_error("the generator returned " + std::to_string(r->texts.size()) + " of " + std::to_string(n) +
                        " texts");
    run.prompt_tokens += r->prompt_tokens;
    run.completion_tokens += r->completion_tokens;
    return r;
  };
  for (const PipelineNode& x : spec.nodes) {
    emit({{"event", "node_started"}, {"node", x.id}});
    std::vector<std::string> out;
    switch (x.kind) {
      case PipelineNodeKind::Generate:
      case PipelineNodeKind::Fork: {
        auto p = render_template(x.prompt, lookup);
        if (!p) return fail(x.id, "template", p.error().message);
        auto r = call(x, *p, x.kind == PipelineNodeKind::Fork ? x.n : 1);
        if (!r) return fail(x.id, "generate", r.error().message);
        out = std::move(r->texts);
        break;
      }
      case PipelineNodeKind::Map: {
        const auto items = items_of(run.outputs.at(x.over));
        if (items.size() > static_cast<size_t>(limits.max_fanout))
          return fail(x.id, "fanout",
                      "'" + x.over + "' gives " + std::to_string(items.size()) + " items (limit " +
                          std::to_string(limits.max_fanout) + ")");
        for (const std::string& it : items) {
          item = &it;
          auto p = render_template(x.prompt, lookup);
          item = nullptr;
          if (!p) return fail(x.id, "template", p.error().message);
          auto r = call(x, *p, 1);
          if (!r) return fail(x.id, "generate", r.error().message);
          out.push_back(std::move(r->texts[0]));
        }
        break;
      }
      case PipelineNodeKind::Join: {
        const auto& from = run.outputs.at(x.from);
        if (x.mode == "vote")
          out = {majority_vote(from)};
        else if (x.mode == "first")
          out = {from.empty() ? std::string() : from[0]};
        else
          out = {joined(from)};
        break;
      }
      case PipelineNodeKind::Tool: {
        auto in = render_template(x.input, lookup);
        if (!in) return fail(x.id, "template", in.error().message);
        emit({{"event", "tool_call"}, {"node", x.id}, {"tool", x.tool}, {"input", in->substr(0, 1024)}});
        auto r = run_tool(x.tool, *in, x.pattern);
        if (!r) return fail(x.id, "tool", x.tool + ": " + r.error().message);
        emit({{"event", "tool_result"}, {"node", x.id}, {"tool", x.tool}, {"output", *r}});
        out = {std::move(*r)};
        break;
      }
    }
    text[x.id] = joined(out);
    emit({{"event", "node_finished"}, {"node", x.id}, {"output", out}});
    run.outputs[x.id] = std::move(out);
  }
  run.output = text.at(spec.output);
  emit({{"event", "finished"}, {"output", run.output}, {"completion_tokens", run.completion_tokens}});
  return run;
}

}  // namespace troupe
