// sim/: the simulator runs the production scheduler and KV-block manager on the serving
// path (its decisions equal the scheduler actor's KV rounds on the same arrivals, and change with a policy parameter
// exactly as the real scheduler's do), is deterministic, prices steps by the roofline, and
// reads its trace formats.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <sstream>

#include "runtime/model/model_files.h"
#include "runtime/sched/kv_round.h"
#include "sim/calibrate.h"
#include "sim/cluster.h"
#include "sim/simulator.h"
#include "sim/step_log.h"
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
  s.prompt = {"uniform", 16, 400, {}};
  s.output = {"uniform", 4, 60, {}};
  auto r = synthetic(s);
  REQUIRE(r.ok());
  return *r;
}

// The decisions `troupe serve`'s scheduler actor takes (actors/scheduler_actor.cpp:
// maybe_step, send_kv, on_kv_reply), its event order written out here for requests that
// all arrive at time 0: plan against the ledger, one KV round per plan (applied at the
// block manager), rounds without a plan for frees and hints, hints fetched while a step
// runs, then the step's tokens.
std::vector<std::string> serving_decisions(const std::vector<SimRequest>& reqs, const SimConfig& cfg) {
  KvBlockManager owner(cfg.kv);
  KvLedger ledger(cfg.kv, cfg.scheduler.chunked_prefill);
  Scheduler sched(cfg.scheduler, ledger, SchedulingPolicy::fcfs());
  for (const auto& q : reqs) REQUIRE(sched.add({q.id, prompt_tokens_of(q), q.output_tokens, q.priority}).ok());
  uint64_t batch = 0;
  auto round = [&](StepPlan& plan) {
    KvOpsRequest req = make_kv_request(ledger, sched, plan, ++batch);
    const KvOpsReply reply = apply_kv_ops(owner, req);
    REQUIRE(owner.check_invariants().ok());
    REQUIRE(finish_kv_round(ledger, sched, plan, kv_ops_for_settle(req.ops), reply).ok());
  };
  std::vector<std::string> log;
  int idle = 0;
  for (uint64_t step = 0; sched.num_running() + sched.num_waiting() > 0;) {
    StepPlan plan = sched.schedule();
    if (plan.seqs.empty()) REQUIRE((ledger.has_pending() || kv_hints_missing(ledger, sched)));
    round(plan);
    if (plan.seqs.empty()) {
      REQUIRE(++idle < 3);
      continue;
    }
    idle = 0;
    std::ostringstream line;
    line << step++ << ":";
    std::vector<int32_t> sampled;
    for (const auto& s : plan.seqs) {
      line << " " << s.id << "+" << s.num_new << (s.samples ? "*" : "");
      if (s.samples) sampled.push_back(7);
    }
    for (int64_t id : plan.preempted) line << " preempt " << id;
    log.push_back(line.str());
    if (kv_hints_missing(ledger, sched)) {
      StepPlan none;
      round(none);
    }
    sched.update(plan, sampled, [](int64_t, int32_t) { return false; });
  }
  StepPlan last;  // the last step's frees
  round(last);
  REQUIRE(owner.num_free_blocks() == cfg.kv.num_blocks);
  return log;
}

}  // namespace

TEST_CASE("sim: decisions are the serving path's (the scheduler actor's KV rounds), and follow its parameters",
          "[sim]") {
  auto reqs = workload(3, 40);
  for (auto& r : reqs) r.arrival_s = 0;
  const CostModel cost(smollm2(), profile("cpu-local"));
  for (int32_t budget : {64, 512}) {
    const SimConfig cfg = config(budget, 2048);
    auto r = simulate(reqs, cfg, cost);
    REQUIRE(r.ok());
    INFO("token budget " << budget);
    CHECK(r->decisions == serving_decisions(reqs, cfg));
    CHECK(r->preemptions > 0);  // 40 requests over a 2048-token pool
  }
  auto small = simulate(reqs, config(64, 2048), cost), large = simulate(reqs, config(512, 2048), cost);
  CHECK(small->decisions != large->decisions);
  CHECK(small->steps > large->steps);
}

