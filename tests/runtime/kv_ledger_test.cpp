// The plan/apply split between the scheduler and the KV-block-manager actor
// (runtime/sched/kv_ledger.h), without actors: the scheduler plans against a KvLedger, the
// operations go through apply_kv_ops() on a block manager of their own, settle() fits the
// plan. A fake KV cache stores the token id written into each slot, and every planned
// sequence must read its whole context back through its block table, so a wrong block,
// a stale prefix hit or a lost write fails the test. Outputs are compared with the
// direct path (the scheduler calling the block manager itself) and with solo runs.
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "runtime/engine/engine.h"
#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/scheduler.h"
#include "tests/runtime/fake_next.h"

using namespace troupe;

namespace {

using test::fake_next;

bool is_stop(int64_t, int32_t t) { return t == 0; }

std::vector<int32_t> solo(const std::vector<int32_t>& prompt, int32_t max_new) {
  std::vector<int32_t> toks = prompt, out;
  while (static_cast<int32_t>(out.size()) < max_new) {
    const int32_t t = fake_next(toks);
    toks.push_back(t);
    out.push_back(t);
    if (is_stop(0, t)) break;
  }
  return out;
}

// Slots hold the token written there (-1: never written).
struct FakeCache {
  int32_t bs;
  std::vector<int32_t> slots;
  FakeCache(int32_t blocks, int32_t bs) : bs(bs), slots(static_cast<size_t>(blocks) * bs, -1) {}
  void run(const PlannedStep& ps, const StepPlan& plan, const Scheduler& s) {
    for (size_t i = 0; i < ps.token_ids.size(); ++i) {
      REQUIRE(ps.slot_mapping[i] >= 0);
      REQUIRE(static_cast<size_t>(ps.slot_mapping[i]) < slots.size());
      slots[ps.slot_mapping[i]] = ps.token_ids[i];
    }
    for (size_t j = 0; j < plan.seqs.size(); ++j) {
      const auto& toks = s.state(plan.seqs[j].id)->tokens;
      for (int32_t pos = 0; pos < ps.context_lens[j]; ++pos) {
        const int32_t block = ps.block_tables[j * ps.max_blocks_per_seq + pos / bs];
        INFO("sequence " << plan.seqs[j].id << " position " << pos);
        REQUIRE(slots[static_cast<size_t>(block) * bs + pos % bs] == toks[pos]);
      }
    }
  }
};

std::vector<int32_t> shared_prompt(std::mt19937& rng, int len) {
  // A few long shared prefixes, then a private tail: prefix hits of every length.
  const int base = static_cast<int>(rng() % 3);
  const int shared = static_cast<int>(rng() % (len + 1));
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i)
    p.push_back(i < shared ? 1 + (i * 7 + base * 11) % 45 : 1 + static_cast<int32_t>(rng() % 45));
  return p;
}

// Runs the ledger path: one KvOpsRequest per step; checks every step's invariants.
struct LedgerPath {
  KvBlockManager owner;  // what the KV-block-manager actor holds
  KvLedger ledger;
  Scheduler sched;
  FakeCache cache;
  uint64_t batch = 0;
  int32_t budget;
  int whole_refusals = 0;
  LedgerPath(const SchedulerConfig& sc, const KvBlockConfig& kc)
      : owner(kc),
        ledger(kc, sc.chunked_prefill),
        sched(sc, ledger, SchedulingPolicy::fcfs()),
        cache(kc.num_blocks, kc.block_size),
        budget(sc.max_batched_tokens) {}

