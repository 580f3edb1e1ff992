#include "sim/simulator.h"

#include "sim/serving_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace troupe::sim {
namespace {

uint32_t token_hash(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x % 32000);
}

double pct(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const double k = (xs.size() - 1) * p / 100.0;
  const size_t f = static_cast<size_t>(std::floor(k));
  const size_t c = std::min(f + 1, xs.size() - 1);
  return xs[f] + (xs[c] - xs[f]) * (k - f);
}

nlohmann::json summarize(const std::vector<double>& ms) {
  double sum = 0;
  for (double v : ms) sum += v;
  return {
      {"mean", ms.empty() ? 0.0 : sum / ms.size()}, {"p50", pct(ms, 50)}, {"p90", pct(ms, 90)}, {"p99", pct(ms, 99)}};
}

}  // namespace

std::vector<int32_t> prompt_tokens_of(const SimRequest& r) {
  std::vector<int32_t> t(static_cast<size_t>(r.prompt_tokens));
  for (int32_t i = 0; i < r.prompt_tokens; ++i)
    t[i] = static_cast<int32_t>(r.prefix_group >= 0 && i < r.prefix_tokens
                                    ? token_hash(0xA11CE + static_cast<uint64_t>(r.prefix_group), i)
                                    : token_hash(0xB0B + static_cast<uint64_t>(r.id), i));
  return t;
}

Result<std::map<int64_t, size_t>> init_records(const std::vector<SimRequest>& reqs, SimResult& out) {
  out.requests.resize(reqs.size());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestRecord& r = out.requests[i];
    r.id = reqs[i].id;
    r.arrival = reqs[i].arrival_s;
    r.prompt_tokens = reqs[i].prompt_tokens;
    r.output_tokens = reqs[i].output_tokens;
    r.priority = reqs[i].priority;
    if (i && reqs[i].arrival_s < reqs[i - 1].arrival_s) return make_error("requests must be sorted by arrival");
    if (!index.emplace(reqs[i].id, i).second) return make_error("duplicate request id " + std::to_string(reqs[i].id));
  }
  return index;
}

// Drafts of the simulated speculation: tokens the verification below accepts or not by
// the configured rates (their ids never matter to the cost model).
struct SimDraft : DraftSource {
  double match = 1;
  std::string name() const override { return "sim"; }
  std::vector<int32_t> propose(int64_t seq, const std::vector<int32_t>& tokens, int32_t max) override {
    const double u = token_hash(0xD2AF7 + static_cast<uint64_t>(seq), tokens.size()) / 32000.0;
    if (u >= match) return {};
    std::vector<int32_t> d(static_cast<size_t>(std::max(0, max)));
    for (size_t i = 0; i < d.size(); ++i)
      d[i] = static_cast<int32_t>(token_hash(0xD4AF7 + static_cast<uint64_t>(seq), tokens.size() * 64 + i));
    return d;
  }
};