TEST_CASE("sim: the latency target caps streaming steps (the production scheduler's rule)", "[sim]") {
  // One request a second (prompts of 16-400 tokens) on the 2-core CPU profile, where a
  // 512-token step costs most of a second: new prompts keep arriving beside streams.
  const auto reqs = workload(5, 100, 1.0);
  const CostModel cost(smollm2(), profile("cpu-local"));
  SimConfig off = config(512, 32768), on = off;
  on.scheduler.itl_target_s = 0.1;
  auto a = simulate(reqs, off, cost), b = simulate(reqs, on, cost);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto again = simulate(reqs, on, cost);  // learned from the cost model's prices: deterministic
  REQUIRE(again.ok());
  CHECK(again->decisions == b->decisions);
  const auto ja = nlohmann::json::parse(summary_json(*a, {})), jb = nlohmann::json::parse(summary_json(*b, {}));
  const double itl_off = ja["itl_ms"]["p99"], itl_on = jb["itl_ms"]["p99"];
  INFO("ITL p99 without the target " << itl_off << " ms, with 100 ms " << itl_on << " ms");
  CHECK(itl_on < 0.5 * itl_off);
  // Total work is the same: the target moves time from stalls into smaller chunks.
  CHECK(double(jb["duration_s"]) < 1.15 * double(ja["duration_s"]));
  CHECK(b->steps > a->steps);
  for (const auto& q : b->requests) CHECK(q.generated == q.output_tokens);
}

