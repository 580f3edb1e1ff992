// `troupe sim validate`: replays one trace through the real `troupe serve` (a child
// process, streaming completions over HTTP with the trace's token ids) at several load
// levels and through the simulator with a (calibrated) hardware profile, and prints the
// error of the simulator's median and p99 TTFT, median ITL and throughput. The real and the
// simulated runs are summarised by the same function (sim::summary_json), so both sides
// count the same way.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/serve_client.h"
#include "apps/sim_common.h"
#include "apps/local_engine.h"
#include "apps/subcommands.h"
#include "runtime/model/model_files.h"
#include "sim/simulator.h"
#include "sim/step_log.h"

namespace troupe::app {
namespace {

using nlohmann::json;

struct ValidateFlags {
  ModelFlags model;
  std::string trace = sim_source_path("sim/examples/validate-cpu.csv");
  std::string hardware = sim_source_path("sim/profiles/cpu-local.json");
  std::vector<double> loads = {0.25, 0.75, 1.5};
  std::vector<double> rates;
  int max_num_seqs = 64, max_num_batched_tokens = 0, kv_cache_tokens = 32768, block_size = 16;
  bool no_prefix_caching = false, no_chunked_prefill = false;
  double itl_target_ms = 100;
  std::string policy = "fcfs";
  std::string out;
  ExpertFlags experts;      // the real server's expert workers; the simulator's layout follows
  std::string speculative;  // the real server's --speculative; the simulator takes its measured rates
  int num_speculative_tokens = 7;
};

// Speculation rates of a real run, for the simulator: the decode steps that fed drafts
// (match), and the drafts accepted per draft fed, from the step log (drafts fed) and the
// tokens the requests received (each decode step emits 1 + its accepted drafts).
struct SpecRates {
  double match = 0, acceptance = 0;
  int64_t decode_steps = 0, draft_steps = 0, fed = 0, accepted = 0;
};
SpecRates spec_rates(const std::vector<sim::LoggedStep>& steps, const sim::SimResult& real) {
  SpecRates r;
  int64_t first_tokens = 0;
  for (const auto& st : steps)
    for (const auto& q : st.sample.seqs) {
      if (!q.samples) continue;
      if (q.num_new - q.drafts != 1 || q.num_computed == 0) {
        ++first_tokens;  // a prompt's last chunk: the request's first token
        continue;
      }
      ++r.decode_steps;
      if (q.drafts > 0) {
        ++r.draft_steps;
        r.fed += q.drafts;
      }
    }
  int64_t generated = 0;
  for (const auto& q : real.requests) generated += q.generated;
  r.accepted = std::clamp<int64_t>(generated - first_tokens - r.decode_steps, 0, r.fed);
  r.match = r.decode_steps ? double(r.draft_steps) / r.decode_steps : 0;
  r.acceptance = r.fed ? double(r.accepted) / r.fed : 0;
  return r;
}

// ---- comparison ----

struct Metric {
  const char* name;
  double real, sim;
  double error() const { return real != 0 ? sim / real - 1 : 0; }
};

std::vector<Metric> compare(const json& real, const json& simj) {
  return {{"TTFT p50 (ms)", real["ttft_ms"]["p50"], simj["ttft_ms"]["p50"]},
          {"TTFT p99 (ms)", real["ttft_ms"]["p99"], simj["ttft_ms"]["p99"]},
          {"ITL p50 (ms)", real["itl_ms"]["p50"], simj["itl_ms"]["p50"]},
          {"throughput (output tok/s)", real["output_throughput"], simj["output_throughput"]}};
}

int validate(ValidateFlags f) {
  if (f.out.empty()) {
    spdlog::error("--out DIR is required");
    return 2;
  }
  if (!(f.itl_target_ms >= 0 && f.itl_target_ms <= 600000)) {
    spdlog::error("--itl-target-ms must be 0..600000");
    return 2;
  }
  if (f.max_num_seqs < 1 || f.kv_cache_tokens < f.block_size || f.block_size < 1 || f.max_num_batched_tokens < 0) {
    spdlog::error("--max-num-seqs and --block-size must be >= 1, --kv-cache-tokens >= --block-size");
    return 2;
  }
  for (double l : f.rates.empty() ? f.loads : f.rates)
    if (!(l > 0) || !std::isfinite(l)) {
      spdlog::error("--loads and --rates must be > 0");
      return 2;
    }
  auto files = open_model_files(f.model);
  if (!files) {
    spdlog::error("{}", files.error().message);
    return 1;
  }
  const ModelConfig mc = files->config;
  const std::string model_path = files->path;
  auto hw = sim::load_profile(f.hardware);
  if (!hw) {
    spdlog::error("{}", hw.error().message);
    return 2;
  }
  auto base = sim::read_trace(f.trace);
  if (!base) {
    spdlog::error("{}", base.error().message);
    return 2;
  }
  if (base->size() < 2 || !(base->back().arrival_s > 0)) {
    spdlog::error("{}: the trace needs at least two requests at different times", f.trace);
    return 2;
  }
  for (const auto& r : *base)
    if (r.prompt_tokens + r.output_tokens > std::min(f.model.ctx, mc.max_context)) {
      spdlog::error("{}: request {} needs {} tokens, beyond the context of {}", f.trace, r.id,
                    r.prompt_tokens + r.output_tokens, std::min(f.model.ctx, mc.max_context));
      return 2;
    }
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) {
    spdlog::error("cannot create {}: {}", f.out, ec.message());
    return 1;
  }
  sim::SimConfig sc;
  sc.scheduler = {f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens : f.model.batch, f.max_num_seqs,
                  !f.no_chunked_prefill, f.itl_target_ms / 1000};
  sc.kv = kv_config_for_tokens(f.kv_cache_tokens, f.block_size, !f.no_prefix_caching);
  sc.policy = f.policy;
  if (!f.speculative.empty()) {
    if (f.num_speculative_tokens < 1 || f.num_speculative_tokens > kMaxSpeculativeTokens) {
      spdlog::error("--num-speculative-tokens must be 1..{}", kMaxSpeculativeTokens);
      return 2;
    }
    sc.scheduler.num_speculative_tokens = f.num_speculative_tokens;
  }
  auto lay = expert_layout(f.experts, mc);
  if (!lay) {
    spdlog::error("{}", lay.error().message);
    return 2;
  }
  const sim::Layout layout = *lay;
  if (auto st = sim::check_layout(layout, mc); !st) {
    spdlog::error("{}", st.error().message);
    return 2;
  }
  const sim::CostModel cost(mc, *hw, layout);
  // Every step the real server ran, against the model with the engine's own overheads.
  const sim::CostModel step_cost(mc, sim::engine_only(*hw), layout);
  const double base_rate = (base->size() - 1) / base->back().arrival_s;
  auto scaled = [&](double rate) {
    std::vector<sim::SimRequest> v = *base;
    for (auto& r : v) r.arrival_s *= base_rate / rate;
    return v;
  };
  // The load levels: explicit rates, or fractions of the capacity the simulator predicts
  // (its request throughput with every request arriving at once).
  std::vector<double> rates = f.rates;
  double capacity = 0;
  if (rates.empty()) {
    auto burst = sim::simulate(scaled(base_rate * 1e6), sc, cost);
    if (!burst) {
      spdlog::error("{}", burst.error().message);
      return 1;
    }
    capacity = json::parse(sim::summary_json(*burst, {}))["request_throughput"].get<double>();
    for (double l : f.loads) rates.push_back(l * capacity);
    std::string list;
    for (double r : rates) list += (list.empty() ? "" : ", ") + std::to_string(r);
    spdlog::info("simulated capacity {:.3f} req/s; load levels {} req/s", capacity, list);
  }
  json report = {{"trace", f.trace},         {"profile", hw->name},        {"model", model_path},
                 {"requests", base->size()}, {"capacity_req_s", capacity}, {"levels", json::array()}};
  std::string md;
  md += "| load | rate (req/s) | metric | real serve | simulator | error |\n|---|---:|---|---:|---:|---:|\n";
  bool all_ok = true;
  for (size_t li = 0; li < rates.size(); ++li) {
    const double rate = rates[li];
    const std::string tag = "level" + std::to_string(li + 1);
    const auto reqs = scaled(rate);
    // The real server, fresh for each level (an empty prefix cache, as in the simulator).
    ServeSpec spec;
    spec.model = f.model;
    spec.model.model = model_path;
    spec.max_num_seqs = f.max_num_seqs;
    spec.max_num_batched_tokens = sc.scheduler.max_batched_tokens;
    spec.kv_cache_tokens = f.kv_cache_tokens;
    spec.block_size = f.block_size;
    spec.prefix_caching = !f.no_prefix_caching;
    spec.chunked_prefill = !f.no_chunked_prefill;
    spec.itl_target_ms = f.itl_target_ms;
    spec.policy = f.policy;
    spec.max_queue = static_cast<int>(reqs.size());
    set_serve_experts(f.experts, spec);
    spec.speculative = f.speculative;
    spec.num_speculative_tokens = f.num_speculative_tokens;
    spec.step_log = f.out + "/" + tag + "-steps.csv";
    ServerProcess server;
    const std::string log = f.out + "/serve-" + tag + ".log";
    if (auto st = server.start(spec, log); !st) {
      spdlog::error("{}", st.error().message);
      return 1;
    }
    spdlog::info("{}: {:.3f} req/s, {} requests over {:.1f} s through troupe serve on port {}", tag, rate, reqs.size(),
                 reqs.back().arrival_s, server.port());
    Replay rp = replay(server.port(), reqs, mc.vocab);
    const int code = server.stop();
    if (rp.failed) {
      spdlog::error("{}: {} request(s) failed against the real server, first: {}", tag, rp.failed, rp.first_error);
      all_ok = false;
    }
    if (code != 0) spdlog::warn("{}: troupe serve exited with {} (see {})", tag, code, log);
    sim::SimResult real;
    real.requests = std::move(rp.records);
    double last = 0;
    for (const auto& r : real.requests) last = std::max(last, r.finish);
    real.duration_s = last - reqs.front().arrival_s;
    const json realj = json::parse(sim::summary_json(real, {}));
    auto steps = sim::read_step_log(spec.step_log);
    // The simulator, after the real run: with speculation it takes that run's rates.
    sim::SimConfig level_sc = sc;
    json spec_json;
    if (!f.speculative.empty() && steps) {
      const SpecRates sr = spec_rates(*steps, real);
      level_sc.spec_match = sr.match;
      level_sc.spec_acceptance = sr.acceptance;
      spec_json = {{"decode_steps", sr.decode_steps},
                   {"draft_steps", sr.draft_steps},
                   {"drafts_fed", sr.fed},
                   {"drafts_accepted", sr.accepted},
                   {"match", sr.match},
                   {"acceptance", sr.acceptance}};
      spdlog::info(
          "{}: the real run fed drafts in {} of {} decode steps, {} of {} accepted: simulating with match "
          "{:.3f}, acceptance {:.3f}",
          tag, sr.draft_steps, sr.decode_steps, sr.accepted, sr.fed, sr.match, sr.acceptance);
    }
    auto simr = sim::simulate(reqs, level_sc, cost);
    if (!simr) {
      spdlog::error("{}", simr.error().message);
      return 1;
    }
    const json simj = json::parse(sim::summary_json(*simr, {}));
    std::ofstream(f.out + "/" + tag + "-real.json") << realj.dump(2) << "\n";
    std::ofstream(f.out + "/" + tag + "-sim.json") << simj.dump(2) << "\n";
    std::ofstream(f.out + "/" + tag + "-real-requests.csv") << sim::requests_csv(real);
    std::ofstream(f.out + "/" + tag + "-sim-requests.csv") << sim::requests_csv(*simr);
    const char* names[] = {"light", "near capacity", "overloaded"};
    const std::string load = f.rates.empty() && rates.size() == 3 ? names[li] : tag;
    json lv = {{"level", load}, {"rate_req_s", rate}, {"real", realj}, {"sim", simj}, {"metrics", json::array()}};
    if (!spec_json.is_null()) lv["speculation"] = spec_json;
    std::vector<Metric> metrics = compare(realj, simj);
    if (!steps) {
      spdlog::error("{}: {}", tag, steps.error().message);
      all_ok = false;
    } else {
      // The mean step time of the real run and the model's prediction for the same steps, and
      // the median of each step's own error.
      double measured = 0, predicted = 0;
      std::vector<double> errs;
      for (const auto& st : *steps) {
        const double p = step_cost.step_seconds(st.sample.seqs);
        measured += st.sample.seconds;
        predicted += p;
        if (st.sample.seconds > 0) errs.push_back(std::fabs(p / st.sample.seconds - 1));
      }
      if (!steps->empty())
        metrics.push_back({"step time, mean (ms)", 1e3 * measured / steps->size(), 1e3 * predicted / steps->size()});
      lv["steps"] = {{"count", steps->size()},
                     {"median_abs_error", sim::quantile(errs, 0.5)},
                     {"p90_abs_error", sim::quantile(errs, 0.9)}};
      spdlog::info("{}: {} steps, each step's |predicted/measured - 1|: median {:.1f}%, p90 {:.1f}%", tag,
                   steps->size(), 100 * sim::quantile(errs, 0.5), 100 * sim::quantile(errs, 0.9));
    }
    for (const Metric& m : metrics) {
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %.3f | %s | %.1f | %.1f | %+.1f%% |\n", load.c_str(), rate, m.name,
                    m.real, m.sim, 100 * m.error());
      md += line;
      lv["metrics"].push_back({{"metric", m.name}, {"real", m.real}, {"sim", m.sim}, {"error", m.error()}});
    }
    report["levels"].push_back(lv);
  }
  std::ofstream(f.out + "/validation.md") << md;
  std::ofstream(f.out + "/validation.json") << report.dump(2) << "\n";
  std::printf("%s", md.c_str());
  std::printf("wrote %s/validation.md and validation.json (and each level's summaries)\n", f.out.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace

void add_sim_validate(CLI::App& sim) {
  auto f = std::make_shared<ValidateFlags>();
  auto* cmd = sim.add_subcommand("validate",
                                 "Replay one trace through the real troupe serve and through the simulator "
                                 "at several loads; print the simulator's error per metric");
  f->model.add_to(*cmd);
  cmd->add_option("--trace", f->trace, "trace to replay (its arrival times are rescaled per load level)")
      ->capture_default_str();
  cmd->add_option("--hardware", f->hardware, "the simulator's hardware profile (from troupe sim calibrate)")
      ->capture_default_str();
  cmd->add_option("--loads", f->loads, "load levels as fractions of the simulated capacity, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--rates", f->rates, "explicit request rates (req/s) instead of --loads")->delimiter(',');
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "as troupe serve")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "as troupe serve (0: --batch)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f->kv_cache_tokens, "as troupe serve")->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "as troupe serve")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "as troupe serve");
  cmd->add_flag("--no-chunked-prefill", f->no_chunked_prefill, "as troupe serve");
  cmd->add_option("--itl-target-ms", f->itl_target_ms, "as troupe serve (0: off)")->capture_default_str();
  cmd->add_option("--scheduling-policy", f->policy, "fcfs or priority (as troupe serve)")->capture_default_str();
  f->experts.add_to(*cmd, true);
  cmd->add_option("--speculative", f->speculative,
                  "the real server speculates (as troupe serve --speculative); the simulator then runs each level with "
                  "the match and acceptance rates that level's real run measured");
  cmd->add_option("--num-speculative-tokens", f->num_speculative_tokens, "as troupe serve")->capture_default_str();
  cmd->add_option("--out", f->out, "output folder: validation.md, validation.json, per-level summaries and logs")
      ->required();
  cmd->callback([f] { set_exit_code(validate(*f)); });
}

}  // namespace troupe::app