Result<SimResult> simulate(const std::vector<SimRequest>& reqs, const SimConfig& cfg, const CostModel& cost) {
  if (cfg.policy != "fcfs" && cfg.policy != "priority") return make_error("--policy must be fcfs or priority");
  if (cfg.kv.num_blocks <= 0 || cfg.kv.block_size <= 0) return make_error("the KV pool needs at least one block");
  if (cfg.scheduler.max_batched_tokens <= 0 || cfg.scheduler.max_running <= 0)
    return make_error("the token budget and the running cap must be positive");
  ServingScheduler serving(cfg.scheduler, cfg.kv,
                           cfg.policy == "priority" ? SchedulingPolicy::priority() : SchedulingPolicy::fcfs());
  Scheduler& sched = serving.sched();
  const KvBlockManager& kv = serving.kv();
  if (!(cfg.spec_acceptance >= 0 && cfg.spec_acceptance <= 1) || !(cfg.spec_match >= 0 && cfg.spec_match <= 1))
    return make_error("speculative acceptance and match rates must be within 0..1");
  SimDraft draft;
  draft.match = cfg.spec_match;
  if (cfg.scheduler.num_speculative_tokens > 0) sched.set_draft_source(&draft);
  SimResult out;
  auto index_or = init_records(reqs, out);
  if (!index_or) return index_or.error();
  const std::map<int64_t, size_t> index = std::move(*index_or);  // request id -> record
  const auto never_stop = [](int64_t, int32_t) { return false; };
  double now = 0, usage_time = 0;
  size_t next = 0;
  std::vector<SeqShape> shapes;
  std::vector<int32_t> sampled, counts;
  auto arrivals = [&] {
    while (next < reqs.size() && reqs[next].arrival_s <= now) {
      const SimRequest& q = reqs[next];
      SeqRequest sr{q.id, prompt_tokens_of(q), q.output_tokens, q.priority};
      if (!sched.add(std::move(sr)).ok()) out.requests[next].rejected = true;
      ++next;
    }
  };
  while (true) {
    arrivals();
    auto planned = serving.plan();
    if (!planned) return planned.error();
    const StepPlan& plan = *planned;
    if (plan.seqs.empty()) {
      if (next < reqs.size()) {
        now = std::max(now, reqs[next].arrival_s);
        continue;
      }
      if (sched.num_waiting() + sched.num_running() > 0) return make_error("the scheduler made no progress");
      break;
    }
    shapes.clear();
    sampled.clear();
    counts.clear();
    for (const auto& s : plan.seqs) {
      shapes.push_back({s.num_computed, s.num_new, s.samples, static_cast<int32_t>(s.drafts.size())});
      if (!s.samples) continue;
      // The accepted drafts (each with probability spec_acceptance, in a row), then a token of
      // the target's own (one that differs from the next draft).
      size_t accepted = 0;
      while (accepted < s.drafts.size() &&
             token_hash(0xACCE97 + static_cast<uint64_t>(s.id), s.num_computed * 64 + accepted) / 32000.0 <
                 cfg.spec_acceptance)
        sampled.push_back(s.drafts[accepted++]);
      int32_t own = static_cast<int32_t>(token_hash(0xC0FFEE + static_cast<uint64_t>(s.id), s.num_computed));
      if (accepted < s.drafts.size() && own == s.drafts[accepted]) own = (own + 1) % 32000;
      sampled.push_back(own);
      counts.push_back(static_cast<int32_t>(accepted + 1));
    }
    for (int64_t id : plan.preempted) {
      ++out.requests[index.at(id)].preemptions;
      ++out.preemptions;
    }
    if (cfg.log_decisions) {
      std::ostringstream line;
      line << out.steps << ":";
      for (const auto& s : plan.seqs)
        line << " " << s.id << "+" << s.num_new << (s.samples ? "*" : "")
             << (s.drafts.empty() ? "" : std::to_string(s.drafts.size()));
      for (int64_t id : plan.preempted) line << " preempt " << id;
      out.decisions.push_back(line.str());
    }
    const double dt = cost.step_seconds(shapes);
    sched.observe_step(plan, dt);
    // O(1): stats() walks the free list.
    const double usage = 1.0 - static_cast<double>(kv.num_free_blocks()) / cfg.kv.num_blocks;
    usage_time += usage * dt;
    out.peak_kv_usage = std::max(out.peak_kv_usage, usage);
    now += dt;
    ++out.steps;
    std::map<int64_t, int32_t> emitted;  // tokens each sampling sequence emits this step
    {
      size_t e = 0;
      for (const auto& s : plan.seqs)
        if (s.samples) emitted[s.id] = counts[e++];
    }
    arrivals();  // (those that came during the step: serve fetches their hints meanwhile)
    TROUPE_TRY(serving.fetch_hints());
    for (const auto& f : sched.update(plan, sampled, never_stop, &counts)) {
      out.requests[index.at(f.id)].finish = now;
      emitted[f.id] = f.step_tokens;  // (it ended inside its run of drafts)
    }
    for (const auto& s : plan.seqs) {
      if (!s.samples) continue;
      RequestRecord& r = out.requests[index.at(s.id)];
      if (r.first_token < 0) r.first_token = now;
      for (int32_t i = 0; i < emitted[s.id]; ++i) r.token_times.push_back(now);
      r.generated += emitted[s.id];
      if (!s.drafts.empty()) {
        out.spec_draft_tokens += s.drafts.size();
        out.spec_accepted_tokens += static_cast<uint64_t>(emitted[s.id] - 1);
      }
    }
  }
  const KvBlockStats st = kv.stats();
  out.prefix_queries = st.prefix_queries;
  out.prefix_hits = st.prefix_hits;
  const double first = reqs.empty() ? 0 : reqs.front().arrival_s;
  out.duration_s = now - first;
  out.mean_kv_usage = out.duration_s > 0 ? usage_time / out.duration_s : 0;
  return out;
}