TEST_CASE("sim: speculation through the production scheduler, priced by its logit rows", "[sim][spec]") {
  // A few requests at a low rate (decode-bound, as one client): drafts accepted almost
  // always take fewer steps and less time per token; drafts never accepted turn themselves
  // off (the goodput rule) and cost little; every request still gets exactly its tokens.
  const auto reqs = workload(9, 6, 0.2);
  const CostModel cost(smollm2(), profile("cpu-avx512"));
  SimConfig off = config(512, 32768), good = off, bad = off;
  good.scheduler.num_speculative_tokens = bad.scheduler.num_speculative_tokens = 7;
  good.spec_acceptance = 0.95;
  bad.spec_acceptance = 0;
  auto a = simulate(reqs, off, cost), g = simulate(reqs, good, cost), b = simulate(reqs, bad, cost);
  REQUIRE(a.ok());
  REQUIRE(g.ok());
  REQUIRE(b.ok());
  auto again = simulate(reqs, good, cost);
  REQUIRE(again.ok());
  CHECK(again->decisions == g->decisions);  // seeded: reproducible
  for (const auto* r : {&*a, &*g, &*b})
    for (const auto& q : r->requests) CHECK(q.generated == q.output_tokens);
  const auto ja = nlohmann::json::parse(summary_json(*a, {})), jg = nlohmann::json::parse(summary_json(*g, {})),
             jb = nlohmann::json::parse(summary_json(*b, {}));
  const double tpot_off = ja["tpot_ms"]["p50"], tpot_good = jg["tpot_ms"]["p50"], tpot_bad = jb["tpot_ms"]["p50"];
  INFO("TPOT p50: off " << tpot_off << " ms, acceptance 0.95 " << tpot_good << " ms, acceptance 0 " << tpot_bad
                        << " ms; steps " << a->steps << " / " << g->steps << " / " << b->steps);
  CHECK(g->spec_accepted_tokens > 0);
  CHECK(g->spec_accepted_tokens <= g->spec_draft_tokens);
  CHECK(g->steps < a->steps / 2);
  CHECK(tpot_good < 0.75 * tpot_off);
  CHECK(b->spec_accepted_tokens == 0);
  CHECK(b->spec_draft_tokens < 200);  // off after a few tries (and an exploring draft now and then)
  CHECK(tpot_bad < 1.1 * tpot_off);
  // A speculative step's logit rows are priced: the same tokens with drafts cost more.
  const double plain = cost.step_seconds({{300, 8, true, 0}}), drafted = cost.step_seconds({{300, 8, true, 7}});
  CHECK(drafted > plain);
  SimConfig wrong = good;
  wrong.spec_acceptance = 1.5;
  CHECK_FALSE(simulate(reqs, wrong, cost).ok());
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
  s.prompt = {"fixed", 600, 0, {}};
  s.output = {"fixed", 8, 0, {}};
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
  s.output = {"fixed", 200, 0, {}};
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
  for (const char* text :
       {"arrival_s,prompt_tokens\n0,5\n", "arrival_s,prompt_tokens,output_tokens\n0,x,5\n",
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
    if (q.rejected)
      ++rejected;
    else
      CHECK(q.finish > 0);
  }
  CHECK(rejected == 1);
  CHECK_FALSE(load_profile("/nonexistent.json").ok());
}

TEST_CASE("sim: chunked prefill off runs the production scheduler's rule", "[sim]") {
  const CostModel cost(smollm2(), profile("cpu-local"));
  std::vector<SimRequest> reqs = workload(3, 60);
  for (auto& r : reqs) r.arrival_s = 0;
  SimConfig chunked = config(512, 1 << 16), whole = chunked;
  whole.scheduler.chunked_prefill = false;
  auto a = simulate(reqs, chunked, cost);
  auto b = simulate(reqs, whole, cost);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(b->decisions == serving_decisions(reqs, whole));
  CHECK(a->decisions != b->decisions);
  // Without chunks no prompt is split: every first appearance of a request is its whole prompt.
  std::map<int64_t, int> first_new;
  for (const auto& line : b->decisions) {
    std::istringstream in(line.substr(line.find(':') + 1));
    for (std::string tok; in >> tok;) {
      const auto plus = tok.find('+');
      if (plus == std::string::npos) continue;
      const int64_t id = std::stoll(tok.substr(0, plus));
      if (!first_new.count(id)) first_new[id] = std::stoi(tok.substr(plus + 1));
    }
  }
  for (const auto& r : reqs) CHECK(first_new[r.id] == r.prompt_tokens);
}

TEST_CASE("sim calibrate: the fit recovers a profile from the step times it predicts", "[sim]") {
  const ModelConfig m = smollm2();
  HardwareProfile truth = profile("cpu-local");
  truth.flops_efficiency = 0.42;
  truth.attention_efficiency = 0.07;
  truth.bw_efficiency = 0.5;
  truth.kv_bw_efficiency = 0.1;
  truth.step_overhead_s = 0.003;
  truth.sample_overhead_s = 0.001;
  truth.overlap = false;
  const CostModel cm(m, truth);
  std::vector<StepSample> samples;
  for (int p : {16, 64, 200, 512}) samples.push_back({{{0, p, true}}, 0});
  for (int b : {1, 3, 8, 24, 48})
    for (int ctx : {40, 300, 1500})
      samples.push_back({std::vector<SeqShape>(static_cast<size_t>(b), SeqShape{ctx, 1, true}), 0});
  samples.push_back({{{900, 256, false}, {100, 1, true}, {120, 1, true}}, 0});
  for (auto& s : samples) s.seconds = cm.step_seconds(s.seqs);
  HardwareProfile start = profile("cpu-local");
  auto fit = fit_profile(m, start, samples);
  REQUIRE(fit.ok());
  CHECK(fit->max_abs_error < 0.02);
  CHECK_FALSE(fit->profile.overlap);
  CHECK(fit->profile.flops_efficiency == Approx(truth.flops_efficiency).epsilon(0.1));
  // (Without overlap, the per-step overhead and the weights' streaming time are both constant
  // per step: only their sum is identified, so check predictions on shapes it never saw.)
  const CostModel fitted(m, fit->profile);
  for (const auto& unseen : {std::vector<SeqShape>{{0, 333, true}}, std::vector<SeqShape>(5, SeqShape{2000, 1, true}),
                             std::vector<SeqShape>{{64, 100, false}, {10, 1, true}}})
    CHECK(fitted.step_seconds(unseen) == Approx(cm.step_seconds(unseen)).epsilon(0.03));
  CHECK(fit->profile.peak_flops == start.peak_flops);  // peaks and sizes come from the base
  // Times 30% slower than the profile: the fit follows, the old profile does not.
  for (auto& s : samples) s.seconds *= 1.3;
  auto slower = fit_profile(m, start, samples);
  REQUIRE(slower.ok());
  CHECK(slower->median_abs_error < 0.02);
  std::vector<double> old = relative_errors(m, truth, samples);
  CHECK(old[0] > 0.2);
  CHECK_FALSE(fit_profile(m, start, {samples[0]}).ok());
  samples[1].seconds = 0;
  CHECK_FALSE(fit_profile(m, start, samples).ok());
}

TEST_CASE("sim: ShareGPT, Azure 2024 and trace-drawn lengths", "[sim]") {
  const std::string path = test::source_dir() + "/sim/examples/sharegpt.json";
  SyntheticSpec arrivals;
  arrivals.num_requests = 0;
  arrivals.rate = 4;
  auto sg = read_sharegpt(path, estimate_tokens, arrivals);
  REQUIRE(sg.ok());
  // Independently: the first human turn and the reply after it, 4 bytes per token.
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);
  REQUIRE(sg->size() == j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& turns = j[i]["conversations"];
    size_t k = 0;
    while (turns[k]["from"] != "human" || turns[k + 1]["from"] != "gpt") ++k;
    CHECK((*sg)[i].prompt_tokens == static_cast<int32_t>((turns[k]["value"].get<std::string>().size() + 3) / 4));
    CHECK((*sg)[i].output_tokens == static_cast<int32_t>((turns[k + 1]["value"].get<std::string>().size() + 3) / 4));
    if (i) CHECK((*sg)[i].arrival_s > (*sg)[i - 1].arrival_s);
  }
  arrivals.num_requests = 5;
  auto five = read_sharegpt(
      path, [](std::string_view) { return 7; }, arrivals);
  REQUIRE(five.ok());
  REQUIRE(five->size() == 5);
  CHECK((*five)[4].prompt_tokens == 7);
  const std::string bad = "/tmp/troupe_sim_bad_" + std::to_string(::getpid()) + ".json";
  for (const char* text : {"{}", "[1, 2]", "[{\"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}]}]", "[{"}) {
    std::ofstream(bad) << text;
    INFO(text);
    CHECK_FALSE(read_sharegpt(bad, estimate_tokens, arrivals).ok());
  }
  std::remove(bad.c_str());
  // The 2024 Azure release: timestamps with a UTC offset.
  auto az = read_trace(test::source_dir() + "/sim/examples/azure_llm_inference_2024.csv");
  REQUIRE(az.ok());
  REQUIRE(az->size() == 10);
  CHECK(az->back().arrival_s == Approx(3.107472).margin(1e-5));
  CHECK((*az)[3].prompt_tokens == 4621);
  // trace:FILE draws lengths from a trace's own.
  auto pl = parse_length("trace:" + test::source_dir() + "/sim/examples/validate-cpu.csv", false);
  auto ol = parse_length("trace:" + test::source_dir() + "/sim/examples/validate-cpu.csv", true);
  REQUIRE(pl.ok());
  REQUIRE(ol.ok());
  SyntheticSpec s;
  s.num_requests = 300;
  s.prompt = *pl;
  s.output = *ol;
  auto w = synthetic(s);
  REQUIRE(w.ok());
  std::set<int32_t> prompts(pl->samples.begin(), pl->samples.end()), outputs(ol->samples.begin(), ol->samples.end());
  std::set<int32_t> drawn;
  for (const auto& r : *w) {
    CHECK(prompts.count(r.prompt_tokens) == 1);
    CHECK(outputs.count(r.output_tokens) == 1);
    drawn.insert(r.prompt_tokens);
  }
  CHECK(drawn.size() > prompts.size() / 2);
  CHECK_FALSE(parse_length("trace:/nonexistent.csv").ok());
}

