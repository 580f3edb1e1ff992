// sim/: the simulator runs the production scheduler and KV-block manager (its decisions
// equal a direct Scheduler run on the same arrivals, and change with a policy parameter
// exactly as the real scheduler's do), is deterministic, prices steps by the roofline, and
// reads its trace formats.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/model_files.h"
#include "sim/simulator.h"
#include "tests/test_util.h"

using namespace troupe;
using namespace troupe::sim;

namespace {

ModelConfig smollm2() {
  auto c = read_hf_config(test::source_dir() + "/configs/smollm2-135m.json");
  if (!c) FAIL(c.error().message);
  return *c;
}

HardwareProfile profile(const std::string& name) {
  auto p = load_profile(test::source_dir() + "/sim/profiles/" + name + ".json");
  if (!p) FAIL(p.error().message);
  return *p;
}

SimConfig config(int32_t budget, int32_t kv_tokens, bool prefix = true) {
  SimConfig c;
  c.scheduler = {budget, 16};
  c.kv = kv_config_for_tokens(kv_tokens, 16, prefix);
  c.log_decisions = true;
  return c;
}

std::vector<SimRequest> workload(uint64_t seed, int64_t n = 200, double rate = 20) {
  SyntheticSpec s;
  s.num_requests = n;
  s.rate = rate;
  s.seed = seed;
  s.prompt = {"uniform", 16, 400};
  s.output = {"uniform", 4, 60};
  auto r = synthetic(s);
  REQUIRE(r.ok());
  return *r;
}

// The same decisions taken by a bare Scheduler + KvBlockManager for requests that all
// arrive at time 0 (no clock needed).
std::vector<std::string> direct_decisions(const std::vector<SimRequest>& reqs, const SimConfig& cfg) {
  KvBlockManager kv(cfg.kv);
  Scheduler sched(cfg.scheduler, kv, SchedulingPolicy::fcfs());
  for (const auto& q : reqs) REQUIRE(sched.add({q.id, prompt_tokens_of(q), q.output_tokens, q.priority}).ok());
  std::vector<std::string> log;
  for (uint64_t step = 0; sched.num_running() + sched.num_waiting() > 0; ++step) {
    StepPlan plan = sched.schedule();
    REQUIRE_FALSE(plan.seqs.empty());
    std::ostringstream line;
    line << step << ":";
    std::vector<int32_t> sampled;
    for (const auto& s : plan.seqs) {
      line << " " << s.id << "+" << s.num_new << (s.samples ? "*" : "");
      if (s.samples) sampled.push_back(7);
    }
    for (int64_t id : plan.preempted) line << " preempt " << id;
    log.push_back(line.str());
    sched.update(plan, sampled, [](int64_t, int32_t) { return false; });
  }
  return log;
}

}  // namespace

TEST_CASE("sim: decisions are the production scheduler's, and follow its parameters", "[sim]") {
  auto reqs = workload(3, 40);
  for (auto& r : reqs) r.arrival_s = 0;
  const CostModel cost(smollm2(), profile("cpu-local"));
  for (int32_t budget : {64, 512}) {
    const SimConfig cfg = config(budget, 2048);
    auto r = simulate(reqs, cfg, cost);
    REQUIRE(r.ok());
    INFO("token budget " << budget);
    CHECK(r->decisions == direct_decisions(reqs, cfg));
    CHECK(r->preemptions > 0);  // 40 requests over a 2048-token pool
  }
  auto small = simulate(reqs, config(64, 2048), cost), large = simulate(reqs, config(512, 2048), cost);
  CHECK(small->decisions != large->decisions);
  CHECK(small->steps > large->steps);
}

TEST_CASE("sim: the same inputs and seed give byte-identical outputs", "[sim]") {
  const CostModel cost(smollm2(), profile("cpu-local"));
  auto a = simulate(workload(7), config(256, 8192), cost);
  auto b = simulate(workload(7), config(256, 8192), cost);
  auto c = simulate(workload(8), config(256, 8192), cost);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(requests_csv(*a) == requests_csv(*b));
  CHECK(summary_json(*a, {}) == summary_json(*b, {}));
  CHECK(requests_csv(*a) != requests_csv(*c));
  for (const auto& q : a->requests) {
    CHECK_FALSE(q.rejected);
    CHECK(q.generated == q.output_tokens);
    CHECK(q.first_token > q.arrival);
    CHECK(q.finish >= q.first_token);
  }
}

