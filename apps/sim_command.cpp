// `troupe sim`: runs a workload through the production scheduler and KV-block manager on a
// virtual clock, pricing each step with the roofline cost model (sim/, docs/sim.md).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/sim_common.h"
#include "apps/subcommands.h"
#include "runtime/model/model_files.h"
#include "sim/cluster.h"
#include "sim/plot.h"
#include "sim/simulator.h"

namespace troupe::app {
namespace {

struct SimFlags {
  int64_t requests = 1000;
  double rate = 4.0, cv = 1.0;
  uint64_t seed = 0;
  std::string prompt_len = "fixed:256", output_len = "fixed:64";
  int prefix_groups = 0, prefix_tokens = 0, priority_levels = 1;
  std::vector<double> rates;          // sweep
  std::vector<std::string> policies;  // sweep
  std::string trace, out, policy = "fcfs", tokenizer;
  std::string model_config = sim_source_path("configs/smollm2-135m.json");
  std::string hardware = sim_source_path("sim/profiles/cpu-local.json");
  int max_num_batched_tokens = 512, max_num_seqs = 64, kv_cache_tokens = 32768, block_size = 16;
  bool no_prefix_caching = false, no_chunked_prefill = false, log_decisions = false;
  double itl_target_ms = 100;  // as troupe serve (0: off)
  int speculative_tokens = 0;  // as troupe serve --num-speculative-tokens (0: no speculation)
  double spec_acceptance = 0.7, spec_match = 1.0;
  std::string param;            // sweep: a scheduler flag to vary
  std::vector<double> values;   // sweep: its values
  std::string metric = "ttft";  // sweep: ttft | itl | e2el
  double slo_ttft_ms = 0, slo_itl_ms = 0;
  sim::Layout layout;          // parallel layout (cost model); experts filled from the model config
  sim::ClusterConfig cluster;  // replicas or prefill/decode disaggregation
};

// One instance: the plain simulator (its decisions are a bare Scheduler's); more: the cluster.
Result<sim::SimResult> run_workload(const std::vector<sim::SimRequest>& reqs, const sim::SimConfig& sc,
                                    const sim::CostModel& cost, const sim::ClusterConfig& cc) {
  if (cc.instances == 1 && cc.prefill_instances == 0) return sim::simulate(reqs, sc, cost);
  if (sc.scheduler.num_speculative_tokens > 0)
    return make_error(
        "--speculative-tokens is simulated on one instance only (not with --instances or disaggregation)");
  return sim::simulate_cluster(reqs, sc, cost, cc);
}

struct Prepared {
  ModelConfig model;
  sim::HardwareProfile hw;
  sim::Layout layout;
};

// Model config and hardware profile; nullopt-like error already logged when it fails.
Result<Prepared> prepare(const SimFlags& f) {
  if (f.out.empty()) return make_error("--out DIR is required");
  if (f.max_num_batched_tokens < 1 || f.max_num_seqs < 1 || f.block_size < 1 || f.kv_cache_tokens < f.block_size)
    return make_error(
        "--max-num-batched-tokens, --max-num-seqs and --block-size must be >= 1, --kv-cache-tokens >= --block-size");
  if (!(f.itl_target_ms >= 0 && f.itl_target_ms <= 600000)) return make_error("--itl-target-ms must be 0..600000");
  if (f.speculative_tokens < 0 || f.speculative_tokens > kMaxSpeculativeTokens)
    return make_error("--speculative-tokens must be 0.." + std::to_string(kMaxSpeculativeTokens));
  if (!(f.spec_acceptance >= 0 && f.spec_acceptance <= 1) || !(f.spec_match >= 0 && f.spec_match <= 1))
    return make_error("--spec-acceptance and --spec-match must be within 0..1");
  if (f.speculative_tokens > 0 && (f.cluster.instances > 1 || f.cluster.prefill_instances > 0))
    return make_error(
        "--speculative-tokens is simulated on one instance only (not with --instances or disaggregation)");
  const bool gguf = f.model_config.size() > 5 && f.model_config.compare(f.model_config.size() - 5, 5, ".gguf") == 0;
  Result<ModelConfig> cfg = make_error("");
  if (gguf) {  // its header's config (the weights stay mapped, unread)
    auto files = open_model(f.model_config);
    if (!files) return files.error();
    cfg = files->config;
  } else {
    cfg = read_hf_config(f.model_config, true);
  }
  if (!cfg) return cfg.error();
  auto hw = sim::load_profile(f.hardware);
  if (!hw) return hw.error();
  sim::Layout layout = f.layout;
  if (!gguf) TROUPE_TRY(sim::read_moe_fields(f.model_config, layout));
  TROUPE_TRY(sim::check_layout(layout, *cfg));
  return Prepared{*cfg, *hw, layout};
}

// Token counts for ShareGPT text: the --tokenizer model's tokenizer, else an estimate.
Result<sim::TokenCounter> token_counter(const SimFlags& f) {
  if (f.tokenizer.empty()) {
    spdlog::info("ShareGPT token counts are estimated (4 bytes per token); pass --tokenizer MODEL for exact counts");
    return sim::TokenCounter(sim::estimate_tokens);
  }
  auto files = open_model(f.tokenizer);
  if (!files) return files.error();
  if (!files->tokenizer) return make_error("--tokenizer " + f.tokenizer + ": the model has no tokenizer");
  auto tok = std::make_shared<Tokenizer>(std::move(*files->tokenizer));
  return sim::TokenCounter(
      [tok](std::string_view text) { return static_cast<int32_t>(tok->encode(text, false, false).size()); });
}

Result<std::vector<sim::SimRequest>> make_workload(const SimFlags& f, double rate) {
  sim::SyntheticSpec s;
  if (!f.trace.empty() && f.trace.size() >= 5 && f.trace.substr(f.trace.size() - 5) == ".json") {
    // One tokenizer load per command, however many rates and variants a sweep runs.
    static std::map<std::string, sim::TokenCounter> counters;
    auto it = counters.find(f.tokenizer);
    if (it == counters.end()) {
      auto made = token_counter(f);
      if (!made) return made.error();
      it = counters.emplace(f.tokenizer, std::move(*made)).first;
    }
    const sim::TokenCounter* count = &it->second;
    s.num_requests = f.requests;
    s.rate = rate;
    s.cv = f.cv;
    s.seed = f.seed;
    return sim::read_sharegpt(f.trace, *count, s);
  }
  if (!f.trace.empty()) return sim::read_trace(f.trace);
  s.num_requests = f.requests;
  s.rate = rate;
  s.cv = f.cv;
  s.seed = f.seed;
  s.num_prefix_groups = f.prefix_groups;
  s.prefix_tokens = f.prefix_tokens;
  s.priority_levels = f.priority_levels;
  auto pl = sim::parse_length(f.prompt_len, false), ol = sim::parse_length(f.output_len, true);
  if (!pl) return pl.error();
  if (!ol) return ol.error();
  s.prompt = *pl;
  s.output = *ol;
  return sim::synthetic(s);
}

sim::SimConfig sim_config(const SimFlags& f, const std::string& policy) {
  sim::SimConfig sc;
  sc.scheduler = {f.max_num_batched_tokens, f.max_num_seqs, !f.no_chunked_prefill, f.itl_target_ms / 1000};
  sc.kv = kv_config_for_tokens(f.kv_cache_tokens, f.block_size, !f.no_prefix_caching);
  sc.policy = policy;
  sc.log_decisions = f.log_decisions;
  sc.scheduler.num_speculative_tokens = f.speculative_tokens;
  sc.spec_acceptance = f.spec_acceptance;
  sc.spec_match = f.spec_match;
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
  const sim::CostModel cost(*cfg, *hw, prep->layout);
  if (auto st = sim::check_cluster(f.cluster); !st) {
    spdlog::error("{}", st.error().message);
    return 2;
  }
  auto r = run_workload(*reqs, sc, cost, f.cluster);
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

// The flags `sim sweep --param` can vary; value 0/1 turns the two switches off/on.
const char* kSweepParams[] = {"max-num-batched-tokens",
                              "max-num-seqs",
                              "kv-cache-tokens",
                              "block-size",
                              "chunked-prefill",
                              "prefix-caching",
                              "pipeline-stages",
                              "micro-batches",
                              "ep-degree",
                              "expert-workers",
                              "instances",
                              "prefill-instances",
                              "decode-instances",
                              "itl-target-ms",
                              "speculative-tokens"};

Status set_param(SimFlags& f, const std::string& name, double v) {
  if (!(v >= 0 && v <= 1e9)) return make_error("--values for " + name + " must be 0..1000000000");
  const int i = static_cast<int>(v);
  if (v != i) return make_error("--values for " + name + " must be integers");
  if (name == "max-num-batched-tokens")
    f.max_num_batched_tokens = i;
  else if (name == "max-num-seqs")
    f.max_num_seqs = i;
  else if (name == "kv-cache-tokens")
    f.kv_cache_tokens = i;
  else if (name == "block-size")
    f.block_size = i;
  else if (name == "pipeline-stages")
    f.layout.pipeline_stages = i;
  else if (name == "micro-batches")
    f.layout.micro_batches = i;
  else if (name == "ep-degree")
    f.layout.ep_degree = i;
  else if (name == "expert-workers")
    f.layout.expert_workers = i;
  else if (name == "instances")
    f.cluster.instances = i;
  else if (name == "prefill-instances")
    f.cluster.prefill_instances = i;
  else if (name == "decode-instances")
    f.cluster.decode_instances = i;
  else if (name == "itl-target-ms")
    f.itl_target_ms = i;
  else if (name == "speculative-tokens")
    f.speculative_tokens = i;
  else if (name == "chunked-prefill" || name == "prefix-caching") {
    if (i != 0 && i != 1) return make_error("--values for " + name + " must be 0 (off) or 1 (on)");
    (name == "chunked-prefill" ? f.no_chunked_prefill : f.no_prefix_caching) = i == 0;
  } else {
    std::string known;
    for (const char* k : kSweepParams) known += std::string(known.empty() ? "" : ", ") + k;
    return make_error("--param '" + name + "' is not one of " + known);
  }
  if (f.max_num_batched_tokens < 1 || f.max_num_seqs < 1 || f.block_size < 1 || f.kv_cache_tokens < f.block_size)
    return make_error("--param " + name + " " + std::to_string(i) + " is out of range");
  return {};
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
  if (f.metric != "ttft" && f.metric != "itl" && f.metric != "e2el") {
    spdlog::error("--metric must be ttft, itl or e2el");
    return 2;
  }
  if (f.param.empty() != f.values.empty()) {
    spdlog::error("--param and --values go together");
    return 2;
  }
  std::vector<double> values = f.values.empty() ? std::vector<double>{0} : f.values;
  std::vector<SimFlags> variants;
  for (double v : values) {
    SimFlags g = f;
    if (!f.param.empty())
      if (auto st = set_param(g, f.param, v); !st) {
        spdlog::error("{}", st.error().message);
        return 2;
      }
    variants.push_back(g);
  }
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) {
    spdlog::error("cannot create {}: {}", f.out, ec.message());
    return 1;
  }
  const std::string m = f.metric + "_ms";
  std::string csv =
      "policy," + (f.param.empty() ? std::string() : f.param + ",") +
      "rate,request_throughput,output_throughput,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,"
      "e2el_p50_ms,e2el_p99_ms,preemptions,slo_attainment,goodput\n";
  std::vector<sim::Series> series;
  const int vw = f.param.empty() ? 0 : 10;  // the value column only when a flag varies
  std::printf("%-10s %-*s %8s %10s %12s %12s %12s %10s\n", "policy", vw, f.param.empty() ? "" : "value", "rate",
              "req/s", (f.metric + " p50 ms").c_str(), (f.metric + " p99 ms").c_str(), "ITL p99 ms", "preempt");
  for (const auto& policy : f.policies) {
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const SimFlags& g = variants[vi];
      char vtext[32] = "";
      if (!f.param.empty()) std::snprintf(vtext, sizeof vtext, "%g", values[vi]);
      const std::string label = policy + (f.param.empty() ? "" : " " + f.param + "=" + vtext);
      sim::Series p50{label + " p50", {}, {}}, p99{label + " p99", {}, {}};
      for (double rate : f.rates) {
        auto reqs = make_workload(g, rate);
        if (!reqs) {
          spdlog::error("{}", reqs.error().message);
          return 2;
        }
        sim::Layout layout = g.layout;
        layout.num_experts = prep->layout.num_experts;
        layout.experts_per_token = prep->layout.experts_per_token;
        layout.expert_ffn = prep->layout.expert_ffn;
        if (auto st = sim::check_layout(layout, prep->model); !st) {
          spdlog::error("{}", st.error().message);
          return 2;
        }
        const sim::CostModel cost(prep->model, prep->hw, layout);
        if (auto st = sim::check_cluster(g.cluster); !st) {
          spdlog::error("{}", st.error().message);
          return 2;
        }
        auto r = run_workload(*reqs, sim_config(g, policy), cost, g.cluster);
        if (!r) {
          spdlog::error("{}", r.error().message);
          return r.error().message.find("policy") != std::string::npos ? 2 : 1;
        }
        const auto j = nlohmann::json::parse(sim::summary_json(*r, {f.slo_ttft_ms, f.slo_itl_ms}));
        char line[640];
        std::snprintf(line, sizeof line, "%s,%s%s%g,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%llu,%.4f,%.6f\n",
                      policy.c_str(), vtext, f.param.empty() ? "" : ",", rate, j["request_throughput"].get<double>(),
                      j["output_throughput"].get<double>(), j["ttft_ms"]["p50"].get<double>(),
                      j["ttft_ms"]["p90"].get<double>(), j["ttft_ms"]["p99"].get<double>(),
                      j["itl_ms"]["p50"].get<double>(), j["itl_ms"]["p99"].get<double>(),
                      j["e2el_ms"]["p50"].get<double>(), j["e2el_ms"]["p99"].get<double>(),
                      static_cast<unsigned long long>(r->preemptions), j["slo_attainment"].get<double>(),
                      j["goodput"].get<double>());
        csv += line;
        std::printf("%-10s %-*s %8g %10.3f %12.1f %12.1f %12.1f %10llu\n", policy.c_str(), vw, vtext, rate,
                    j["request_throughput"].get<double>(), j[m]["p50"].get<double>(), j[m]["p99"].get<double>(),
                    j["itl_ms"]["p99"].get<double>(), static_cast<unsigned long long>(r->preemptions));
        p50.x.push_back(rate);
        p50.y.push_back(j[m]["p50"].get<double>());
        p99.x.push_back(rate);
        p99.y.push_back(j[m]["p99"].get<double>());
      }
      series.push_back(p50);
      series.push_back(p99);
    }
  }
  const char* metric_name = f.metric == "ttft"  ? "Time to first token"
                            : f.metric == "itl" ? "Inter-token latency"
                                                : "End-to-end latency";
  std::ofstream(f.out + "/sweep.csv") << csv;
  std::ofstream(f.out + "/sweep.svg") << sim::line_chart_svg(
      std::string(metric_name) + " vs load (" + prep->hw.name.substr(0, prep->hw.name.find(' ')) + ", simulated)",
      "request rate (requests/s)",
      f.metric == "ttft"  ? "TTFT (ms)"
      : f.metric == "itl" ? "ITL (ms)"
                          : "E2E latency (ms)",
      series, true);
  std::printf("wrote %s/sweep.csv and %s/sweep.svg\n", f.out.c_str(), f.out.c_str());
  return 0;
}

}  // namespace