TEST_CASE("sim layouts: pipeline stages with plans in flight, experts over devices", "[sim]") {
  const ModelConfig m = smollm2();
  HardwareProfile hw = profile("h200");
  hw.step_overhead_s = 0;
  const std::vector<SeqShape> decode(64, SeqShape{500, 1, true});
  const std::vector<SeqShape> prefill(4, SeqShape{0, 4096, true});
  const CostModel one(m, hw);
  // P stages, one plan in flight, free links: the same work one stage after another.
  Layout pp;
  pp.pipeline_stages = 5;
  REQUIRE(check_layout(pp, m).ok());
  CHECK(CostModel(m, hw, pp).step_seconds(decode) == Approx(one.step_seconds(decode)));
  // Links cost tokens x hidden x 2 bytes per boundary (P - 1 of them).
  pp.stage_bandwidth = 1e9;
  CHECK(CostModel(m, hw, pp).step_seconds(decode) == Approx(one.step_seconds(decode) + 4 * 64.0 * m.hidden * 2 / 1e9));
  // Compute-bound prefill: micro-batches overlap the stages and finish sooner.
  pp.stage_bandwidth = 0;
  pp.micro_batches = 4;
  const double piped = CostModel(m, hw, pp).step_seconds(prefill);
  CHECK(piped < 0.6 * one.step_seconds(prefill));
  CHECK(piped == Approx(one.step_seconds(prefill) / 5 * (4 + 4) / 4));  // (M + P - 1) / (M P)
  pp.pipeline_stages = 31;
  CHECK_FALSE(check_layout(pp, m).ok());

  // Mixtral 8x7B: the experts come from the config; EP shards them.
  auto mix = read_hf_config(test::source_dir() + "/configs/mixtral-8x7b.json", true);
  REQUIRE(mix.ok());
  Layout ep;
  REQUIRE(read_moe_fields(test::source_dir() + "/configs/mixtral-8x7b.json", ep).ok());
  CHECK(ep.num_experts == 8);
  CHECK(ep.experts_per_token == 2);
  CHECK(ep.expert_ffn == 14336);
  REQUIRE(check_layout(ep, *mix).ok());
  const CostModel dense_ep(*mix, hw, ep);
  CHECK(dense_ep.weight_bytes() / 2 == Approx(46.7e9).epsilon(0.02));  // Mixtral's 46.7B parameters
  const double t1 = dense_ep.step_seconds(prefill);
  ep.ep_degree = 4;
  REQUIRE(check_layout(ep, *mix).ok());
  const double t4 = CostModel(*mix, hw, ep).step_seconds(prefill);
  CHECK(t4 < 0.3 * t1);
  ep.expert_imbalance = 2;
  const double skewed = CostModel(*mix, hw, ep).step_seconds(prefill);
  CHECK(skewed > t4);
  ep.all_to_all_bandwidth = 1e11;
  CHECK(CostModel(*mix, hw, ep).step_seconds(prefill) > skewed);
  ep.ep_degree = 3;
  CHECK_FALSE(check_layout(ep, *mix).ok());
  ep.ep_degree = 1;
  ep.pipeline_stages = 2;  // pipelines are modelled for dense models only
  CHECK_FALSE(check_layout(ep, *mix).ok());
  Layout dense;
  dense.ep_degree = 2;
  CHECK_FALSE(check_layout(dense, m).ok());
}