TEST_CASE("sim: the roofline prices decode by bytes and long prefill by FLOPs", "[sim]") {
  const ModelConfig m = smollm2();
  HardwareProfile hw = profile("h200");
  hw.step_overhead_s = 0;
  const CostModel cost(m, hw);
  // One decode token at a short context: the weights dominate and the step is memory-bound.
  const std::vector<SeqShape> decode = {{16, 1, true}};
  const double t_decode = cost.step_seconds(decode);
  CHECK(t_decode == Approx(cost.bytes(decode) / (hw.mem_bandwidth * hw.bw_efficiency)));
  CHECK(cost.bytes(decode) > 2.0 * 1.3e8);  // about 135M parameters of 2 bytes
  // 16k prefill tokens: compute-bound.
  const std::vector<SeqShape> prefill = {{0, 16384, true}};
  CHECK(cost.step_seconds(prefill) == Approx(cost.flops(prefill) / (hw.peak_flops * hw.flops_efficiency)));
  // Attention FLOPs grow with the context already cached.
  CHECK(cost.flops({{4096, 1, true}}) > cost.flops({{16, 1, true}}));
}

TEST_CASE("sim: prefix caching and KV pressure show in the results", "[sim]") {
  const CostModel cost(smollm2(), profile("cpu-local"));
  SyntheticSpec s;
  s.num_requests = 100;
  s.rate = 50;
  s.seed = 1;
  s.prompt = {"fixed", 600, 0};
  s.output = {"fixed", 8, 0};
  s.num_prefix_groups = 2;
  s.prefix_tokens = 512;
  auto reqs = synthetic(s);
  REQUIRE(reqs.ok());
  auto on = simulate(*reqs, config(512, 32768, true), cost);
  auto off = simulate(*reqs, config(512, 32768, false), cost);
  REQUIRE(on.ok());
  REQUIRE(off.ok());
  CHECK(on->prefix_hits > 0);
  CHECK(off->prefix_hits == 0);
  CHECK(on->steps < off->steps);
  const auto jon = nlohmann::json::parse(summary_json(*on, {})), joff = nlohmann::json::parse(summary_json(*off, {}));
  CHECK(jon["ttft_ms"]["p50"].get<double>() < joff["ttft_ms"]["p50"].get<double>());
  // Two prompts fit the pool but not their outputs: preemption, yet everyone finishes.
  s.num_requests = 20;
  s.output = {"fixed", 200, 0};
  auto grow = synthetic(s);
  REQUIRE(grow.ok());
  auto tight = simulate(*grow, config(512, 1280, false), cost);
  REQUIRE(tight.ok());
  CHECK(tight->preemptions > 0);
  for (const auto& q : tight->requests) CHECK(q.finish > 0);
}

TEST_CASE("sim: trace files, bad inputs and requests that can never fit", "[sim][badinput]") {
  auto csv = read_trace(test::source_dir() + "/sim/examples/trace.csv");
  auto jsonl = read_trace(test::source_dir() + "/sim/examples/trace.jsonl");
  REQUIRE(csv.ok());
  REQUIRE(jsonl.ok());
  REQUIRE(csv->size() == 5);
  REQUIRE(jsonl->size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CHECK((*csv)[i].arrival_s == (*jsonl)[i].arrival_s);
    CHECK((*csv)[i].prompt_tokens == (*jsonl)[i].prompt_tokens);
    CHECK((*csv)[i].prefix_group == (*jsonl)[i].prefix_group);
  }
  // An Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens).
  auto azure = read_trace(test::source_dir() + "/sim/examples/azure_llm_inference_2023.csv");
  REQUIRE(azure.ok());
  REQUIRE(azure->size() == 5);
  CHECK((*azure)[0].arrival_s == 0);
  CHECK((*azure)[1].arrival_s == Approx(4.314579).margin(1e-5));
  CHECK((*azure)[2].prompt_tokens == 879);
  CHECK((*azure)[4].output_tokens == 99);
  const std::string bad = "/tmp/troupe_sim_bad_" + std::to_string(::getpid()) + ".csv";
  for (const char* text : {"arrival_s,prompt_tokens\n0,5\n", "arrival_s,prompt_tokens,output_tokens\n0,x,5\n",
                           "arrival_s,prompt_tokens,output_tokens\n-1,5,5\n", "arrival_s,prompt_tokens,output_tokens\n0,0,5\n",
                           "arrival_s,prompt_tokens,output_tokens\n0,5\n",
                           "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00.0,5,5\n",
                           "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n"}) {
    std::ofstream(bad) << text;
    INFO(text);
    CHECK_FALSE(read_trace(bad).ok());
  }
  std::remove(bad.c_str());
  CHECK_FALSE(read_trace("/nonexistent/trace.csv").ok());
  CHECK_FALSE(parse_length("zipf:3").ok());
  CHECK_FALSE(parse_length("uniform:10:5").ok());
  SyntheticSpec s;
  s.rate = 0;
  CHECK_FALSE(synthetic(s).ok());
  // The 2048-token request can never fit a 1024-token pool: refused, the others complete.
  const CostModel cost(smollm2(), profile("cpu-local"));
  auto r = simulate(*csv, config(512, 1024), cost);
  REQUIRE(r.ok());
  int rejected = 0;
  for (const auto& q : r->requests) {
    if (q.rejected) ++rejected;
    else CHECK(q.finish > 0);
  }
  CHECK(rejected == 1);
  CHECK_FALSE(load_profile("/nonexistent.json").ok());
}