namespace {
void add_common(CLI::App* cmd, SimFlags& f) {
  cmd->add_option("--requests", f.requests, "synthetic workload: number of requests")->capture_default_str();
  cmd->add_option("--cv", f.cv, "inter-arrival coefficient of variation (1: Poisson, else gamma)")
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "random seed (the same seed gives byte-identical outputs)")->capture_default_str();
  cmd->add_option("--prompt-len", f.prompt_len,
                  "prompt lengths: fixed:N, uniform:A:B, lognormal:MU:SIGMA or trace:FILE (a trace's prompt lengths)")
      ->capture_default_str();
  cmd->add_option("--output-len", f.output_len,
                  "output lengths: fixed:N, uniform:A:B, lognormal:MU:SIGMA or trace:FILE (a trace's output lengths)")
      ->capture_default_str();
  cmd->add_option("--prefix-groups", f.prefix_groups, "requests draw one of G shared-prefix groups (0: none)")
      ->capture_default_str();
  cmd->add_option("--prefix-tokens", f.prefix_tokens, "tokens of the shared prefix per group")->capture_default_str();
  cmd->add_option("--priority-levels", f.priority_levels,
                  "priorities drawn uniformly from 0..N-1 (lower runs first under --policy priority)")
      ->capture_default_str();
  cmd->add_option(
      "--trace", f.trace,
      "trace instead of a synthetic workload (sim/examples/): CSV or JSONL (arrival_s, prompt_tokens, "
      "output_tokens, ...), an Azure LLM inference CSV, or ShareGPT JSON (arrivals from --rate/--cv/--seed, "
      "at most --requests conversations)");
  cmd->add_option("--tokenizer", f.tokenizer,
                  "model whose tokenizer counts ShareGPT text (default: 4 bytes per token)");
  cmd->add_option("--model-config", f.model_config,
                  "Hugging Face config.json of the simulated model, or a GGUF file (its header's config)")
      ->capture_default_str();
  cmd->add_option("--hardware", f.hardware, "hardware profile JSON (sim/profiles/)")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", f.max_num_batched_tokens, "token budget per step (as troupe serve)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "cap on running sequences (as troupe serve)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-tokens", f.kv_cache_tokens, "KV-cache capacity in tokens (as troupe serve)")
      ->capture_default_str();
  cmd->add_option("--block-size", f.block_size, "KV block size in tokens (as troupe serve)")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f.no_prefix_caching, "turn automatic prefix caching off (as troupe serve)");
  cmd->add_flag("--no-chunked-prefill", f.no_chunked_prefill,
                "compute each prompt in one step or wait; refuse prompts over the budget (as troupe serve)");
  cmd->add_option(
         "--itl-target-ms", f.itl_target_ms,
         "inter-token latency target: cap a step with streaming requests so that its time, as learned from "
         "the simulated steps, stays within this or three times the decodes' own step (as troupe serve; 0: off)")
      ->capture_default_str();
  cmd->add_option("--speculative-tokens", f.speculative_tokens,
                  "speculative decoding as troupe serve --speculative with --num-speculative-tokens N: the "
                  "production scheduler plans up to N drafts per decoding sequence, accepted at --spec-acceptance "
                  "(0: off)")
      ->capture_default_str();
  cmd->add_option("--spec-acceptance", f.spec_acceptance,
                  "speculation: probability that a draft is accepted once the one before it was (0..1)")
      ->capture_default_str();
  cmd->add_option("--spec-match", f.spec_match,
                  "speculation: probability that a decoding sequence finds drafts in a step (an n-gram match; 0..1)")
      ->capture_default_str();
  cmd->add_option("--pipeline-stages", f.layout.pipeline_stages,
                  "layout: pipeline stages the layers are split over (cost model; one device per stage)")
      ->capture_default_str();
  cmd->add_option("--micro-batches", f.layout.micro_batches,
                  "layout: plans in flight per step through the pipeline (GPipe micro-batches)")
      ->capture_default_str();
  cmd->add_option("--stage-bandwidth", f.layout.stage_bandwidth, "layout: bytes/s between pipeline stages (0: free)")
      ->capture_default_str();
  cmd->add_option("--stage-latency-s", f.layout.stage_latency_s, "layout: seconds per stage-boundary crossing")
      ->capture_default_str();
  cmd->add_option("--ep-degree", f.layout.ep_degree,
                  "layout: expert-parallel devices for a mixture-of-experts model config (attention data-parallel)")
      ->capture_default_str();
  cmd->add_option("--expert-workers", f.layout.expert_workers,
                  "layout: a mixture-of-experts model's routed experts on N expert-worker actors, as troupe serve "
                  "--expert-parallel N runs them (the profile's expert_hop_s / expert_row_s price each MoE layer's "
                  "hand-off; sim calibrate --expert-parallel fits them); 0: inside the stage")
      ->capture_default_str();
  cmd->add_flag("--expert-workers-apart", f.layout.expert_workers_apart,
                "layout: each expert worker on its own device of the profile (default: sharing the stage's device, "
                "as on one machine)");
  cmd->add_option("--all-to-all-bandwidth", f.layout.all_to_all_bandwidth,
                  "layout: bytes/s per device for the expert all-to-alls (0: free)")
      ->capture_default_str();
  cmd->add_option("--expert-imbalance", f.layout.expert_imbalance,
                  "layout: routed tokens on the busiest expert device over the mean (>= 1)")
      ->capture_default_str();
  cmd->add_option("--instances", f.cluster.instances,
                  "serving instances, each with its own scheduler and KV pool; requests go to the least loaded")
      ->capture_default_str();
  cmd->add_option("--prefill-instances", f.cluster.prefill_instances,
                  "disaggregation: instances that compute prompts and first tokens (with --decode-instances)")
      ->capture_default_str();
  cmd->add_option("--decode-instances", f.cluster.decode_instances,
                  "disaggregation: instances that receive the KV cache and generate the rest")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-bandwidth", f.cluster.kv_transfer_bandwidth,
                  "disaggregation: bytes/s of one KV-cache transfer from prefill to decode (0: instant)")
      ->capture_default_str();
  cmd->add_option("--kv-transfer-latency-s", f.cluster.kv_transfer_latency_s,
                  "disaggregation: fixed seconds per KV-cache transfer")
      ->capture_default_str();
  cmd->add_option("--slo-ttft-ms", f.slo_ttft_ms, "SLO on time to first token for goodput (0: none)")
      ->capture_default_str();
  cmd->add_option("--slo-itl-ms", f.slo_itl_ms, "SLO on the worst inter-token latency (0: none)")
      ->capture_default_str();
}
}  // namespace

