#include "sim/cluster.h"

#include "sim/serving_scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <queue>
#include <sstream>

namespace troupe::sim {
namespace {

enum class Role { both, prefill, decode };

struct Instance {
  Role role = Role::both;
  std::unique_ptr<ServingScheduler> serving;
  bool busy = false;
  double busy_until = 0;
  StepPlan plan;
  double usage_time = 0;
  size_t load() const { return serving->load(); }
};

struct Transfer {
  double ready = 0;
  size_t index = 0;  // request
  bool operator>(const Transfer& o) const { return ready != o.ready ? ready > o.ready : index > o.index; }
};

}  // namespace

Status check_cluster(const ClusterConfig& c) {
  if (c.prefill_instances < 0 || c.decode_instances < 0 || c.instances < 1 || c.instances > 4096 ||
      c.prefill_instances > 4096 || c.decode_instances > 4096)
    return make_error("instance counts must be 0..4096 (--instances at least 1)");
  if ((c.prefill_instances > 0) != (c.decode_instances > 0))
    return make_error("--prefill-instances and --decode-instances go together");
  if (!(c.kv_transfer_bandwidth >= 0) || !(c.kv_transfer_latency_s >= 0))
    return make_error("--kv-transfer-bandwidth and --kv-transfer-latency-s must be >= 0");
  return {};
}

Result<SimResult> simulate_cluster(const std::vector<SimRequest>& reqs, const SimConfig& cfg, const CostModel& cost,
                                   const ClusterConfig& cc) {
  TROUPE_TRY(check_cluster(cc));
  if (cfg.policy != "fcfs" && cfg.policy != "priority") return make_error("--policy must be fcfs or priority");
  if (cfg.kv.num_blocks <= 0 || cfg.kv.block_size <= 0) return make_error("the KV pool needs at least one block");
  const bool disagg = cc.prefill_instances > 0;
  std::vector<Instance> inst;
  auto add_instances = [&](int32_t n, Role role) {
    for (int32_t i = 0; i < n; ++i) {
      Instance x;
      x.role = role;
      SchedulerConfig sc = cfg.scheduler;
      // A decode instance's plans carry the prompts that arrived with their KV as tokens it
      // does not compute: the latency target would chunk that pretend work, so it is off there.
      if (role == Role::decode) sc.itl_target_s = 0;
      x.serving = std::make_unique<ServingScheduler>(
          sc, cfg.kv, cfg.policy == "priority" ? SchedulingPolicy::priority() : SchedulingPolicy::fcfs());
      inst.push_back(std::move(x));
    }
  };
  if (disagg) {
    add_instances(cc.prefill_instances, Role::prefill);
    add_instances(cc.decode_instances, Role::decode);
  } else {
    add_instances(cc.instances, Role::both);
  }
  SimResult out;
  auto index_or = init_records(reqs, out);
  if (!index_or) return index_or.error();
  const std::map<int64_t, size_t> index = std::move(*index_or);
  // The KV bytes of a prompt, for the transfer.
  const double kv_bytes_per_token = cost.kv_bytes({{0, 1, false}}) / 2;
  auto route = [&](Role role) {
    size_t best = inst.size();
    for (size_t i = 0; i < inst.size(); ++i)
      if (inst[i].role == role && (best == inst.size() || inst[i].load() < inst[best].load())) best = i;
    return best;
  };
  std::priority_queue<Transfer, std::vector<Transfer>, std::greater<Transfer>> transfers;
  std::vector<bool> recompute(reqs.size(), false);  // preempted on a decode instance: its KV is gone
  const auto never_stop = [](int64_t, int32_t) { return false; };
  std::vector<int32_t> sampled;
  std::vector<SeqShape> shapes;
  double now = 0;
  size_t next = 0;
  // Starts instance k's next step at `now` when it is idle and has work.
  auto start = [&](size_t k) -> Status {
    Instance& x = inst[k];
    if (x.busy || x.load() == 0) return {};
    auto planned = x.serving->plan();
    if (!planned) return planned.error();
    x.plan = std::move(*planned);
    if (x.plan.seqs.empty()) return {};
    shapes.clear();
    for (const auto& s : x.plan.seqs) {
      SeqShape sh{s.num_computed, s.num_new, s.samples};
      if (x.role == Role::decode && !recompute[index.at(s.id)]) {
        // The prompt (and the first token) arrived with the KV transfer: only tokens past
        // them are computed (until a preemption drops that KV: then it is recomputed).
        const size_t i = index.at(s.id);
        const int32_t received = reqs[i].prompt_tokens + 1;
        const int32_t end = s.num_computed + s.num_new;
        if (end <= received) {
          if (!s.samples) continue;  // nothing computed
          sh = {end - 1, 1, true};
        } else if (s.num_computed < received) {
          sh = {received - 1, end - received + 1, s.samples};
        }
      }
      shapes.push_back(sh);
    }
    for (int64_t id : x.plan.preempted) {
      ++out.requests[index.at(id)].preemptions;
      ++out.preemptions;
      if (x.role == Role::decode) recompute[index.at(id)] = true;
    }
    if (cfg.log_decisions) {
      std::ostringstream line;
      line << out.steps << " @" << k << ":";
      for (const auto& s : x.plan.seqs) line << " " << s.id << "+" << s.num_new << (s.samples ? "*" : "");
      for (int64_t id : x.plan.preempted) line << " preempt " << id;
      out.decisions.push_back(line.str());
    }
    const double dt = shapes.empty() ? cost.hardware().step_overhead_s : cost.step_seconds(shapes);
    x.serving->sched().observe_step(x.plan, dt);
    const double usage = 1.0 - static_cast<double>(x.serving->kv().num_free_blocks()) / cfg.kv.num_blocks;
    x.usage_time += usage * dt;
    out.peak_kv_usage = std::max(out.peak_kv_usage, usage);
    x.busy = true;
    x.busy_until = now + dt;
    ++out.steps;
    return {};
  };
  auto admit = [&](size_t i, Role role, std::vector<int32_t> prompt, int32_t max_new) -> Status {
    const size_t k = route(role);
    const SimRequest& q = reqs[i];
    if (!inst[k].serving->sched().add({q.id, std::move(prompt), max_new, q.priority}).ok()) {
      out.requests[i].rejected = true;
      return {};
    }
    // A busy instance fetches the newcomer's hints during its step, as serve does.
    if (inst[k].busy) return inst[k].serving->fetch_hints();
    return start(k);
  };
  while (true) {
    // The next event: a step ending (lowest instance first), a transfer landing, an arrival.
    double t_step = INFINITY, t_transfer = transfers.empty() ? INFINITY : transfers.top().ready;
    size_t k_step = inst.size();
    for (size_t k = 0; k < inst.size(); ++k)
      if (inst[k].busy && inst[k].busy_until < t_step) {
        t_step = inst[k].busy_until;
        k_step = k;
      }
    const double t_arrival = next < reqs.size() ? reqs[next].arrival_s : INFINITY;
    const double t = std::min({t_step, t_transfer, t_arrival});
    if (!std::isfinite(t)) break;
    now = std::max(now, t);
    if (t_step == t) {
      Instance& x = inst[k_step];
      x.busy = false;
      sampled.clear();
      for (const auto& s : x.plan.seqs) {
        if (!s.samples) continue;
        const size_t i = index.at(s.id);
        sampled.push_back(static_cast<int32_t>((reqs[i].id * 7919 + s.num_computed) % 32000));
        RequestRecord& r = out.requests[i];
        if (r.first_token < 0) r.first_token = now;
        r.token_times.push_back(now);
        ++r.generated;
      }
      for (const auto& f : x.serving->sched().update(x.plan, sampled, never_stop)) {
        const size_t i = index.at(f.id);
        if (x.role != Role::prefill || reqs[i].output_tokens <= 1) {
          out.requests[i].finish = now;
          continue;
        }
        const double bytes = kv_bytes_per_token * (reqs[i].prompt_tokens + 1);
        const double ready =
            now + cc.kv_transfer_latency_s + (cc.kv_transfer_bandwidth > 0 ? bytes / cc.kv_transfer_bandwidth : 0);
        transfers.push({ready, i});
      }
      TROUPE_TRY(start(k_step));
    } else if (t_transfer == t) {
      const size_t i = transfers.top().index;
      transfers.pop();
      std::vector<int32_t> toks = prompt_tokens_of(reqs[i]);
      toks.push_back(static_cast<int32_t>((reqs[i].id * 7919 + reqs[i].prompt_tokens) % 32000));
      TROUPE_TRY(admit(i, Role::decode, std::move(toks), reqs[i].output_tokens - 1));
    } else {
      const size_t i = next++;
      const int32_t max_new = disagg ? 1 : reqs[i].output_tokens;
      // The decode instance admits the prompt and the first token as its prompt; without
      // chunked prefill that must fit its budget too, so refuse it up front.
      if (disagg && !cfg.scheduler.chunked_prefill && reqs[i].prompt_tokens + 1 > cfg.scheduler.max_batched_tokens) {
        out.requests[i].rejected = true;
        continue;
      }
      TROUPE_TRY(admit(i, disagg ? Role::prefill : Role::both, prompt_tokens_of(reqs[i]), max_new));
    }
  }
  for (const auto& x : inst) {
    if (x.load() > 0) return make_error("the scheduler made no progress");
    const KvBlockStats st = x.serving->kv().stats();
    out.prefix_queries += st.prefix_queries;
    out.prefix_hits += st.prefix_hits;
  }
  const double first = reqs.empty() ? 0 : reqs.front().arrival_s;
  out.duration_s = now - first;
  double usage = 0;
  for (const auto& x : inst) usage += x.usage_time;
  out.mean_kv_usage = out.duration_s > 0 ? usage / inst.size() / out.duration_s : 0;
  return out;
}

}  // namespace troupe::sim
