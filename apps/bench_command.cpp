// `troupe bench`: prompt-processing and decode speed of one sequence, like llama-bench.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>

#include "apps/common.h"
#include "apps/subcommands.h"
#include "runtime/engine/sequence_runner.h"

namespace troupe::app {
namespace {

struct BenchFlags {
  ModelFlags model;
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
  auto engine = load_engine(f.model);
  if (!engine) {
    spdlog::error("{}", engine.error().message);
    return 1;
  }
  const int ctx = std::min(f.model.ctx, engine->files.config.max_context);
  auto runner = SequenceRunner::create(*engine->model, *engine->backend, ctx);
  if (!runner) {
    spdlog::error("{}", runner.error().message);
    return 2;
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, engine->files.config.vocab - 1);
  auto timed = [&](auto&& fn) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> pp, tg;
  for (int r = 0; r <= f.reps; ++r) {  // run 0 warms up
    if (f.prompt > 0) {
      std::vector<int32_t> toks(static_cast<size_t>(f.prompt));
      for (auto& t : toks) t = tok(rng);
      (*runner)->reset();
      bool ok = true;
      const double s = timed([&] { ok = (*runner)->feed(toks).ok(); });
      if (!ok) return 1;
      if (r) pp.push_back(f.prompt / s);
    }
    if (f.gen > 0) {
      (*runner)->reset();
      bool ok = true;
      const double s = timed([&] {
        int32_t t = tok(rng);
        for (int i = 0; i < f.gen && ok; ++i) {
          auto l = (*runner)->feed({t});
          ok = l.ok();
          if (ok) t = static_cast<int32_t>(std::max_element(*l, *l + engine->files.config.vocab) - *l);
        }
      });
      if (!ok) return 1;
      if (r) tg.push_back(f.gen / s);
    }
  }
  auto mean = [](const std::vector<double>& v) { return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size(); };
  auto sd = [&](const std::vector<double>& v) {
    if (v.size() < 2) return 0.0;
    const double m = mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / (v.size() - 1));
  };
  if (f.json) {
    std::printf("{\"model\": \"%s\", \"backend\": \"%s\", \"pp_tokens\": %d, \"tg_tokens\": %d, \"pp_tok_s\": %.2f, "
                "\"pp_sd\": %.2f, \"tg_tok_s\": %.2f, \"tg_sd\": %.2f}\n",
                engine->files.path.c_str(), engine->backend->name().c_str(), f.prompt, f.gen, mean(pp), sd(pp), mean(tg), sd(tg));
  } else {
    std::printf("| model | backend | test | tok/s |\n|---|---|---|---|\n");
    if (f.prompt) std::printf("| %s | %s | pp%d | %.2f ± %.2f |\n", engine->files.config.name.c_str(), engine->backend->name().c_str(), f.prompt, mean(pp), sd(pp));
    if (f.gen) std::printf("| %s | %s | tg%d | %.2f ± %.2f |\n", engine->files.config.name.c_str(), engine->backend->name().c_str(), f.gen, mean(tg), sd(tg));
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prompt processing (pp) and decode (tg) speed of one sequence");
  flags->model.add_to(*cmd);
  cmd->add_option("-p,--n-prompt", flags->prompt, "prompt tokens processed in one batch (random ids)")->capture_default_str();
  cmd->add_option("-n,--n-gen", flags->gen, "tokens decoded one at a time from an empty context")->capture_default_str();
  cmd->add_option("-r,--repetitions", flags->reps, "timed repetitions after one warm-up")->capture_default_str();
  cmd->add_flag("--json", flags->json, "print one JSON object instead of a table");
  cmd->callback([flags] { set_exit_code(bench(*flags)); });
}

}  // namespace troupe::app
