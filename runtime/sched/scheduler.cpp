#include "runtime/sched/scheduler.h"

#include <algorithm>
#include <cmath>

namespace troupe {

SchedulingPolicy SchedulingPolicy::fcfs() {
  return {[](const SchedState& a, const SchedState& b) { return a.arrival < b.arrival; }};
}

SchedulingPolicy SchedulingPolicy::priority() {
  return {[](const SchedState& a, const SchedState& b) {
    return a.req.priority != b.req.priority ? a.req.priority < b.req.priority : a.arrival < b.arrival;
  }};
}

bool WaitingOrder::operator()(int64_t a, int64_t b) const {
  const SchedState& x = sched->states_.at(a);
  const SchedState& y = sched->states_.at(b);
  if (sched->policy_.before(x, y)) return true;
  if (sched->policy_.before(y, x)) return false;
  return x.queue_rank < y.queue_rank;
}

Scheduler::Scheduler(const SchedulerConfig& cfg, KvBlocks& kv, SchedulingPolicy policy)
    : cfg_(cfg), kv_(kv), policy_(std::move(policy)), waiting_(WaitingOrder{this}) {
  cfg_.max_batched_tokens = std::max(1, cfg_.max_batched_tokens);
  cfg_.max_running = std::max(1, cfg_.max_running);
}

Status Scheduler::add(SeqRequest r) {
  if (states_.count(r.id)) return make_error("request id " + std::to_string(r.id) + " is already scheduled");
  if (r.prompt.empty()) return make_error("empty prompt");
  if (r.max_new_tokens < 1) return make_error("max_new_tokens must be at least 1");
  if (!cfg_.chunked_prefill && static_cast<int64_t>(r.prompt.size()) > cfg_.max_batched_tokens)
    return make_error("prompt of " + std::to_string(r.prompt.size()) + " tokens exceeds the token budget of " +
                      std::to_string(cfg_.max_batched_tokens) + " and chunked prefill is off");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  const int64_t capacity = int64_t{kv_.config().num_blocks} * kv_.config().block_size;
  if (total > capacity)
    return make_error("request needs " + std::to_string(total) + " tokens of KV cache but the pool holds " +
                      std::to_string(capacity));
  SchedState s;
  s.tokens = r.prompt;
  s.req = std::move(r);
  s.arrival = next_arrival_++;
  const int64_t id = s.req.id;
  states_.emplace(id, std::move(s));
  enqueue(id, false);
  return {};
}

void Scheduler::enqueue(int64_t id, bool front) {
  states_.at(id).queue_rank = front ? --front_rank_ : ++back_rank_;
  waiting_.insert(id);
}

void Scheduler::abort(int64_t id) {
  auto it = states_.find(id);
  if (it == states_.end()) return;
  kv_.free_sequence(id);
  if (draft_) draft_->release(id);
  waiting_.erase(id);  // (before the state its order reads goes)
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  states_.erase(it);
}

void Scheduler::preempt(int64_t id) {
  SchedState& s = states_.at(id);
  kv_.free_sequence(id);  // recompute later; cached full blocks may still be reused
  s.num_computed = 0;
  ++s.num_preemptions;
  ++preemptions_;
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  enqueue(id, true);
}

// With chunked prefill off, `left` tokens are computed whole or not at all this step --
// unless they could never fit one step (a resumed sequence that outgrew the budget).
bool Scheduler::may_split(int32_t left, int32_t n) const {
  return cfg_.chunked_prefill || n == left || left > cfg_.max_batched_tokens;
}

// The step's token budget: --max-num-batched-tokens, or less under the latency target while
// a running sequence has sampled a token (its next token waits for this step); never fewer
// than two tokens per decoding sequence, so that prefill always moves.
int32_t Scheduler::step_budget(const std::set<int64_t>* busy) const {
  if (cfg_.itl_target_s <= 0 || !cfg_.chunked_prefill || !step_time_.ready()) return cfg_.max_batched_tokens;
  int32_t streaming = 0, decoding = 0;
  double decode_pairs = 0, chunk_context = -1;  // the first prompt in policy order: where its chunk starts
  for (int64_t id : running_) {                 // (in policy order)
    const SchedState& s = states_.at(id);
    const bool free = !(busy && busy->count(id));
    const int32_t left = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    if (free && left > 1 && chunk_context < 0) chunk_context = s.num_computed;
    if (s.num_generated == 0) continue;
    ++streaming;
    if (free && left == 1) {
      ++decoding;
      decode_pairs += s.num_computed + 1;
    }
  }
  if (streaming == 0) return cfg_.max_batched_tokens;
  if (chunk_context < 0) chunk_context = 0;  // a waiting prompt (its prefix-cache hit is not known here)
  const int32_t d = std::max(1, decoding);
  const double limit = std::max(cfg_.itl_target_s, 3 * step_time_.predict({double(d), double(d), decode_pairs}));
  // The most prompt tokens p beside the decodes whose step is predicted within the limit
  // (d + 1 sampled rows: the decodes and a prompt that may finish); the price grows with p.
  auto fits = [&](int32_t p) {
    const double pairs = decode_pairs + p * (chunk_context + (p + 1) / 2.0);
    return step_time_.predict({double(d + p), double(d + 1), pairs}) <= limit;
  };
  int32_t lo = 0, hi = std::max(0, cfg_.max_batched_tokens - d);
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return std::clamp(d + lo, std::min(2 * d, cfg_.max_batched_tokens), cfg_.max_batched_tokens);
}

namespace {
// A plan's shape as the step-time model prices it (tokens are the plan's num_tokens once
// settled; summed here so that a plan being built has its shape too).
StepShape shape_of(const StepPlan& plan) {
  StepShape shape;
  for (const ScheduledSeq& q : plan.seqs) {
    shape.tokens += q.num_new;
    shape.rows += q.logit_rows();
    shape.pairs += q.num_new * (q.num_computed + (q.num_new + 1) / 2.0);
  }
  return shape;
}
}  // namespace

void Scheduler::observe_step(const StepPlan& plan, double seconds, double draft_seconds) {
  if (draft_seconds > 0 && draft_seconds < seconds && std::isfinite(draft_seconds)) {
    size_t rounds = 0;
    for (const ScheduledSeq& q : plan.seqs)
      if (!q.drafts.empty() && q.drafts[0] == kWorkerDraft) rounds = std::max(rounds, q.drafts.size());
    if (rounds > 0) {
      const double r = draft_seconds / static_cast<double>(rounds);
      round_seconds_ = round_seconds_ > 0 ? 0.9 * round_seconds_ + 0.1 * r : r;
    }
    seconds -= draft_seconds;
  }
  step_time_.observe(shape_of(plan), seconds);
}

// Drafts for the plan's decoding sequences (those that were running before this step), in
// plan order, from the budget and blocks the plan left. How many a sequence feeds: its
// acceptance rate so far, alpha = (accepted + 4) / (drafted + 5), makes the i-th draft land
// with probability alpha^i (it needs every draft before it); a draft is fed while that
// chance is worth what it adds to the step -- more expected tokens per second for the whole
// step, E / T (E the tokens the step is expected to emit, T its predicted time, both with
// the drafts added so far): alpha^i / (its marginal time) > E / T. Alone on a machine a
// step's fixed cost dominates and drafts are cheap; under load a step already emits many
// tokens, each draft costs its share of the compute, and speculation turns itself off.
// Until the step-time model is fitted, a sequence feeds what its limit allows. The prior
// (4 of 5 accepted) is optimistic on purpose: a sequence that never fed a draft would
// never learn its rate, and an n-gram match of 3-4 tokens is usually followed by its copy.
int32_t Scheduler::plan_drafts(StepPlan& plan, int32_t budget, const std::set<int64_t>& admitted) {
  const StepShape shape = shape_of(plan);
  double expected = std::max(1.0, shape.rows);  // tokens the step emits (one per sampled row, so far)
  double seconds = step_time_.ready() ? step_time_.predict(shape) : 0;
  bool explore = plans_without_drafts_ >= kExploreEvery;
  bool fed = false;
  // Self-drafting: each draft position is a round of the target's first layers, run for
  // every sequence drafting that far at once; the first sequence to reach a round pays it.
  size_t rounds = 0;
  const bool self_draft = draft_->self_draft_layers() > 0;
  for (ScheduledSeq& q : plan.seqs) {
    if (budget <= 0) break;
    if (!q.samples || q.num_new != 1 || admitted.count(q.id)) continue;
    SchedState& s = states_.at(q.id);
    if (q.num_computed + 1 != static_cast<int32_t>(s.tokens.size())) continue;
    int32_t cap = cfg_.num_speculative_tokens;
    if (s.req.num_speculative_tokens >= 0) cap = std::min(cap, s.req.num_speculative_tokens);
    // (the last token the request may take needs no draft after it)
    cap = std::min({cap, budget, s.req.max_new_tokens - s.num_generated - 1});
    if (cap <= 0) continue;
    int32_t k = cap;
    if (step_time_.ready() && seconds > 0) {
      const double alpha = (s.accepted + kPriorAccepted) / (s.drafted + kPriorDrafted);
      double chance = 1;
      k = 0;
      while (k < cap) {
        chance *= alpha;
        const double ctx = q.num_computed + 1.0 + k;  // the draft's attention pairs
        double cost =
            step_time_.seconds_per_token() + step_time_.seconds_per_row() + step_time_.seconds_per_pair() * ctx;
        if (self_draft && static_cast<size_t>(k) >= rounds)
          cost += round_seconds_ > 0 ? round_seconds_ : draft_->round_cost_estimate() * step_time_.predict({1, 1, ctx});
        if (!(chance * seconds > cost * expected)) break;
        ++k;
        expected += chance;
        seconds += cost;
      }
      // Exploration: the step-time model learns what a draft costs only from steps that
      // fed drafts (a decode's own row and fixed cost are otherwise inseparable), so after
      // kExploreEvery plans without any, one sequence feeds one draft.
      if (k == 0 && !explore) continue;
      if (k == 0) k = 1;
    }
    std::vector<int32_t> drafts = draft_->propose(q.id, s.tokens, k);
    if (drafts.size() > static_cast<size_t>(k)) drafts.resize(static_cast<size_t>(k));  // (a source that overshoots)
    if (drafts.empty()) continue;
    const int32_t n = static_cast<int32_t>(drafts.size());
    if (!kv_.reserve(q.id, q.num_computed + 1 + n, s.tokens, &plan.copies)) continue;  // no room: no drafts
    q.num_new += n;
    q.drafts = std::move(drafts);
    rounds = std::max(rounds, static_cast<size_t>(n));
    budget -= n;
    fed = true;
    explore = false;
  }
  plans_without_drafts_ = fed ? 0 : plans_without_drafts_ + 1;
  return budget;
}

StepPlan Scheduler::schedule(const std::set<int64_t>* busy) {
  StepPlan plan;
  auto is_busy = [&](int64_t id) { return busy && busy->count(id) > 0; };
  std::sort(running_.begin(), running_.end(),
            [&](int64_t a, int64_t b) { return policy_.before(states_.at(a), states_.at(b)); });
  const int32_t step_budget0 = step_budget(busy);
  const bool capped = step_budget0 < cfg_.max_batched_tokens;
  int32_t budget = step_budget0;
  auto is_decoding = [&](int64_t id) {
    const SchedState& s = states_.at(id);
    return !is_busy(id) && s.num_computed + 1 == static_cast<int32_t>(s.tokens.size());
  };
  // Running requests first, in policy order; the last in order is preempted for room.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const int64_t id = running_[i];
    if (is_busy(id)) {
      ++i;
      continue;
    }
    SchedState& s = states_.at(id);
    const int32_t left = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    int32_t room = budget;
    if (capped && left > 1) {  // under the cap, a chunk leaves a token for each decode after it
      const auto after = running_.begin() + static_cast<std::ptrdiff_t>(i) + 1;
      room -= static_cast<int32_t>(std::count_if(after, running_.end(), is_decoding));
    }
    const int32_t n = std::min(left, room);
    if (n <= 0 || !may_split(left, n)) {
      ++i;
      continue;
    }
    if (kv_.reserve(id, s.num_computed + n, s.tokens, &plan.copies)) {
      plan.seqs.push_back({id, s.num_computed, n, s.num_computed + n == static_cast<int32_t>(s.tokens.size())});
      budget -= n;
      ++i;
      continue;
    }
    int64_t victim = id;  // the last in policy order that is not in flight (at worst this one)
    for (auto r = running_.rbegin(); r != running_.rend(); ++r)
      if (!is_busy(*r)) {
        victim = *r;
        break;
      }
    plan.preempted.push_back(victim);
    // A victim already planned this step is taken out of the plan.
    for (auto p = plan.seqs.begin(); p != plan.seqs.end(); ++p)
      if (p->id == victim) {
        budget += p->num_new;
        plan.seqs.erase(p);
        break;
      }
    preempt(victim);
    if (victim == id) continue;  // i now points at the next request
  }
  // Then waiting requests while budget, the running cap and the pool allow.
  std::set<int64_t> admitted;
  while (!waiting_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < cfg_.max_running) {
    const int64_t id = *waiting_.begin();
    SchedState& s = states_.at(id);
    auto cached = kv_.add_sequence(id, s.tokens);
    if (!cached) break;
    s.num_computed = *cached;
    const int32_t left = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    const int32_t n = std::min(left, budget);
    if (!may_split(left, n) || !kv_.reserve(id, s.num_computed + n, s.tokens, &plan.copies)) {
      kv_.free_sequence(id);
      s.num_computed = 0;
      break;  // head-of-line: keep the order the policy chose
    }
    waiting_.erase(waiting_.begin());
    running_.push_back(id);
    admitted.insert(id);
    plan.seqs.push_back({id, s.num_computed, n, s.num_computed + n == static_cast<int32_t>(s.tokens.size())});
    budget -= n;
  }
  if (draft_ && cfg_.num_speculative_tokens > 0 && budget > 0) budget = plan_drafts(plan, budget, admitted);
  plan.num_tokens = step_budget0 - budget;
  if (capped && !plan.seqs.empty()) ++capped_steps_;
  return plan;
}

