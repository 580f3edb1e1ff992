// `troupe sim`: runs a workload through the production scheduler and KV-block manager on a
// virtual clock, pricing each step with the roofline cost model (sim/, docs/sim.md).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/subcommands.h"
#include "runtime/model_files.h"
#include "sim/plot.h"
#include "sim/simulator.h"

namespace troupe::app {
namespace {

std::string source_path(const std::string& rel) {
#ifdef TROUPE_SOURCE_DIR
  return std::string(TROUPE_SOURCE_DIR) + "/" + rel;
#else
  return rel;
#endif
}

struct SimFlags {
  int64_t requests = 1000;
  double rate = 4.0, cv = 1.0;
  uint64_t seed = 0;
  std::string prompt_len = "fixed:256", output_len = "fixed:64";
  int prefix_groups = 0, prefix_tokens = 0, priority_levels = 1;
  std::vector<double> rates;            // sweep
  std::vector<std::string> policies;    // sweep
  std::string trace, out, policy = "fcfs";
  std::string model_config = source_path("configs/smollm2-135m.json");
  std::string hardware = source_path("sim/profiles/cpu-local.json");
  int max_num_batched_tokens = 512, max_num_seqs = 64, kv_cache_tokens = 32768, block_size = 16;
  bool no_prefix_caching = false, log_decisions = false;
  double slo_ttft_ms = 0, slo_itl_ms = 0;
};

struct Prepared {
  ModelConfig model;
  sim::HardwareProfile hw;
};

// Model config and hardware profile; nullopt-like error already logged when it fails.
Result<Prepared> prepare(const SimFlags& f) {
  if (f.out.empty()) return make_error("--out DIR is required");
  if (f.max_num_batched_tokens < 1 || f.max_num_seqs < 1 || f.block_size < 1 || f.kv_cache_tokens < f.block_size)
    return make_error("--max-num-batched-tokens, --max-num-seqs and --block-size must be >= 1, --kv-cache-tokens >= --block-size");
  auto cfg = read_hf_config(f.model_config);
  if (!cfg) return cfg.error();
  auto hw = sim::load_profile(f.hardware);
  if (!hw) return hw.error();
  return Prepared{*cfg, *hw};
}

Result<std::vector<sim::SimRequest>> make_workload(const SimFlags& f, double rate) {
  if (!f.trace.empty()) return sim::read_trace(f.trace);
  sim::SyntheticSpec s;
  s.num_requests = f.requests;
  s.rate = rate;
  s.cv = f.cv;
  s.seed = f.seed;
  s.num_prefix_groups = f.prefix_groups;
  s.prefix_tokens = f.prefix_tokens;
  s.priority_levels = f.priority_levels;
  auto pl = sim::parse_length(f.prompt_len), ol = sim::parse_length(f.output_len);
  if (!pl) return pl.error();
  if (!ol) return ol.error();
  s.prompt = *pl;
  s.output = *ol;
  return sim::synthetic(s);
}

sim::SimConfig sim_config(const SimFlags& f, const std::string& policy) {
  sim::SimConfig sc;
  sc.scheduler = {f.max_num_batched_tokens, f.max_num_seqs};
  sc.kv = kv_config_for_tokens(f.kv_cache_tokens, f.block_size, !f.no_prefix_caching);
  sc.policy = policy;
  sc.log_decisions = f.log_decisions;
  return sc;
}

int run_sim(const SimFlags& f) {
  auto prep = prepare(f);
  if (!prep) {
    spdlog::error("{}", prep.error().message);
    return 2;
  }
  const ModelConfig* cfg = &prep->model;
  const sim::HardwareProfile* hw = &prep->hw;
  auto reqs = make_workload(f, f.rate);
  if (!reqs) {
    spdlog::error("{}", reqs.error().message);
    return 2;
  }
  const sim::SimConfig sc = sim_config(f, f.policy);
  const sim::CostModel cost(*cfg, *hw);
  auto r = sim::simulate(*reqs, sc, cost);
  if (!r) {
    spdlog::error("{}", r.error().message);
    return 1;
  }
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) {
    spdlog::error("cannot create {}: {}", f.out, ec.message());
    return 1;
  }
  const std::string summary = sim::summary_json(*r, {f.slo_ttft_ms, f.slo_itl_ms});
  std::ofstream(f.out + "/summary.json") << summary;
  std::ofstream(f.out + "/requests.csv") << sim::requests_csv(*r);
  if (f.log_decisions) {
    std::ofstream d(f.out + "/decisions.log");
    for (const auto& line : r->decisions) d << line << "\n";
  }
  const auto j = nlohmann::json::parse(summary);
  std::printf("simulated %zu requests on %s (%s): %llu steps, %.2f s of virtual time\n", reqs->size(), hw->name.c_str(),
              f.model_config.c_str(), static_cast<unsigned long long>(r->steps), r->duration_s);
  std::printf("throughput %.2f req/s, %.1f output tok/s; preemptions %llu; KV usage mean %.1f%% peak %.1f%%\n",
              j["request_throughput"].get<double>(), j["output_throughput"].get<double>(),
              static_cast<unsigned long long>(r->preemptions), 100 * r->mean_kv_usage, 100 * r->peak_kv_usage);
  for (const char* k : {"ttft_ms", "itl_ms", "e2el_ms"})
    std::printf("%-8s p50 %9.2f  p90 %9.2f  p99 %9.2f\n", k, j[k]["p50"].get<double>(), j[k]["p90"].get<double>(),
                j[k]["p99"].get<double>());
  std::printf("wrote %s/summary.json and %s/requests.csv\n", f.out.c_str(), f.out.c_str());
  return 0;
}

int run_sweep(const SimFlags& f) {
  auto prep = prepare(f);
  if (!prep) {
    spdlog::error("{}", prep.error().message);
    return 2;
  }
  if (f.rates.empty() || f.policies.empty()) {
    spdlog::error("--rates and --policies need at least one value each");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) {
    spdlog::error("cannot create {}: {}", f.out, ec.message());
    return 1;
  }
  const sim::CostModel cost(prep->model, prep->hw);
  std::string csv = "policy,rate,request_throughput,output_throughput,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,preemptions,slo_attainment\n";
  std::vector<sim::Series> series;
  std::printf("%-10s %8s %10s %12s %12s %12s %10s\n", "policy", "rate", "req/s", "TTFT p50 ms", "TTFT p99 ms",
              "ITL p99 ms", "preempt");
  for (const auto& policy : f.policies) {
    sim::Series p50{policy + " TTFT p50", {}, {}}, p99{policy + " TTFT p99", {}, {}};
    for (double rate : f.rates) {
      auto reqs = make_workload(f, rate);
      if (!reqs) {
        spdlog::error("{}", reqs.error().message);
        return 2;
      }
      auto r = sim::simulate(*reqs, sim_config(f, policy), cost);
      if (!r) {
        spdlog::error("{}", r.error().message);
        return r.error().message.find("policy") != std::string::npos ? 2 : 1;
      }
      const auto j = nlohmann::json::parse(sim::summary_json(*r, {f.slo_ttft_ms, f.slo_itl_ms}));
      char line[512];
      std::snprintf(line, sizeof line, "%s,%g,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%llu,%.4f\n", policy.c_str(), rate,
                    j["request_throughput"].get<double>(), j["output_throughput"].get<double>(),
                    j["ttft_ms"]["p50"].get<double>(), j["ttft_ms"]["p90"].get<double>(), j["ttft_ms"]["p99"].get<double>(),
                    j["itl_ms"]["p50"].get<double>(), j["itl_ms"]["p99"].get<double>(),
                    static_cast<unsigned long long>(r->preemptions), j["slo_attainment"].get<double>());
      csv += line;
      std::printf("%-10s %8g %10.3f %12.1f %12.1f %12.1f %10llu\n", policy.c_str(), rate,
                  j["request_throughput"].get<double>(), j["ttft_ms"]["p50"].get<double>(),
                  j["ttft_ms"]["p99"].get<double>(), j["itl_ms"]["p99"].get<double>(),
                  static_cast<unsigned long long>(r->preemptions));
      p50.x.push_back(rate);
      p50.y.push_back(j["ttft_ms"]["p50"].get<double>());
      p99.x.push_back(rate);
      p99.y.push_back(j["ttft_ms"]["p99"].get<double>());
    }
    series.push_back(p50);
    series.push_back(p99);
  }
  std::ofstream(f.out + "/sweep.csv") << csv;
  std::ofstream(f.out + "/sweep.svg") << sim::line_chart_svg(
      "Time to first token vs load (" + prep->hw.name.substr(0, prep->hw.name.find(' ')) + ", simulated)",
      "request rate (requests/s)", "TTFT (ms)", series, true);
  std::printf("wrote %s/sweep.csv and %s/sweep.svg\n", f.out.c_str(), f.out.c_str());
  return 0;
}

}  // namespace

