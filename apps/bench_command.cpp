// `troupe bench`: prompt-processing and decode speed of one sequence, like llama-bench,
// through the engine `troupe serve` runs (apps/local_engine.h): scheduler, KV-block
// manager, stage and worker actors.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>

#include "apps/common.h"
#include "apps/subcommands.h"
#include "apps/local_engine.h"

namespace troupe::app {
namespace {

struct BenchFlags {
  ModelFlags model;
  ExpertFlags experts;
  int prompt = 512;
  int gen = 128;
  int reps = 3;
  bool json = false;
};

int bench(BenchFlags f) {
  if (f.prompt < 0 || f.gen < 0 || f.reps <= 0) {
    spdlog::error("-p, -n must be >= 0 and -r > 0");
    return 2;
  }
  f.model.ctx = std::max(f.model.ctx, f.prompt + f.gen + 1);
  LocalEngineOptions eo;
  eo.kv_tokens = f.model.ctx + 16;
  eo.prefix_caching = false;  // every repetition computes its prompt
  eo.max_running = 1;
  eo.require_tokenizer = false;
  eo.experts = f.experts;
  auto started = LocalEngine::start(f.model, eo);
  if (!started) {
    spdlog::error("{}", started.error().message);
    return 1;
  }
  LocalEngine& engine = **started;
  const ModelConfig& c = engine.files().config;
  if (f.prompt + 1 > c.max_context || f.gen + 1 > c.max_context) {
    spdlog::error("-p and -n must each fit the model's context of {} tokens", c.max_context);
    return 2;
  }
  if (f.prompt > f.model.batch) {
    spdlog::error("-p {} is more than one step of --batch {} tokens", f.prompt, f.model.batch);
    return 2;
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab - 1);
  // Greedy, no log-probabilities, end-of-sequence ignored: the forward passes are what is timed.
  auto seq = [&](int32_t prompt_len, int32_t new_tokens) {
    SeqRequest r;
    r.id = engine.next_id();
    r.prompt.resize(static_cast<size_t>(prompt_len));
    for (auto& t : r.prompt) t = tok(rng);
    r.max_new_tokens = new_tokens;
    r.sampling.temperature = 0;
    r.sampling.report_logprob = false;
    r.ignore_eos = true;
    return r;
  };
  auto timed = [&](SeqRequest r, int32_t expect) -> Result<double> {
    int32_t got = 0;
    const auto t0 = std::chrono::steady_clock::now();
    TROUPE_TRY(engine.run_seq(std::move(r), [&](const actors::SeqEvent&) { return ++got < expect; }));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (got != expect)
      return make_error("the engine gave " + std::to_string(got) + " of " + std::to_string(expect) + " tokens");
    return s;
  };
  std::vector<double> pp, tg;
  for (int r = 0; r <= f.reps; ++r) {  // run 0 warms up
    if (f.prompt > 0) {
      // One step over the whole prompt (and the first token sampled from its last row).
      auto s = timed(seq(f.prompt, 1), 1);
      if (!s) {
        spdlog::error("{}", s.error().message);
        return 1;
      }
      if (r) pp.push_back(f.prompt / *s);
    }
    if (f.gen > 0) {
      // From an empty context: a one-token prompt, then one token a step (gen steps in all).
      auto s = timed(seq(1, f.gen), f.gen);
      if (!s) {
        spdlog::error("{}", s.error().message);
        return 1;
      }
      if (r) tg.push_back(f.gen / *s);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  };
  auto sd = [&](const std::vector<double>& v) {
    if (v.size() < 2) return 0.0;
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / (v.size() - 1));
  };
  if (f.json) {
    std::printf(
        "{\"model\": \"%s\", \"backend\": \"%s\", \"pp_tokens\": %d, \"tg_tokens\": %d, \"pp_tok_s\": %.2f, "
        "\"pp_sd\": %.2f, \"tg_tok_s\": %.2f, \"tg_sd\": %.2f}\n",
        engine.files().path.c_str(), engine.device().c_str(), f.prompt, f.gen, mean(pp), sd(pp), mean(tg), sd(tg));
  } else {
    std::printf("| model | backend | test | tok/s |\n|---|---|---|---|\n");
    if (f.prompt)
      std::printf("| %s | %s | pp%d | %.2f ± %.2f |\n", c.name.c_str(), engine.device().c_str(), f.prompt, mean(pp),
                  sd(pp));
    if (f.gen)
      std::printf("| %s | %s | tg%d | %.2f ± %.2f |\n", c.name.c_str(), engine.device().c_str(), f.gen, mean(tg),
                  sd(tg));
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing (pp) and decode (tg) speed of one sequence");
  flags->model.add_to(*cmd);
  flags->experts.add_to(*cmd, true);
  cmd->add_option("-p,--n-prompt", flags->prompt, "prompt tokens processed in one batch (random ids)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", flags->gen, "tokens decoded one at a time from an empty context")
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", flags->reps, "timed repetitions after one warm-up")->capture_default_str();
  cmd->add_flag("--json", flags->json, "print one JSON object instead of a table");
  cmd->callback([flags] { set_exit_code(bench(*flags)); });
}

}  // namespace troupe::app