Status Scheduler::settle(StepPlan& plan, const std::vector<KvOp>& ops, const std::vector<KvOpResult>& results) {
  if (ops.size() != results.size())
    return make_error("the KV-block manager answered " + std::to_string(results.size()) + " of " +
                      std::to_string(ops.size()) + " block operations");
  auto drop = [&](int64_t id) {
    plan.seqs.erase(
        std::remove_if(plan.seqs.begin(), plan.seqs.end(), [&](const ScheduledSeq& q) { return q.id == id; }),
        plan.seqs.end());
  };
  std::vector<int64_t> refused;
  for (size_t i = 0; i < ops.size(); ++i) {
    const KvOp& op = ops[i];
    const KvOpResult& r = results[i];
    // The ledger only accepts what fits, so a refused reservation, or a refused chunked
    // admission that is not behind an earlier refusal (head-of-line), means the ledger and
    // the block owner disagree: an error, rather than planning the same step again.
    if (op.kind == KvOp::Kind::Reserve && !r.ok)
      return make_error("the KV-block manager refused a reservation for sequence " + std::to_string(op.seq) +
                        " that the ledger counted as free");
    if (op.kind != KvOp::Kind::Admit) continue;
    if (!r.ok && !op.whole && refused.empty())
      return make_error("the KV-block manager refused the admission of sequence " + std::to_string(op.seq) +
                        " that the ledger counted as free");
    auto st = states_.find(op.seq);
    auto q = std::find_if(plan.seqs.begin(), plan.seqs.end(), [&](const ScheduledSeq& x) { return x.id == op.seq; });
    if (st == states_.end() || q == plan.seqs.end()) return make_error("an admission names a sequence the plan lacks");
    SchedState& s = st->second;
    if (!r.ok) {
      drop(op.seq);
      running_.erase(std::remove(running_.begin(), running_.end(), op.seq), running_.end());
      s.num_computed = 0;
      refused.push_back(op.seq);
      continue;
    }
    const int32_t len = static_cast<int32_t>(s.tokens.size());
    if (r.cached < 0 || r.cached % kv_.config().block_size != 0 || r.num_new < 1 || r.num_new > q->num_new ||
        r.cached + r.num_new > len)
      return make_error("the KV-block manager admitted sequence " + std::to_string(op.seq) + " outside its plan");
    s.num_computed = r.cached;
    q->num_computed = r.cached;
    q->num_new = r.num_new;
    q->samples = r.cached + r.num_new == len;
  }
  for (auto it = refused.rbegin(); it != refused.rend(); ++it) enqueue(*it, true);
  plan.num_tokens = 0;
  for (const ScheduledSeq& q : plan.seqs) plan.num_tokens += q.num_new;
  return {};
}