TEST_CASE("sim cost model: expert workers and their hand-off", "[sim][moe]") {
  // An OLMoE-shaped model given by its own config (as a GGUF's header gives it).
  ModelConfig m = smollm2();
  m.hidden = 2048;
  m.num_heads = m.num_kv_heads = 16;
  m.head_dim = 128;
  m.num_layers = 4;
  m.moe.num_experts = 64;
  m.moe.experts_per_tok = 8;
  m.moe.expert_ffn = 1024;
  HardwareProfile hw = profile("cpu-local");
  const std::vector<SeqShape> decode(4, SeqShape{100, 1, true});
  const std::vector<SeqShape> prefill{{0, 512, true}};
  // The config's experts fill an empty layout: the same as naming them.
  Layout named;
  named.num_experts = 64;
  named.experts_per_token = 8;
  named.expert_ffn = 1024;
  const CostModel from_config(m, hw), from_layout(m, hw, named);
  CHECK(from_config.layout().num_experts == 64);
  CHECK(from_config.step_seconds(prefill) == from_layout.step_seconds(prefill));
  CHECK(from_config.weight_bytes() == from_layout.weight_bytes());
  // A shared expert is priced in every token's dense part.
  ModelConfig shared = m;
  shared.moe.shared_ffn = 4096;
  CHECK(CostModel(shared, hw).step_seconds(prefill) > from_config.step_seconds(prefill));

  // The busiest of W workers under uniform routing: all rows for one, about a W-th of many.
  CHECK(busiest_worker_rows(10, 8, 64, 1) == 80);
  CHECK(busiest_worker_rows(1, 8, 64, 2) > 4);
  CHECK(busiest_worker_rows(1, 8, 64, 2) <= 8);
  CHECK(busiest_worker_rows(4096, 8, 64, 2) == Approx(4096 * 4).epsilon(0.02));
  CHECK(busiest_worker_rows(16, 8, 64, 4) > busiest_worker_rows(16, 8, 64, 2) / 2);
  CHECK(busiest_worker_rows(1, 1, 2, 2) <= 1);

  // Expert workers: the hand-off adds L (hop + rows x row cost) exactly.
  Layout w1;
  w1.expert_workers = 1;
  REQUIRE(check_layout(w1, m).ok());
  const double base1 = CostModel(m, hw, w1).step_seconds(decode);
  HardwareProfile hop = hw;
  hop.expert_hop_s = 1e-4;
  hop.expert_row_s = 2e-6;
  CHECK(CostModel(m, hop, w1).step_seconds(decode) == Approx(base1 + 4 * (1e-4 + 2e-6 * 4 * 8)));
  // Sharing one machine, two workers each have half of it: no faster than one; apart they
  // split the routed work.
  Layout w2 = w1;
  w2.expert_workers = 2;
  const double shared2 = CostModel(m, hw, w2).step_seconds(prefill);
  CHECK(shared2 >= CostModel(m, hw, w1).step_seconds(prefill) * 0.999);
  w2.expert_workers_apart = true;
  CHECK(CostModel(m, hw, w2).step_seconds(prefill) < 0.8 * shared2);
  // Bad layouts.
  Layout bad = w1;
  bad.ep_degree = 2;
  CHECK_FALSE(check_layout(bad, m).ok());
  bad = w1;
  bad.expert_workers = 65;
  CHECK_FALSE(check_layout(bad, m).ok());
  CHECK_FALSE(check_layout(w1, smollm2()).ok());

  // The hand-off fit recovers a known hop and row cost from steps the model itself priced.
  std::vector<StepSample> samples;
  for (int b : {1, 2, 4, 16, 48}) samples.push_back({std::vector<SeqShape>(b, SeqShape{64, 1, true}), 0});
  for (int n : {32, 128, 512}) samples.push_back({{SeqShape{0, n, true}}, 0});
  HardwareProfile truth = hw;
  truth.expert_hop_s = 3e-4;
  truth.expert_row_s = 1.5e-6;
  for (auto& s : samples) s.seconds = CostModel(m, truth, w1).step_seconds(s.seqs);
  auto fit = fit_expert_handoff(m, hw, w1, samples);
  REQUIRE(fit.ok());
  CHECK(fit->profile.expert_hop_s == Approx(3e-4).epsilon(1e-6));
  CHECK(fit->profile.expert_row_s == Approx(1.5e-6).epsilon(1e-6));
  CHECK(fit->max_abs_error < 1e-9);
  CHECK(fit->profile.flops_efficiency == hw.flops_efficiency);  // the base is held
  // Steps no slower than the base: nothing to add, and never a negative cost.
  for (auto& s : samples) s.seconds = CostModel(m, hw, w1).step_seconds(s.seqs) * 0.9;
  fit = fit_expert_handoff(m, hw, w1, samples);
  REQUIRE(fit.ok());
  CHECK(fit->profile.expert_hop_s == 0);
  CHECK(fit->profile.expert_row_s == 0);
  CHECK_FALSE(fit_expert_handoff(m, hw, Layout{}, samples).ok());
  samples.resize(3);
  CHECK_FALSE(fit_expert_handoff(m, hw, w1, samples).ok());

  // The profile keeps the fitted hand-off and the engine's own overheads.
  HardwareProfile saved = fit.ok() ? fit->profile : hop;
  saved.expert_hop_s = 1e-4;
  saved.engine_step_overhead_s = 1e-3;
  saved.step_overhead_s = 2e-3;
  const std::string path = "/tmp/troupe_sim_hw_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << profile_json(saved);
  auto back = load_profile(path);
  REQUIRE(back.ok());
  CHECK(back->expert_hop_s == 1e-4);
  CHECK(back->engine_step_overhead_s == 1e-3);
  CHECK(engine_only(*back).step_overhead_s == 1e-3);
  std::ofstream(path) << R"({"peak_flops": 1e12, "mem_bandwidth": 1e11, "expert_hop_s": -1})";
  CHECK_FALSE(load_profile(path).ok());
}

