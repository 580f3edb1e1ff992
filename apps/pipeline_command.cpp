// `troupe pipeline run SPEC.json` / `troupe pipeline check SPEC.json`: agent pipelines
// (docs/pipelines.md) on the local engine. Each generate call renders its prompt as one
// user message through the model's chat template and runs through the node of actors
// `troupe serve` builds; a fork's branches share the prompt's KV through the prefix cache.
// Events are printed as JSON lines on stdout (--events) and the run's output last.
#include <spdlog/spdlog.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/local_engine.h"
#include "apps/subcommands.h"
#include "runtime/chat/chat_template.h"
#include "runtime/pipeline/pipeline_runner.h"

namespace troupe::app {
namespace {

struct PipelineFlags {
  ModelFlags model;
  std::string spec;
  std::vector<std::string> inputs;  // KEY=VALUE
  bool events = false;
};

Result<PipelineSpec> load_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().size() > (1u << 20)) return make_error("'" + path + "' is over 1 MiB");
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return make_error("'" + path + "' is not valid JSON");
  auto s = parse_pipeline(j);
  if (!s) return make_error(path + ": " + s.error().message);
  return s;
}

int check(const PipelineFlags& f) {
  auto s = load_spec(f.spec);
  if (!s) {
    spdlog::error("{}", s.error().message);
    return 2;
  }
  std::cout << "pipeline '" << s->name << "': " << s->nodes.size() << " nodes, in order:";
  for (const auto& n : s->nodes) std::cout << " " << n.id;
  std::cout << "; inputs:";
  for (const auto& k : s->inputs) std::cout << " " << k;
  std::cout << "; output " << s->output << "\n";
  return 0;
}

int run(const PipelineFlags& f) {
  auto s = load_spec(f.spec);
  if (!s) {
    spdlog::error("{}", s.error().message);
    return 2;
  }
  std::map<std::string, std::string> inputs;
  for (const std::string& kv : f.inputs) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      spdlog::error("--input {}: expected KEY=VALUE", kv);
      return 2;
    }
    inputs[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const std::string& k : s->inputs)
    if (!inputs.count(k)) {
      spdlog::error("the spec needs --input {}=...", k);
      return 2;
    }
  LocalEngineOptions eo;
  eo.kv_tokens = f.model.ctx + 16 * 64;
  eo.max_running = 16;
  auto e = LocalEngine::start(f.model, eo);
  if (!e) {
    spdlog::error("{}", e.error().message);
    return 1;
  }
  LocalEngine& engine = **e;
  const ModelFiles& files = engine.files();
  const Tokenizer& tok = *files.tokenizer;
  std::optional<ChatTemplate> tmpl;
  if (!files.chat_template.empty()) {
    auto t = ChatTemplate::parse(files.chat_template);
    if (!t) {
      spdlog::error("chat template: {}", t.error().message);
      return 1;
    }
    tmpl = std::move(*t);
  }
  const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
  GenerateFn generate = [&](const GenerateCall& c) -> Result<GenerateResult> {
    std::string text = c.prompt;
    if (tmpl) {
      auto r = tmpl->render({{"user", c.prompt}}, true, bos, eos);
      if (!r) return r.error();
      text = *r;
    }
    const std::vector<int32_t> prompt = tok.encode(text, true, true);
    if (prompt.empty()) return make_error("the prompt produced no tokens");
    const int32_t room = files.config.max_context - static_cast<int32_t>(prompt.size());
    if (room < 1) return make_error("the prompt has " + std::to_string(prompt.size()) + " tokens, over the context");
    GenerateResult out;
    for (int32_t i = 0; i < c.n; ++i) {  // (the branches after the first find the prompt cached)
      SeqRequest r;
      r.id = engine.next_id();
      r.prompt = prompt;
      r.max_new_tokens = std::min(c.max_tokens, room);
      r.sampling.temperature = static_cast<float>(c.temperature);
      r.sampling.top_p = static_cast<float>(c.top_p);
      r.sampling.seed = static_cast<uint64_t>(c.seed + i);
      IncrementalDecoder dec(tok);
      std::string reply;
      int64_t n = 0;
      bool stopped = false;
      auto st = engine.run_seq(std::move(r), [&](const actors::SeqEvent& ev) {
        ++n;
        if (ev.hit_stop) return true;
        reply += dec.push(ev.token);
        for (const std::string& stop : c.stop)
          if (auto at = reply.find(stop); at != std::string::npos) {
            reply.resize(at);
            stopped = true;
            return false;  // (cancels the sequence: its blocks go back)
          }
        return true;
      });
      if (!st && !stopped) return st.error();
      if (!stopped) reply += dec.flush();
      out.texts.push_back(reply);
      out.prompt_tokens += static_cast<int64_t>(prompt.size());
      out.completion_tokens += n;
    }
    return out;
  };
  auto on_event = [&](const nlohmann::json& ev) {
    if (f.events) std::cout << ev.dump() << "\n" << std::flush;
  };
  auto r = run_pipeline(*s, inputs, generate, on_event);
  if (!r) {
    spdlog::error("{}", r.error().message);
    return 1;
  }
  if (!f.events) std::cout << r->output << "\n";
  spdlog::info("pipeline '{}': {} generate calls, {} prompt and {} completion tokens", s->name, r->generate_calls,
               r->prompt_tokens, r->completion_tokens);
  return 0;
}

}  // namespace

void add_pipeline_command(CLI::App& app) {
  auto f = std::make_shared<PipelineFlags>();
  CLI::App* cmd =
      app.add_subcommand("pipeline", "Agent pipelines: graphs of generate and tool steps (docs/pipelines.md)");
  cmd->require_subcommand(1);
  CLI::App* r = cmd->add_subcommand("run", "Run a pipeline spec on the local engine; prints its output");
  f->model.add_to(*r);
  r->add_option("spec", f->spec, "the pipeline spec (JSON)")->required();
  r->add_option("-i,--input", f->inputs, "a run input KEY=VALUE (the spec's {{input.KEY}}); repeatable");
  r->add_flag("--events", f->events,
              "print every event (node started/finished, tool call/result, error) as JSON lines");
  r->callback([f] { set_exit_code(run(*f)); });
  CLI::App* c = cmd->add_subcommand("check", "Check a pipeline spec without running it; prints the node order");
  c->add_option("spec", f->spec, "the pipeline spec (JSON)")->required();
  c->callback([f] { set_exit_code(check(*f)); });
}

}  // namespace troupe::app