  KvOpsReply send(const StepPlan& plan, std::vector<KvOp>* ops_out) {
    KvOpsRequest req = make_kv_request(ledger, sched, plan, ++batch);
    const int32_t planned_free = ledger.num_free();
    KvOpsReply r = apply_kv_ops(owner, req);
    auto ok = owner.check_invariants();
    if (!ok) FAIL(ok.error().message);
    REQUIRE(r.results.size() == req.ops.size());
    REQUIRE(r.copies.empty());
    for (size_t i = 0; i < req.ops.size(); ++i) {
      // The ledger never over-commits: reservations always fit; admissions do too, with
      // the largest prefix hit that stays inside the plan's count -- except a whole-prompt
      // admission (chunked prefill off) whose hinted hit was evicted by this very request's
      // earlier reservations: it cannot start earlier without busting the budget.
      if (!r.results[i].ok && req.ops[i].kind == KvOp::Kind::Admit && req.ops[i].whole && req.ops[i].cached > 0) {
        ++whole_refusals;
        continue;
      }
      REQUIRE(r.results[i].ok);
      if (req.ops[i].kind == KvOp::Kind::Admit) {
        REQUIRE(r.results[i].num_new >= 1);
        REQUIRE(r.results[i].num_new <= req.ops[i].num_tokens);
      }
    }
    REQUIRE(r.snapshot.num_free >= planned_free);  // the ledger's count is exact or conservative
    REQUIRE(r.snapshot.num_free == owner.num_free_blocks());
    ledger.sync(r.snapshot);
    *ops_out = std::move(req.ops);
    return r;
  }

  // One step; returns finished requests. `stepped`: a plan ran.
  std::vector<FinishedRequest> step(bool* stepped) {
    StepPlan plan = sched.schedule();
    *stepped = false;
    if (plan.seqs.empty() && !ledger.has_pending()) return {};
    std::vector<KvOp> ops;
    KvOpsReply r = send(plan, &ops);
    if (plan.seqs.empty()) return {};
    REQUIRE(sched.settle(plan, ops, r.results).ok());
    REQUIRE(plan.num_tokens <= budget);
    if (plan.seqs.empty()) return {};
    std::map<int64_t, const std::vector<int32_t>*> tables;
    for (const auto& t : r.tables) tables[t.seq] = &t.blocks;
    auto ps = plan_step(plan, sched, owner.config().block_size, [&](int64_t id) { return tables.at(id); });
    REQUIRE(ps.ok());
    cache.run(*ps, plan, sched);
    *stepped = true;
    std::vector<int32_t> sampled;
    for (const auto& q : plan.seqs)
      if (q.samples) sampled.push_back(fake_next(sched.state(q.id)->tokens));
    return sched.update(plan, sampled, is_stop);
  }
  void flush() {
    std::vector<KvOp> ops;
    if (ledger.has_pending()) send({}, &ops);
  }
};

}  // namespace