TEST_CASE("sim step log: troupe serve's lines read back, bad lines named", "[sim]") {
  const std::string path = "/tmp/troupe_sim_steps_" + std::to_string(::getpid()) + ".csv";
  {
    std::ofstream f(path);
    f << kStepLogHeader << step_log_line({{0, 512, true}}, 0.25, 0.2)
      << step_log_line({{31, 1, true}, {40, 1, true}, {7, 9, false}, {90, 5, true, 4}}, 0.0125, 0.0121);
  }
  auto log = read_step_log(path);
  REQUIRE(log.ok());
  REQUIRE(log->size() == 2);
  CHECK((*log)[0].sample.seconds == 0.25);
  CHECK((*log)[0].compute_seconds == 0.2);
  REQUIRE((*log)[1].sample.seqs.size() == 4);
  CHECK((*log)[1].sample.seqs[3].drafts == 4);  // "90+5*4": a speculative step's drafts
  CHECK((*log)[1].sample.seqs[3].rows() == 5);
  CHECK((*log)[1].sample.seqs[0].drafts == 0);
  CHECK((*log)[1].sample.seqs[2].num_computed == 7);
  CHECK((*log)[1].sample.seqs[2].num_new == 9);
  CHECK_FALSE((*log)[1].sample.seqs[2].samples);
  CHECK((*log)[1].sample.seqs[0].samples);
  for (const char* bad : {"0.1,0.1,", "x,0.1,0+1*", "0.1,0.1,0+0", "0.1,0.1,5", "0.1,0.1,1+2+3", "-1,0,0+1",
                          "0.1,0.1,0+1** ", "0.1", "0.1,0.1,5+3*3", "0.1,0.1,5+3*x", "0.1,0.1,5+3*0"}) {
    std::ofstream(path) << kStepLogHeader << bad << "\n";
    auto r = read_step_log(path);
    CHECK_FALSE(r.ok());
    if (!r.ok()) CHECK(r.error().message.find(":2:") != std::string::npos);
  }
  std::ofstream(path) << "not a step log\n";
  CHECK_FALSE(read_step_log(path).ok());
  CHECK_FALSE(read_step_log(path + ".missing").ok());
}

