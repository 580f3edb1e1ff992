// The discrete-event simulator: arrivals on a virtual clock feed the production Scheduler
// and KvBlockManager (runtime/, unchanged, with the same config structs as `troupe serve`);
// each step's plan is priced by the cost model instead of running a model. Records every
// request (arrival, first token, each token's time, finish, preemptions) and can log each
// scheduling decision. Deterministic: no wall clock, no unordered iteration.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "runtime/sched/scheduler.h"
#include "sim/cost_model.h"
#include "sim/workload.h"

namespace troupe::sim {

struct SimConfig {
  SchedulerConfig scheduler;
  KvBlockConfig kv;
  std::string policy = "fcfs";  // fcfs | priority
  bool log_decisions = false;
  // Speculative decoding (scheduler.num_speculative_tokens > 0): a decoding sequence finds
  // drafts in a step with probability spec_match (an n-gram match), and each draft is
  // accepted with probability spec_acceptance once the one before it was (seeded by the
  // request and position, so a run is reproducible). The production scheduler plans them.
  double spec_acceptance = 0.7, spec_match = 1.0;
};

struct RequestRecord {
  int64_t id = 0;
  double arrival = 0, first_token = -1, finish = -1;
  int32_t prompt_tokens = 0, output_tokens = 0, generated = 0, preemptions = 0, priority = 0;
  std::vector<double> token_times;
  bool rejected = false;  // refused at admission (could never fit)
};

struct SimResult {
  std::vector<RequestRecord> requests;
  uint64_t steps = 0, preemptions = 0, prefix_queries = 0, prefix_hits = 0;
  uint64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;  // speculative drafts fed and accepted
  double duration_s = 0;
  double mean_kv_usage = 0;  // time-weighted
  double peak_kv_usage = 0;
  std::vector<std::string> decisions;  // one line per step when log_decisions
};

Result<SimResult> simulate(const std::vector<SimRequest>& requests, const SimConfig& cfg, const CostModel& cost);

// One record per request (arrival, lengths, priority) in `out`, and the index of each
// request id; refuses requests out of arrival order or with duplicate ids.
Result<std::map<int64_t, size_t>> init_records(const std::vector<SimRequest>& requests, SimResult& out);

// Token ids a request's prompt holds: its prefix group's shared tokens, then its own.
std::vector<int32_t> prompt_tokens_of(const SimRequest& r);

struct Slo {
  double ttft_ms = 0, itl_ms = 0;  // 0: no bound
};
// Summary in the schema of bench/serve/bench_serve.py's JSON, plus goodput, SLO
// attainment, KV usage and preemptions.
std::string summary_json(const SimResult& r, const Slo& slo);
std::string requests_csv(const SimResult& r);

}  // namespace troupe::sim