std::vector<FinishedRequest> Scheduler::update(const StepPlan& plan, const std::vector<int32_t>& sampled,
                                               const std::function<bool(int64_t, int32_t)>& is_stop,
                                               const std::vector<int32_t>* counts) {
  std::vector<FinishedRequest> done;
  size_t k = 0, entry = 0;
  for (const ScheduledSeq& p : plan.seqs) {
    // The tokens of this entry: sampled[k, k + n).
    size_t n = 0;
    if (p.samples) {
      n = counts ? (entry < counts->size() ? static_cast<size_t>(std::max(0, (*counts)[entry])) : 0) : 1;
      n = std::min({n, p.drafts.size() + 1, sampled.size() - std::min(k, sampled.size())});
      ++entry;
    }
    const size_t first = k;
    k += n;
    auto it = states_.find(p.id);
    if (it == states_.end()) continue;  // aborted meanwhile
    SchedState& s = it->second;
    if (!p.samples) {
      s.num_computed = p.num_computed + p.num_new;
      continue;
    }
    if (n == 0) {  // (no token came back for it: what the step computed before its drafts stays)
      s.num_computed = p.num_computed + p.num_new - static_cast<int32_t>(p.drafts.size()) - 1;
      if (!p.drafts.empty()) kv_.truncate(p.id, s.num_computed + 1);
      continue;
    }
    // The drafts accepted: each token that equals the draft fed after it keeps that draft's
    // KV (the next token came from its row).
    size_t accepted = 0;
    // (a worker-filled draft is known only to the verifier, whose count says how many held)
    while (accepted + 1 < n && (sampled[first + accepted] == p.drafts[accepted] || p.drafts[accepted] == kWorkerDraft))
      ++accepted;
    n = accepted + 1;
    if (!p.drafts.empty()) {
      ++spec_.num_drafts;
      spec_.num_draft_tokens += p.drafts.size();
      spec_.num_accepted_tokens += accepted;
      if (spec_.accepted_per_pos.size() < p.drafts.size()) spec_.accepted_per_pos.resize(p.drafts.size(), 0);
      for (size_t i = 0; i < accepted; ++i) ++spec_.accepted_per_pos[i];
      s.drafted += static_cast<int64_t>(p.drafts.size());
      s.accepted += static_cast<int64_t>(accepted);
    }
    // The last known token and the accepted drafts are in the cache now.
    s.num_computed = p.num_computed + p.num_new - static_cast<int32_t>(p.drafts.size() - accepted);
    bool finished = false;
    for (size_t i = 0; i < n && !finished; ++i) {
      const int32_t tok = sampled[first + i];
      s.tokens.push_back(tok);
      ++s.num_generated;
      const bool stop = is_stop && is_stop(p.id, tok);
      if (stop || s.num_generated >= s.req.max_new_tokens) {
        FinishedRequest f;
        f.id = p.id;
        f.output.assign(s.tokens.end() - s.num_generated, s.tokens.end());
        f.hit_stop = stop;
        f.step_tokens = static_cast<int32_t>(i + 1);
        done.push_back(std::move(f));
        abort(p.id);
        finished = true;
      }
    }
    if (!finished && accepted < p.drafts.size()) kv_.truncate(p.id, s.num_computed);  // rejected drafts' blocks
  }
  return done;
}

const SchedState* Scheduler::state(int64_t id) const {
  auto it = states_.find(id);
  return it == states_.end() ? nullptr : &it->second;
}

}  // namespace troupe