TEST_CASE("sim cluster: replicas and prefill/decode disaggregation", "[sim]") {
  const ModelConfig m = smollm2();
  const CostModel cost(m, profile("h200"));
  SimConfig cfg = config(512, 1 << 15);
  cfg.log_decisions = false;
  const auto reqs = workload(9, 300, 2000);
  // One colocated instance is the plain simulator.
  auto plain = simulate(reqs, cfg, cost);
  auto one = simulate_cluster(reqs, cfg, cost, {});
  REQUIRE(plain.ok());
  REQUIRE(one.ok());
  REQUIRE(plain->requests.size() == one->requests.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    CHECK(one->requests[i].first_token == Approx(plain->requests[i].first_token));
    CHECK(one->requests[i].finish == Approx(plain->requests[i].finish));
  }
  CHECK(one->steps == plain->steps);
  // Two replicas finish a long overload in about half the time.
  ClusterConfig two;
  two.instances = 2;
  const auto many = workload(10, 2000, 5000);
  auto r1 = simulate_cluster(many, cfg, cost, {});
  auto r2 = simulate_cluster(many, cfg, cost, two);
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(r2->duration_s < 0.6 * r1->duration_s);
  // Disaggregated: the first token comes from the prefill instance, the second only after
  // the KV cache crossed over at 1 GB/s.
  ClusterConfig pd;
  pd.prefill_instances = 1;
  pd.decode_instances = 1;
  pd.kv_transfer_bandwidth = 1e9;
  auto d = simulate_cluster(reqs, cfg, cost, pd);
  REQUIRE(d.ok());
  const double per_token = cost.kv_bytes({{0, 1, false}}) / 2;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = d->requests[i];
    REQUIRE(r.finish > 0);
    CHECK(r.generated == reqs[i].output_tokens);
    if (r.token_times.size() > 1)
      CHECK(r.token_times[1] - r.token_times[0] >= per_token * (reqs[i].prompt_tokens + 1) / 1e9 - 1e-9);
  }
  CHECK_FALSE(check_cluster({1, 2, 0, 0, 0}).ok());
  CHECK_FALSE(check_cluster({0, 0, 0, 0, 0}).ok());
  CHECK_FALSE(check_cluster({1, 1, 1, -5, 0}).ok());
}