void add_sim_command(CLI::App& app) {
  auto f = std::make_shared<SimFlags>();
  auto* cmd = app.add_subcommand("sim",
                                 "Simulate scheduling on a virtual clock: the production scheduler and KV-block "
                                 "manager, a roofline step-cost model, synthetic or trace workloads");
  add_common(cmd, *f);
  cmd->add_option("--rate", f->rate, "synthetic workload: mean arrival rate (requests/s)")->capture_default_str();
  cmd->add_option("--policy", f->policy, "fcfs or priority (as troupe serve)")->capture_default_str();
  cmd->add_flag("--log-decisions", f->log_decisions, "write every step's scheduling decisions to OUT/decisions.log");
  cmd->add_option("--out", f->out, "output folder: summary.json, requests.csv");
  auto sf = std::make_shared<SimFlags>();
  auto* sweep = cmd->add_subcommand("sweep",
                                    "Run the same workload over several request rates and policies; writes "
                                    "OUT/sweep.csv and an SVG plot of TTFT percentiles vs load, one line per policy");
  add_common(sweep, *sf);
  sweep->add_option("--rates", sf->rates, "request rates (requests/s), comma-separated")->delimiter(',')->required();
  sf->policies = {"fcfs", "priority"};
  sweep->add_option("--policies", sf->policies, "policies, comma-separated")->delimiter(',')->capture_default_str();
  sweep->add_option("--param", sf->param,
                    "also vary one flag: max-num-batched-tokens, max-num-seqs, kv-cache-tokens, block-size, "
                    "chunked-prefill or prefix-caching (0 off, 1 on), pipeline-stages, micro-batches, ep-degree, "
                    "expert-workers, instances, prefill-instances or decode-instances; one line per value");
  sweep->add_option("--values", sf->values, "the values of --param, comma-separated")->delimiter(',');
  sweep->add_option("--metric", sf->metric, "latency to plot: ttft, itl or e2el")->capture_default_str();
  sweep->add_option("--out", sf->out, "output folder")->required();
  sweep->callback([sf] { set_exit_code(run_sweep(*sf)); });
  add_sim_calibrate(*cmd);
  add_sim_validate(*cmd);
  cmd->callback([f, cmd] {
    if (!cmd->get_subcommands().empty()) return;  // sweep, calibrate or validate ran
    set_exit_code(run_sim(*f));
  });
}

}  // namespace troupe::app