namespace {
void add_common(CLI::App* cmd, SimFlags& f) {
  cmd->add_option("--requests", f.requests, "synthetic workload: number of requests")->capture_default_str();
  cmd->add_option("--cv", f.cv, "inter-arrival coefficient of variation (1: Poisson, else gamma)")->capture_default_str();
  cmd->add_option("--seed", f.seed, "random seed (the same seed gives byte-identical outputs)")->capture_default_str();
  cmd->add_option("--prompt-len", f.prompt_len, "prompt lengths: fixed:N, uniform:A:B or lognormal:MU:SIGMA")->capture_default_str();
  cmd->add_option("--output-len", f.output_len, "output lengths: fixed:N, uniform:A:B or lognormal:MU:SIGMA")->capture_default_str();
  cmd->add_option("--prefix-groups", f.prefix_groups, "requests draw one of G shared-prefix groups (0: none)")->capture_default_str();
  cmd->add_option("--prefix-tokens", f.prefix_tokens, "tokens of the shared prefix per group")->capture_default_str();
  cmd->add_option("--priority-levels", f.priority_levels, "priorities drawn uniformly from 0..N-1 (lower runs first under --policy priority)")->capture_default_str();
  cmd->add_option("--trace", f.trace, "CSV or JSONL trace instead of a synthetic workload (sim/examples/)");
  cmd->add_option("--model-config", f.model_config, "Hugging Face config.json of the simulated model")->capture_default_str();
  cmd->add_option("--hardware", f.hardware, "hardware profile JSON (sim/profiles/)")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "token budget per step (as troupe serve)")->capture_default_str();
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "cap on running sequences (as troupe serve)")->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity in tokens (as troupe serve)")->capture_default_str();
  cmd->add_option("--block-size", f.block_size, "KV block size in tokens (as troupe serve)")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f.no_prefix_caching, "turn automatic prefix caching off (as troupe serve)");
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms, "SLO on time to first token for goodput (0: none)")->capture_default_str();
  cmd->add_option("--slo-itl-ms", f.slo_itl_ms, "SLO on the worst inter-token latency (0: none)")->capture_default_str();
}
}  // namespace