TEST_CASE("kv ledger: random workloads through plan/apply keep the cache right and match solo runs",
          "[kv][scheduler][property]") {
  int cases = 0;
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    std::mt19937 rng(seed);
    const int32_t bs = seed % 2 ? 4 : 8;
    const int32_t blocks = std::vector<int32_t>{14, 30, 200}[seed % 3];
    SchedulerConfig sc{std::vector<int32_t>{16, 32, 64}[(seed / 3) % 3], 6, seed % 4 != 0};
    KvBlockConfig kc{blocks, bs, seed % 5 != 0};
    INFO("seed " << seed << " budget " << sc.max_batched_tokens << " blocks " << blocks << " bs " << bs << " chunked "
                 << sc.chunked_prefill << " prefix caching " << kc.enable_prefix_caching);
    LedgerPath lp(sc, kc);
    KvBlockManager direct_kv(kc);
    Scheduler direct(sc, direct_kv, SchedulingPolicy::fcfs());
    FakeCache direct_cache(blocks, bs);

    std::map<int64_t, std::vector<int32_t>> expect, got_ledger, got_direct;
    std::vector<SeqRequest> reqs;
    for (int64_t id = 0; id < 40; ++id) {
      const int len = 1 + static_cast<int>(rng() % (sc.chunked_prefill ? 90 : sc.max_batched_tokens));
      SeqRequest r{id, shared_prompt(rng, len), 1 + static_cast<int32_t>(rng() % 12), 0};
      reqs.push_back(r);
    }
    std::set<int64_t> aborted;
    size_t next = 0;
    for (int step = 0; step < 5000; ++step) {
      // A few arrivals per step, the same for both paths.
      for (int k = static_cast<int>(rng() % 3); k > 0 && next < reqs.size(); --k, ++next) {
        const bool a = lp.sched.add(reqs[next]).ok();
        const bool b = direct.add(reqs[next]).ok();
        REQUIRE(a == b);
        if (a) expect[reqs[next].id] = solo(reqs[next].prompt, reqs[next].max_new_tokens);
      }
      // Now and then a request is cancelled, wherever it is.
      if (rng() % 9 == 0 && !expect.empty()) {
        auto it = expect.begin();
        std::advance(it, static_cast<long>(rng() % expect.size()));
        lp.sched.abort(it->first);
        direct.abort(it->first);
        aborted.insert(it->first);
      }
      bool stepped = false;
      for (auto& f : lp.step(&stepped)) got_ledger[f.id] = f.output;
      StepPlan dp = direct.schedule();
      if (!dp.seqs.empty()) {
        auto ps = plan_step(dp, direct, direct_kv);
        REQUIRE(ps.ok());
        direct_cache.run(*ps, dp, direct);
        std::vector<int32_t> sampled;
        for (const auto& q : dp.seqs)
          if (q.samples) sampled.push_back(fake_next(direct.state(q.id)->tokens));
        for (auto& f : direct.update(dp, sampled, is_stop)) got_direct[f.id] = f.output;
      }
      if (next == reqs.size() && !lp.sched.num_running() && !lp.sched.num_waiting() && !direct.num_running() &&
          !direct.num_waiting())
        break;
    }
    lp.flush();
    REQUIRE(lp.sched.num_running() + lp.sched.num_waiting() == 0);
    REQUIRE(lp.owner.num_free_blocks() == blocks);  // back to baseline
    REQUIRE(direct_kv.num_free_blocks() == blocks);
    for (const auto& [id, out] : expect) {
      if (aborted.count(id)) continue;
      INFO("request " << id);
      REQUIRE(got_ledger.count(id));
      REQUIRE(got_ledger[id] == out);
      REQUIRE(got_direct[id] == out);
    }
    if (kc.enable_prefix_caching) REQUIRE(lp.owner.stats().prefix_hits > 0);
    ++cases;
  }
  REQUIRE(cases == 24);
}

TEST_CASE("kv ledger: a prompt longer than the budget reuses its cached prefix (hint first, then admission)",
          "[kv][scheduler]") {
  const int32_t bs = 8;
  SchedulerConfig sc{32, 4, true};
  KvBlockConfig kc{64, bs, true};
  LedgerPath lp(sc, kc);
  std::vector<int32_t> a;
  for (int i = 0; i < 100; ++i) a.push_back(1 + (i * 7) % 45);
  REQUIRE(lp.sched.add({1, a, 2, 0}).ok());
  bool stepped = false;
  int steps = 0;
  for (; lp.sched.num_running() + lp.sched.num_waiting() > 0 && steps < 100; ++steps) lp.step(&stepped);
  lp.flush();
  REQUIRE(lp.owner.num_free_blocks() == 64);
  // The second request shares 96 tokens (12 full blocks) and adds 4.
  std::vector<int32_t> b(a.begin(), a.begin() + 96);
  for (int i = 0; i < 4; ++i) b.push_back(46 + i);
  REQUIRE(lp.sched.add({2, b, 1, 0}).ok());
  // First round: no hint yet, so no admission; the request's probe goes to the owner.
  StepPlan first = lp.sched.schedule();
  REQUIRE(first.seqs.empty());
  REQUIRE(lp.ledger.has_pending());
  std::vector<KvOp> ops;
  lp.send(first, &ops);
  REQUIRE(ops.empty());
  // Second round: admitted from the hint; only the 4 new tokens are computed.
  StepPlan second = lp.sched.schedule();
  REQUIRE(second.seqs.size() == 1);
  REQUIRE(second.seqs[0].num_computed == 96);
  KvOpsReply r = lp.send(second, &ops);
  REQUIRE(lp.sched.settle(second, ops, r.results).ok());
  REQUIRE(second.seqs[0].num_computed == 96);
  REQUIRE(second.seqs[0].num_new == 4);
  REQUIRE(second.seqs[0].samples);
}

