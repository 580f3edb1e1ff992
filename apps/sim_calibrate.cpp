// `troupe sim calibrate`: runs the real engine (the model, backend, scheduler and KV-block
// manager that `troupe serve` drives) over a fixed set of step shapes -- single prefills,
// decode batches of growing size with their mixed prefill steps, long-context decode -- times
// every step, and fits the hardware profile's efficiency factors and overheads to them
// (sim/calibrate.h). Writes the profile JSON and the measured steps as CSV.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "apps/serve_client.h"
#include "apps/sim_common.h"
#include "apps/local_engine.h"
#include "apps/subcommands.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/engine.h"
#include "sim/calibrate.h"
#include "sim/step_log.h"

namespace troupe::app {
namespace {

struct CalibrateFlags {
  ModelFlags model;
  std::string base = sim_source_path("sim/profiles/cpu-local.json");
  std::string out;
  std::string samples_out;
  std::string name;
  int repetitions = 1;
  float temperature = 0;
  bool no_serve = false;
  ExpertFlags experts;     // fit the expert workers' hand-off instead (through troupe serve)
  std::string steps;       // --steps FILE: fit to a step log instead of running anything
  bool via_serve = false;  // time the scenarios through troupe serve's step log
};

struct Scenario {
  const char* what;
  int requests, prompt, output;
  int stagger = 0;  // > 0: one request joins every `stagger` steps (decodes mixed with prefills)
};

// Shapes the serving steps take: prefills of several lengths, decode batches from 1 to
// 48 sequences (their first steps are packed prefill chunks), decode over long contexts,
// and a stream of arrivals whose prompts share steps with the others' decodes.
constexpr Scenario kScenarios[] = {
    {"prefill 32", 1, 32, 1},        {"prefill 128", 1, 128, 1}, {"prefill 256", 1, 256, 1}, {"prefill 512", 1, 512, 1},
    {"decode x1", 1, 32, 24},        {"decode x4", 4, 32, 24},   {"decode x16", 16, 32, 16}, {"decode x48", 48, 24, 12},
    {"long-context x2", 2, 900, 12}, {"mixed", 14, 160, 40, 5},
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What serving adds to an engine step (actor messages, detokenization, HTTP streaming):
// decode steps of 1 and of 16 sequences are timed through a real `troupe serve` (the gaps
// between a request's streamed tokens) and compared with the fitted engine profile. The
// difference becomes extra per-step and per-sampled-row overhead.
Status add_serving_overhead(const ServeSpec& spec, const ModelConfig& mc, sim::HardwareProfile& hw,
                            const std::string& log) {
  ServerProcess server;
  TROUPE_TRY(server.start(spec, log));
  const sim::CostModel cm(mc, hw);
  constexpr int kPrompt = 32, kOutput = 40;
  int64_t next_id = 1'000'000;  // distinct prompts (sim::prompt_tokens_of hashes the id)
  // Median over every decode gap of (measured - predicted), for `batch` requests at once.
  auto residual = [&](int batch, int rounds) -> Result<double> {
    std::vector<double> diffs;
    for (int round = 0; round < rounds; ++round) {
      std::vector<sim::SimRequest> reqs(static_cast<size_t>(batch));
      for (auto& q : reqs) q = {next_id++, 0.0, kPrompt, kOutput, 0, -1, 0};
      const Replay rp = replay(server.port(), reqs, mc.vocab);
      if (rp.failed) return make_error("through troupe serve: " + rp.first_error);
      for (const auto& rec : rp.records) {
        const auto& tt = rec.token_times;
        for (size_t k = 1; k < tt.size(); ++k) {
          std::vector<sim::SeqShape> step(static_cast<size_t>(batch),
                                          sim::SeqShape{static_cast<int32_t>(kPrompt + k - 1), 1, true});
          diffs.push_back(tt[k] - tt[k - 1] - cm.step_seconds(step));
        }
      }
    }
    return median(diffs);
  };
  // A line through the residuals at 1, 16 and 48 sequences: its intercept is per step, its
  // slope per sampled row (serving work grows with the streams: on a small machine it competes
  // with the engine's threads for the cores).
  const std::pair<int, int> batches[] = {{1, 3}, {16, 2}, {48, 1}};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  std::string seen;
  for (auto [b, rounds] : batches) {
    auto r = residual(b, rounds);
    if (!r) return r.error();
    sx += b;
    sy += *r;
    sxx += double(b) * b;
    sxy += b * *r;
    seen += fmt::format("{}batch {} {:+.3f} ms", seen.empty() ? "" : ", ", b, *r * 1e3);
  }
  const double n = std::size(batches);
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double per_row = std::max(0.0, slope);
  const double per_step = std::max(0.0, (sy - per_row * sx) / n);
  spdlog::info(
      "serving adds {:.3f} ms per step and {:.3f} ms per sampled row (median decode gaps through troupe serve "
      "against the engine fit: {})",
      per_step * 1e3, per_row * 1e3, seen);
  hw.step_overhead_s += per_step;
  hw.sample_overhead_s += per_row;
  server.stop();
  return {};
}

void print_fit(const sim::FitReport& fit, bool handoff = false) {
  const auto& p = fit.profile;
  std::printf(
      "fitted on %zu steps: matmul efficiency %.3f, attention %.3f, bandwidth %.3f, step overhead %.3f ms, "
      "per sampled row %.3f ms\n",
      fit.samples, p.flops_efficiency, p.attention_efficiency, p.bw_efficiency, p.step_overhead_s * 1e3,
      p.sample_overhead_s * 1e3);
  if (p.expert_launch_s > 0) std::printf("per expert run per layer: %.3f ms\n", p.expert_launch_s * 1e3);
  if (handoff)
    std::printf("expert hand-off: %.3f ms per MoE layer per step + %.3f us per routed row per layer\n",
                p.expert_hop_s * 1e3, p.expert_row_s * 1e6);
  std::printf("step-time error |predicted/measured - 1|: median %.1f%%, p90 %.1f%%, max %.1f%%\n",
              100 * fit.median_abs_error, 100 * fit.p90_abs_error, 100 * fit.max_abs_error);
}

// The scenarios as requests to a real server: all at once, or one every 0.1 s (`stagger`);
// prompts cut to fit a context of `ctx` tokens (a small model's).
std::vector<sim::SimRequest> scenario_requests(const Scenario& s, int64_t& next_id, int32_t ctx) {
  std::vector<sim::SimRequest> reqs;
  const int32_t output = std::min(s.output, std::max(1, ctx / 4));
  const int32_t prompt = std::max(1, std::min(s.prompt, ctx - output - 1));
  for (int i = 0; i < s.requests; ++i)
    reqs.push_back({next_id++, s.stagger > 0 ? 0.1 * i : 0.0, prompt, output, 0, -1, 0});
  return reqs;
}

// The scenarios' steps as a real `troupe serve` runs them (from its --step-log: the times
// the scheduler sees, actor messages included), or a step log given with --steps. Without
// expert workers the whole profile is fitted; with them (--expert-parallel N or
// --expert-placement) only their hand-off, the base profile (fitted the same way, on the same
// model without workers) held.
int calibrate_served(const CalibrateFlags& f, const sim::HardwareProfile& base) {
  auto files = open_model_files(f.model);
  if (!files) {
    spdlog::error("{}", files.error().message);
    return 1;
  }
  const ModelConfig mc = files->config;
  if (f.experts.enabled() && !mc.moe.enabled()) {
    spdlog::error("--expert-parallel / --expert-placement need a mixture-of-experts model");
    return 2;
  }
  auto lay = expert_layout(f.experts, mc);
  if (!lay) {
    spdlog::error("{}", lay.error().message);
    return 2;
  }
  const sim::Layout layout = *lay;
  std::vector<sim::StepSample> samples;
  if (!f.steps.empty()) {
    auto log = sim::read_step_log(f.steps);
    if (!log) {
      spdlog::error("{}", log.error().message);
      return 2;
    }
    for (auto& s : *log) samples.push_back(std::move(s.sample));
  } else {
    ServeSpec spec;
    spec.model = f.model;
    spec.model.model = files->path;
    spec.max_num_batched_tokens = f.model.batch;
    spec.prefix_caching = false;
    set_serve_experts(f.experts, spec);
    spec.step_log = f.out + ".steps.csv";
    const int32_t ctx = std::min(f.model.ctx, mc.max_context);
    ServerProcess server;
    if (auto st = server.start(spec, f.out + ".serve.log"); !st) {
      spdlog::error("{}", st.error().message);
      return 1;
    }
    spdlog::info("calibrating {} through troupe serve on port {}: {} scenarios x {}",
                 f.experts.enabled() ? "the hand-off to " + std::to_string(layout.expert_workers) + " expert worker(s)"
                                     : std::string("the whole profile"),
                 server.port(), std::size(kScenarios), f.repetitions);
    int64_t next_id = 2'000'000;
    auto warm = replay(server.port(), scenario_requests({"warm-up", 2, 64, 4}, next_id, ctx), mc.vocab);
    if (warm.failed) {
      spdlog::error("through troupe serve: {}", warm.first_error);
      return 1;
    }
    const auto warm_steps = sim::read_step_log(spec.step_log);
    const size_t skip = warm_steps ? warm_steps->size() : 0;
    for (int rep = 0; rep < f.repetitions; ++rep)
      for (const auto& s : kScenarios) {
        const auto t0 = std::chrono::steady_clock::now();
        auto rp = replay(server.port(), scenario_requests(s, next_id, ctx), mc.vocab);
        if (rp.failed) {
          spdlog::error("{} through troupe serve: {}", s.what, rp.first_error);
          return 1;
        }
        spdlog::info("{:<16} {:.2f} s", s.what,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    server.stop();
    auto log = sim::read_step_log(spec.step_log);
    if (!log) {
      spdlog::error("{}", log.error().message);
      return 1;
    }
    for (size_t i = skip; i < log->size(); ++i) samples.push_back(std::move((*log)[i].sample));
  }
  auto fit =
      f.experts.enabled() ? sim::fit_expert_handoff(mc, base, layout, samples) : sim::fit_profile(mc, base, samples);
  if (!fit) {
    spdlog::error("{}", fit.error().message);
    return 1;
  }
  if (!f.name.empty()) fit->profile.name = f.name;
  std::ofstream(f.out) << sim::profile_json(fit->profile);
  if (!f.samples_out.empty()) {
    std::ofstream csv(f.samples_out);
    csv << "seqs,tokens,samples,context_tokens,measured_s,predicted_s\n";
    const sim::CostModel cm(mc, sim::engine_only(fit->profile), layout);
    for (const auto& smp : samples) {
      int64_t tokens = 0, rows = 0, ctx = 0;
      for (const auto& q : smp.seqs) {
        tokens += q.num_new;
        rows += q.rows();
        ctx += q.num_computed + q.num_new;
      }
      char line[192];
      std::snprintf(line, sizeof line, "%zu,%lld,%lld,%lld,%.6f,%.6f\n", smp.seqs.size(),
                    static_cast<long long>(tokens), static_cast<long long>(rows), static_cast<long long>(ctx),
                    smp.seconds, cm.step_seconds(smp.seqs));
      csv << line;
    }
  }
  print_fit(*fit, f.experts.enabled());
  std::printf("wrote %s%s%s\n", f.out.c_str(), f.samples_out.empty() ? "" : " and ", f.samples_out.c_str());
  return 0;
}

int calibrate(CalibrateFlags f) {
  if (f.out.empty()) {
    spdlog::error("--out FILE is required");
    return 2;
  }
  if (f.repetitions < 1 || f.repetitions > 20 || !(f.temperature >= 0 && f.temperature <= 100)) {
    spdlog::error("--repetitions must be 1..20 and --temperature 0..100");
    return 2;
  }
  auto base = sim::load_profile(f.base);
  if (!base) {
    spdlog::error("{}", base.error().message);
    return 2;
  }
  if (f.experts.enabled() || f.via_serve || !f.steps.empty()) return calibrate_served(f, *base);
  f.model.ctx = std::max(f.model.ctx, 1024);
  auto engine = load_engine(f.model);
  if (!engine) {
    spdlog::error("{}", engine.error().message);
    return 1;
  }
  const ModelConfig mc = engine->files.config;
  const std::string backend_name = engine->backend->name(), model_path = engine->files.path;
  EngineConfig ec;
  ec.scheduler = {f.model.batch, 64};
  ec.kv = kv_config_for_tokens(16384, 16, false);  // random prompts: nothing to share
  auto eng = Engine::create(*engine->model, *engine->backend, ec, SchedulingPolicy::fcfs(), nullptr);
  if (!eng) {
    spdlog::error("{}", eng.error().message);
    return 2;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, mc.vocab - 1);
  int64_t next_id = 0;
  std::vector<sim::StepSample> samples;
  std::vector<std::string> labels;
  // Runs one scenario to completion; records its steps when `keep`.
  auto run = [&](const Scenario& s, bool keep) -> Status {
    int added = 0, steps = 0;
    auto add_one = [&]() -> Status {
      SeqRequest r;
      r.id = next_id++;
      r.prompt.resize(static_cast<size_t>(s.prompt));
      for (auto& t : r.prompt) t = tok(rng);
      r.max_new_tokens = s.output;
      r.sampling.temperature = f.temperature;
      ++added;
      return (*eng)->add(std::move(r));
    };
    for (int i = 0; i < (s.stagger > 0 ? 1 : s.requests); ++i) TROUPE_TRY(add_one());
    while ((*eng)->has_work()) {
      if (s.stagger > 0 && added < s.requests && ++steps % s.stagger == 0) TROUPE_TRY(add_one());
      const auto t0 = std::chrono::steady_clock::now();
      auto ev = (*eng)->step();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!ev) return ev.error();
      const StepPlan& plan = (*eng)->last_plan();
      if (!keep || plan.seqs.empty()) continue;
      sim::StepSample smp;
      for (const auto& q : plan.seqs)
        smp.seqs.push_back({q.num_computed, q.num_new, q.samples, static_cast<int32_t>(q.drafts.size())});
      smp.seconds = dt;
      samples.push_back(std::move(smp));
      labels.push_back(s.what);
    }
    return {};
  };
  spdlog::info("calibrating on {} ({}): {} scenarios x {} repetition(s) after a warm-up", mc.name, backend_name,
               std::size(kScenarios), f.repetitions);
  if (auto w = run({"warm-up", 2, 64, 4}, false); !w) {
    spdlog::error("{}", w.error().message);
    return 1;
  }
  for (int rep = 0; rep < f.repetitions; ++rep)
    for (const auto& s : kScenarios) {
      const size_t before = samples.size();
      const auto t0 = std::chrono::steady_clock::now();
      if (auto st = run(s, true); !st) {
        spdlog::error("{}: {}", s.what, st.error().message);
        return 1;
      }
      spdlog::info("{:<16} {:3} steps in {:.2f} s", s.what, samples.size() - before,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  auto fit = sim::fit_profile(mc, *base, samples);
  if (!fit) {
    spdlog::error("{}", fit.error().message);
    return 1;
  }
  const sim::HardwareProfile engine_only = fit->profile;
  if (!f.no_serve) {
    ServeSpec spec;
    spec.model = f.model;
    spec.model.model = model_path;
    spec.max_num_batched_tokens = f.model.batch;
    spec.prefix_caching = false;
    const std::string log = f.out + ".serve.log";
    eng->reset();  // the server gets the cores and the memory
    engine = make_error("released");
    if (auto st = add_serving_overhead(spec, mc, fit->profile, log); !st) {
      spdlog::error("{} (skip this part with --no-serve)", st.error().message);
      return 1;
    }
  }
  fit->profile.name = !f.name.empty() ? f.name
                                      : base->name.substr(0, base->name.find(' ')) + " calibrated (" + mc.name + ", " +
                                            backend_name + ")";
  std::ofstream(f.out) << sim::profile_json(fit->profile);
  if (!f.samples_out.empty()) {
    std::ofstream csv(f.samples_out);
    csv << "scenario,seqs,tokens,samples,context_tokens,measured_s,predicted_s\n";
    const sim::CostModel cm(mc, engine_only);
    for (size_t i = 0; i < samples.size(); ++i) {
      int64_t tokens = 0, rows = 0, ctx = 0;
      for (const auto& q : samples[i].seqs) {
        tokens += q.num_new;
        rows += q.rows();
        ctx += q.num_computed + q.num_new;
      }
      char line[256];
      std::snprintf(line, sizeof line, "%s,%zu,%lld,%lld,%lld,%.6f,%.6f\n", labels[i].c_str(), samples[i].seqs.size(),
                    static_cast<long long>(tokens), static_cast<long long>(rows), static_cast<long long>(ctx),
                    samples[i].seconds, cm.step_seconds(samples[i].seqs));
      csv << line;
    }
  }
  print_fit(*fit);
  std::printf("wrote %s%s%s\n", f.out.c_str(), f.samples_out.empty() ? "" : " and ", f.samples_out.c_str());
  return 0;
}

}  // namespace

void add_sim_calibrate(CLI::App& sim) {
  auto f = std::make_shared<CalibrateFlags>();
  auto* cmd = sim.add_subcommand("calibrate",
                                 "Time the real engine over a fixed set of step shapes on this machine and "
                                 "fit a hardware profile's efficiencies and overheads to them");
  f->model.add_to(*cmd);
  cmd->add_option("--hardware", f->base,
                  "base profile: peak rates and byte sizes kept, efficiencies and overheads fitted")
      ->capture_default_str();
  cmd->add_option("--out", f->out, "where to write the fitted profile JSON")->required();
  cmd->add_option("--samples-out", f->samples_out,
                  "also write every measured step (shape, measured and predicted s) as CSV");
  cmd->add_option("--name", f->name, "profile name (default: the base's, marked calibrated)");
  cmd->add_option("--temperature", f->temperature,
                  "sampling temperature of the measured steps (0: greedy, as `sim validate` sends; the profile's "
                  "per-row cost is for this setting)")
      ->capture_default_str();
  cmd->add_flag("--no-serve", f->no_serve,
                "fit the engine's steps only; by default decode steps are also timed through a real troupe serve and "
                "what serving adds becomes extra per-step and per-row overhead");
  f->experts.add_to(*cmd, true);
  cmd->add_option("--steps", f->steps,
                  "fit to this step log (troupe serve --step-log) instead of running the scenarios; with "
                  "--expert-parallel / --expert-placement, steps of a server run with those flags");
  cmd->add_flag(
      "--via-serve", f->via_serve,
      "time the scenarios through a real troupe serve (the steps its --step-log records) instead of the engine "
      "in this process; implied by --expert-parallel / --expert-placement");
  cmd->add_option("--repetitions", f->repetitions, "passes over the scenarios (every step is a sample)")
      ->capture_default_str();
  cmd->callback([f] { set_exit_code(calibrate(*f)); });
}

}  // namespace troupe::app