void add_sim_command(CLI::App& app) {
  auto f = std::make_shared<SimFlags>();
  auto* cmd = app.add_subcommand("sim", "Simulate scheduling on a virtual clock: the production scheduler and KV-block "
                                        "manager, a roofline step-cost model, synthetic or trace workloads");
  add_common(cmd, *f);
  cmd->add_option("--rate", f->rate, "synthetic workload: mean arrival rate (requests/s)")->capture_default_str();
  cmd->add_option("--policy", f->policy, "fcfs or priority (as troupe serve)")->capture_default_str();
  cmd->add_flag("--log-decisions", f->log_decisions, "write every step's scheduling decisions to OUT/decisions.log");
  cmd->add_option("--out", f->out, "output folder: summary.json, requests.csv");
  auto sf = std::make_shared<SimFlags>();
  auto* sweep = cmd->add_subcommand("sweep", "Run the same workload over several request rates and policies; writes "
                                             "OUT/sweep.csv and an SVG plot of TTFT percentiles vs load, one line per policy");
  add_common(sweep, *sf);
  sweep->add_option("--rates", sf->rates, "request rates (requests/s), comma-separated")->delimiter(',')->required();
  sf->policies = {"fcfs", "priority"};
  sweep->add_option("--policies", sf->policies, "policies, comma-separated")->delimiter(',')->capture_default_str();
  sweep->add_option("--out", sf->out, "output folder")->required();
  sweep->callback([sf] { set_exit_code(run_sweep(*sf)); });
  cmd->callback([f, sweep] {
    if (sweep->parsed()) return;
    set_exit_code(run_sim(*f));
  });
}

}  // namespace troupe::app