TEST_CASE(
    "kv ledger: the owner refuses what does not fit and later admissions with it, and settle puts them back in order",
    "[kv][scheduler]") {
  KvBlockManager owner({4, 4, false});
  KvOpsRequest req;
  KvOp a;
  a.kind = KvOp::Kind::Admit;
  a.seq = 1;
  a.num_tokens = 12;
  a.allowance = 3;
  a.tokens.assign(12, 5);
  KvOp b = a;
  b.seq = 2;  // needs 3 more blocks; one is left
  KvOp c = a;
  c.seq = 3;
  c.num_tokens = 1;
  c.allowance = 1;
  c.tokens = {9};  // would fit, but comes after a refusal
  KvOp r;
  r.kind = KvOp::Kind::Reserve;
  r.seq = 77;  // unknown sequence
  r.num_tokens = 4;
  req.ops = {a, b, c, r};
  KvOpsReply rep = apply_kv_ops(owner, req);
  REQUIRE(rep.results.size() == 4);
  REQUIRE(rep.results[0].ok);
  REQUIRE(rep.results[0].num_new == 12);
  REQUIRE_FALSE(rep.results[1].ok);
  REQUIRE_FALSE(rep.results[2].ok);
  REQUIRE_FALSE(rep.results[3].ok);
  REQUIRE(owner.num_free_blocks() == 1);
  REQUIRE(owner.check_invariants().ok());
  REQUIRE(rep.snapshot.seqs.size() == 1);
  REQUIRE(rep.snapshot.seqs[0].held == 3);
  REQUIRE(rep.snapshot.seqs[0].exclusive == 3);

  // settle(): refused admissions go back to the head of the queue, in order. (Whole-prompt
  // admissions, chunked prefill off: the only kind the owner may refuse first.)
  KvLedger ledger({4, 4, false}, false);
  Scheduler s({64, 8, false}, ledger, SchedulingPolicy::fcfs());
  REQUIRE(s.add({1, std::vector<int32_t>(12, 5), 1, 0}).ok());
  REQUIRE(s.add({2, std::vector<int32_t>(4, 6), 1, 0}).ok());
  REQUIRE(s.add({3, std::vector<int32_t>(4, 7), 1, 0}).ok());
  StepPlan plan = s.schedule();
  REQUIRE(plan.seqs.size() == 2);  // the ledger counts 4 blocks: 3 + 1
  std::vector<KvOp> ops = ledger.take_ops();
  REQUIRE(ops.size() == 2);
  REQUIRE(s.settle(plan, ops, {{true, 0, 12}, {false, 0, 0}}).ok());
  REQUIRE(plan.seqs.size() == 1);
  REQUIRE(plan.num_tokens == 12);
  REQUIRE(s.num_running() == 1);
  REQUIRE(std::vector<int64_t>(s.waiting().begin(), s.waiting().end()) == std::vector<int64_t>{2, 3});
  REQUIRE(ops[1].whole);
  // Answers that do not match the plan are an error, not a guess; so is a refusal the
  // ledger's counts rule out (a reservation, or a chunked admission at the head).
  StepPlan other = plan;
  REQUIRE_FALSE(s.settle(other, ops, {{true, 0, 12}}).ok());
  REQUIRE_FALSE(s.settle(other, {ops[0]}, {{true, 0, 13}}).ok());
  KvOp chunked = ops[0];
  chunked.whole = false;
  REQUIRE_FALSE(s.settle(other, {chunked}, {{false, 0, 0}}).ok());
  KvOp reserve;
  reserve.kind = KvOp::Kind::Reserve;
  reserve.seq = 1;
  REQUIRE_FALSE(s.settle(other, {reserve}, {{false, 0, 0}}).ok());
}