std::string summary_json(const SimResult& r, const Slo& slo) {
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t completed = 0, rejected = 0, good = 0, tin = 0, tout = 0;
  for (const auto& q : r.requests) {
    if (q.rejected) {
      ++rejected;
      continue;
    }
    if (q.finish < 0) continue;
    ++completed;
    tin += q.prompt_tokens;
    tout += q.generated;
    const double t = (q.first_token - q.arrival) * 1e3;
    ttft.push_back(t);
    e2e.push_back((q.finish - q.arrival) * 1e3);
    double worst_itl = 0;
    for (size_t i = 1; i < q.token_times.size(); ++i) {
      const double g = (q.token_times[i] - q.token_times[i - 1]) * 1e3;
      itl.push_back(g);
      worst_itl = std::max(worst_itl, g);
    }
    if (q.generated > 1) tpot.push_back((q.finish - q.first_token) * 1e3 / (q.generated - 1));
    if ((slo.ttft_ms <= 0 || t <= slo.ttft_ms) && (slo.itl_ms <= 0 || worst_itl <= slo.itl_ms)) ++good;
  }
  const double d = r.duration_s;
  nlohmann::json j = {
      {"completed", completed},
      {"failed", rejected},
      {"duration_s", d},
      {"total_input_tokens", tin},
      {"total_output_tokens", tout},
      {"request_throughput", d > 0 ? completed / d : 0.0},
      {"output_throughput", d > 0 ? tout / d : 0.0},
      {"total_token_throughput", d > 0 ? (tin + tout) / d : 0.0},
      {"ttft_ms", summarize(ttft)},
      {"tpot_ms", summarize(tpot)},
      {"itl_ms", summarize(itl)},
      {"e2el_ms", summarize(e2e)},
      {"slo", {{"ttft_ms", slo.ttft_ms}, {"itl_ms", slo.itl_ms}}},
      {"slo_attainment", completed ? double(good) / completed : 0.0},
      {"goodput", d > 0 ? good / d : 0.0},
      {"steps", r.steps},
      {"preemptions", r.preemptions},
      {"kv_usage_mean", r.mean_kv_usage},
      {"kv_usage_peak", r.peak_kv_usage},
      {"prefix_cache_queries", r.prefix_queries},
      {"prefix_cache_hits", r.prefix_hits},
      {"spec_draft_tokens", r.spec_draft_tokens},
      {"spec_accepted_tokens", r.spec_accepted_tokens},
  };
  return j.dump(2) + "\n";
}

std::string requests_csv(const SimResult& r) {
  std::string s =
      "id,arrival_s,first_token_s,finish_s,prompt_tokens,output_tokens,ttft_ms,e2e_ms,mean_itl_ms,preemptions,"
      "rejected\n";
  char buf[256];
  for (const auto& q : r.requests) {
    const double itl = q.generated > 1 ? (q.finish - q.first_token) * 1e3 / (q.generated - 1) : 0;
    std::snprintf(buf, sizeof buf, "%lld,%.6f,%.6f,%.6f,%d,%d,%.3f,%.3f,%.3f,%d,%d\n", static_cast<long long>(q.id),
                  q.arrival, q.first_token, q.finish, q.prompt_tokens, q.generated,
                  q.first_token >= 0 ? (q.first_token - q.arrival) * 1e3 : -1.0,
                  q.finish >= 0 ? (q.finish - q.arrival) * 1e3 : -1.0, itl, q.preemptions, q.rejected ? 1 : 0);
    s += buf;
  }
  return s;
}

}  // namespace troupe::sim
