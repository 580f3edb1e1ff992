// The scheduler core with a fake model whose next token is a function of the sequence so
// far: hand-checked steps (chunked prefill mixed with decode), priority order, refusal at
// admission, preemption under KV pressure with outputs identical to solo runs, aborts
// returning every block, and determinism.
#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "runtime/sched/scheduler.h"
#include "tests/runtime/fake_next.h"

using namespace troupe;

namespace {

using test::fake_next;

// Runs until everything finishes; returns outputs by id and the plans' token counts.
std::map<int64_t, std::vector<int32_t>> drive(Scheduler& s, KvBlockManager& kv, std::vector<StepPlan>* plans = nullptr,
                                              int max_steps = 10000) {
  std::map<int64_t, std::vector<int32_t>> out;
  for (int step = 0; step < max_steps && (s.num_running() || s.num_waiting()); ++step) {
    StepPlan p = s.schedule();
    REQUIRE(p.num_tokens > 0);
    std::vector<int32_t> sampled;
    for (const auto& q : p.seqs)
      if (q.samples) sampled.push_back(fake_next(s.state(q.id)->tokens));
    for (auto& f : s.update(p, sampled, [](int64_t, int32_t t) { return t == 0; })) out[f.id] = f.output;
    auto st = kv.check_invariants();
    if (!st.ok()) FAIL(st.error().message);
    if (plans) plans->push_back(std::move(p));
  }
  return out;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[i] = 1 + (i * 13 + salt * 5) % 40;
  return p;
}

}  // namespace

TEST_CASE("one token budget mixes decode with a prefill chunk", "[scheduler]") {
  KvBlockManager kv({64, 4, false});
  Scheduler s({8, 16}, kv, SchedulingPolicy::fcfs());
  REQUIRE(s.add({1, prompt(5, 1), 3, 0}).ok());
  REQUIRE(s.add({2, prompt(6, 2), 3, 0}).ok());
  StepPlan p1 = s.schedule();
  REQUIRE(p1.seqs.size() == 2);
  REQUIRE(p1.seqs[0].num_new == 5);
  REQUIRE(p1.seqs[0].samples);
  REQUIRE(p1.seqs[1].num_new == 3);  // chunked: budget 8 - 5
  REQUIRE_FALSE(p1.seqs[1].samples);
  s.update(p1, {fake_next(s.state(1)->tokens)}, nullptr);
  StepPlan p2 = s.schedule();
  REQUIRE(p2.seqs.size() == 2);
  REQUIRE(p2.seqs[0].num_new == 1);  // decode
  REQUIRE(p2.seqs[1].num_new == 3);  // the rest of the prompt
  REQUIRE(p2.seqs[1].num_computed == 3);
  REQUIRE(p2.seqs[1].samples);
  REQUIRE(p2.num_tokens == 4);
}

TEST_CASE("priority policy admits the most urgent first, FCFS keeps arrival order", "[scheduler]") {
  KvBlockManager kv({64, 4, false});
  Scheduler s({4, 1}, kv, SchedulingPolicy::priority());
  REQUIRE(s.add({1, prompt(3, 1), 1, 5}).ok());
  REQUIRE(s.add({2, prompt(3, 2), 1, 0}).ok());
  REQUIRE(s.schedule().seqs.at(0).id == 2);
  KvBlockManager kv2({64, 4, false});
  Scheduler f({4, 1}, kv2, SchedulingPolicy::fcfs());
  REQUIRE(f.add({1, prompt(3, 1), 1, 5}).ok());
  REQUIRE(f.add({2, prompt(3, 2), 1, 0}).ok());
  REQUIRE(f.schedule().seqs.at(0).id == 1);
}

TEST_CASE("a request that can never fit is refused at admission", "[scheduler][badinput]") {
  KvBlockManager kv({4, 4, false});
  Scheduler s({64, 8}, kv, SchedulingPolicy::fcfs());
  REQUIRE_FALSE(s.add({1, prompt(10, 1), 7, 0}).ok());  // 17 tokens > 16 slots
  REQUIRE(s.add({2, prompt(10, 1), 6, 0}).ok());
  REQUIRE_FALSE(s.add({2, prompt(3, 1), 1, 0}).ok());  // duplicate id
  REQUIRE_FALSE(s.add({3, {}, 1, 0}).ok());
}

TEST_CASE("KV pressure preempts and resumes with outputs identical to solo runs", "[scheduler][preemption]") {
  const int n = 6;
  std::map<int64_t, std::vector<int32_t>> solo;
  for (int i = 0; i < n; ++i) {
    KvBlockManager kv({64, 4, false});
    Scheduler s({16, 8}, kv, SchedulingPolicy::fcfs());
    REQUIRE(s.add({i, prompt(6 + i, i), 12, 0}).ok());
    auto o = drive(s, kv);
    solo[i] = o.at(i);
  }
  for (bool prefix : {false, true}) {
    KvBlockManager kv({12, 4, prefix});  // about 3x oversubscribed
    Scheduler s({16, 8}, kv, SchedulingPolicy::fcfs());
    for (int i = 0; i < n; ++i) REQUIRE(s.add({i, prompt(6 + i, i), 12, 0}).ok());
    std::vector<StepPlan> plans;
    auto out = drive(s, kv, &plans);
    size_t preemptions = 0;
    for (const auto& p : plans) preemptions += p.preempted.size();
    INFO("prefix caching " << prefix << ", preemptions " << preemptions);
    REQUIRE(preemptions > 0);
    REQUIRE(out == solo);
    REQUIRE(kv.num_free_blocks() == 12);
  }
}

TEST_CASE("aborts at any point return every block", "[scheduler]") {
  std::mt19937 rng(5);
  KvBlockManager kv({40, 4, true});
  Scheduler s({12, 6}, kv, SchedulingPolicy::fcfs());
  int64_t next = 0;
  for (int step = 0; step < 500; ++step) {
    if (rng() % 3 == 0)
      (void)s.add({next++, prompt(1 + static_cast<int>(rng() % 15), static_cast<int>(rng() % 3)),
                   1 + static_cast<int32_t>(rng() % 10), 0});
    if (rng() % 5 == 0 && next > 0) s.abort(static_cast<int64_t>(rng() % next));
    StepPlan p = s.schedule();
    std::vector<int32_t> sampled;
    for (const auto& q : p.seqs)
      if (q.samples) sampled.push_back(fake_next(s.state(q.id)->tokens));
    s.update(p, sampled, nullptr);
    auto st = kv.check_invariants();
    if (!st.ok()) FAIL(st.error().message);
  }
  for (int64_t id = 0; id < next; ++id) s.abort(id);
  REQUIRE(kv.num_free_blocks() == 40);
  REQUIRE(s.num_running() + s.num_waiting() == 0);
}

TEST_CASE("the same inputs give the same plans", "[scheduler]") {
  auto run = [] {
    KvBlockManager kv({20, 4, true});
    Scheduler s({10, 4}, kv, SchedulingPolicy::priority());
    for (int i = 0; i < 8; ++i) (void)s.add({i, prompt(3 + i, i % 2), 5, i % 3});
    std::vector<StepPlan> plans;
    drive(s, kv, &plans);
    std::vector<std::tuple<int64_t, int32_t, int32_t>> log;
    for (const auto& p : plans)
      for (const auto& q : p.seqs) log.emplace_back(q.id, q.num_computed, q.num_new);
    return log;
  };
  REQUIRE(run() == run());
}

TEST_CASE("chunked prefill off: prompts run whole or wait, over-budget prompts are refused", "[scheduler]") {
  KvBlockManager kv({64, 4, false});
  SchedulerConfig cfg{8, 16, false};
  Scheduler s(cfg, kv, SchedulingPolicy::fcfs());
  CHECK_FALSE(s.add({9, prompt(9, 9), 3, 0}).ok());  // 9 > the budget of 8
  REQUIRE(s.add({1, prompt(5, 1), 3, 0}).ok());
  REQUIRE(s.add({2, prompt(6, 2), 3, 0}).ok());
  StepPlan p1 = s.schedule();
  REQUIRE(p1.seqs.size() == 1);  // 6 tokens do not fit the 3 left: no chunk, request 2 waits
  CHECK(p1.seqs[0].id == 1);
  CHECK(p1.seqs[0].num_new == 5);
  s.update(p1, {fake_next(s.state(1)->tokens)}, nullptr);
  StepPlan p2 = s.schedule();
  REQUIRE(p2.seqs.size() == 2);
  CHECK(p2.seqs[0].num_new == 1);
  CHECK(p2.seqs[1].num_new == 6);  // whole
  CHECK(p2.seqs[1].samples);
}

TEST_CASE("chunked prefill on or off gives the same outputs, in different steps", "[scheduler]") {
  std::vector<size_t> steps;
  std::map<int64_t, std::vector<int32_t>> first;
  for (bool chunked : {true, false}) {
    KvBlockManager kv({96, 4, true});
    Scheduler s({16, 6, chunked}, kv, SchedulingPolicy::fcfs());
    std::mt19937 rng(5);
    for (int i = 0; i < 20; ++i)
      REQUIRE(s.add({i, prompt(1 + static_cast<int>(rng() % 16), i % 5), 1 + static_cast<int>(rng() % 12), 0}).ok());
    std::vector<StepPlan> plans;
    auto out = drive(s, kv, &plans);
    REQUIRE(out.size() == 20);
    for (const auto& p : plans) CHECK(p.num_tokens <= 16);
    if (chunked)
      first = out;
    else
      CHECK(out == first);
    steps.push_back(plans.size());
  }
  CHECK(steps[0] != steps[1]);
}

TEST_CASE("plans in flight: busy sequences are neither scheduled nor preempted", "[scheduler]") {
  KvBlockManager kv({5, 4, false});  // 20 tokens of KV: not enough for both to finish
  Scheduler s({16, 8}, kv, SchedulingPolicy::fcfs());
  REQUIRE(s.add({1, prompt(7, 1), 9, 0}).ok());
  REQUIRE(s.add({2, prompt(7, 2), 9, 0}).ok());
  StepPlan p1 = s.schedule();
  REQUIRE(p1.seqs.size() == 2);
  s.update(p1, {fake_next(s.state(1)->tokens), fake_next(s.state(2)->tokens)}, nullptr);
  // Request 1's next step is in flight: a second plan takes only request 2.
  std::set<int64_t> busy = {1};
  StepPlan p2 = s.schedule(&busy);
  REQUIRE(p2.seqs.size() == 1);
  CHECK(p2.seqs[0].id == 2);
  // Request 2 (last in FCFS order, the usual victim) is now in flight while request 1
  // grows past the pool: 1 itself must make room, not 2.
  s.update(p2, {fake_next(s.state(2)->tokens)}, nullptr);
  busy = {2};
  int preempted = 0;
  for (int i = 0; i < 12; ++i) {
    StepPlan p = s.schedule(&busy);
    for (int64_t v : p.preempted) {
      CHECK(v == 1);
      ++preempted;
    }
    if (p.seqs.empty()) break;
    std::vector<int32_t> sampled;
    for (const auto& q : p.seqs) {
      CHECK(q.id != 2);
      if (q.samples) sampled.push_back(fake_next(s.state(q.id)->tokens));
    }
    s.update(p, sampled, nullptr);
    auto st = kv.check_invariants();
    if (!st.ok()) FAIL(st.error().message);
  }
  CHECK(preempted > 0);
}

TEST_CASE("step-time model: least squares over recent steps", "[scheduler][itl]") {
  auto t = [](double n, double r, double p) { return 0.01 + 0.001 * n + 0.002 * r + 1e-6 * p; };
  StepTimeModel m;
  CHECK_FALSE(m.ready());
  for (int i = 0; i < 20; ++i) m.observe({8, 8, 800}, t(8, 8, 800));  // one size only: the slope is unknown
  CHECK_FALSE(m.ready());
  // One sampled row per step and no attention: those prices cannot be told apart and are 0.
  StepTimeModel line;
  for (int n : {64, 512, 8, 100, 8, 300}) line.observe({double(n), 1, 0}, 0.02 + 0.001 * n);
  REQUIRE(line.ready());
  CHECK(line.fixed_seconds() == Approx(0.02).epsilon(1e-6));
  CHECK(line.seconds_per_token() == Approx(0.001).epsilon(1e-6));
  CHECK(line.seconds_per_row() == 0);
  CHECK(line.seconds_per_pair() == 0);
  // Rows and attention pairs that vary apart from tokens get their own prices.
  const std::vector<StepShape> shapes = {{8, 8, 4000},  {64, 1, 2080},    {512, 2, 131328}, {100, 10, 9000},
                                         {40, 40, 800}, {300, 3, 200000}, {16, 16, 32000},  {200, 1, 20100}};
  for (const auto& sh : shapes) m.observe(sh, t(sh.tokens, sh.rows, sh.pairs));
  REQUIRE(m.ready());
  CHECK(m.fixed_seconds() == Approx(0.01).epsilon(1e-6));
  CHECK(m.seconds_per_token() == Approx(0.001).epsilon(1e-6));
  CHECK(m.seconds_per_row() == Approx(0.002).epsilon(1e-6));
  CHECK(m.seconds_per_pair() == Approx(1e-6).epsilon(1e-6));
  CHECK(m.predict({8, 8, 4000}) == Approx(t(8, 8, 4000)));
  // Nonsense is ignored, not learned.
  for (double bad : {-1.0, 0.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    m.observe({64, 1, 100}, bad);
  m.observe({0, 0, 0}, 5.0);
  m.observe({10, 11, 0}, 5.0);
  m.observe({10, -1, 0}, 5.0);
  m.observe({10, 1, -5}, 5.0);
  m.observe({10, 1, std::numeric_limits<double>::quiet_NaN()}, 5.0);
  CHECK(m.seconds_per_token() == Approx(0.001).epsilon(1e-6));
  CHECK(m.seconds_per_row() == Approx(0.002).epsilon(1e-6));
  // Older steps weigh less: after the machine slows to twice the price, the fit follows.
  for (int i = 0; i < 400; ++i) {
    const StepShape& sh = shapes[static_cast<size_t>(i) % shapes.size()];
    m.observe(sh, 2 * t(sh.tokens, sh.rows, sh.pairs));
  }
  CHECK(m.seconds_per_token() == Approx(0.002).epsilon(1e-2));
  CHECK(m.seconds_per_row() == Approx(0.004).epsilon(1e-2));
  CHECK(m.seconds_per_pair() == Approx(2e-6).epsilon(1e-2));
}

TEST_CASE("step-time model: a stall of the machine is counted at 1.5x the prediction", "[scheduler][itl]") {
  // Decode-only steps of 8 rows at 33 ms and prefill steps at 100 ms, the decode-only ones
  // stalled by 100 ms every tenth time (as a vCPU the host deschedules): the prices move a
  // little, not by the stalls' mean, and a lasting slowdown is still followed.
  auto t = [](double n) { return 0.01 + 0.001 * n + 0.002 * 8; };
  auto feed = [&](StepTimeModel& m, int steps, double scale, bool stalls) {
    for (int i = 0; i < steps; ++i) {
      const double n = i % 3 == 0 ? 70 : 8;
      m.observe({n, 8, 0}, scale * t(n) + (stalls && i % 10 == 9 && n == 8 ? 0.1 : 0.0));
    }
  };
  StepTimeModel clean, stalled;
  feed(clean, 30, 1, false);
  feed(stalled, 30, 1, false);
  REQUIRE(clean.ready());
  feed(stalled, 300, 1, true);
  INFO("decode-only " << stalled.predict({8, 8, 0}) << " vs " << t(8) << ", prefill " << stalled.predict({70, 8, 0})
                      << " vs " << t(70));
  CHECK(stalled.predict({8, 8, 0}) == Approx(t(8)).epsilon(0.1));
  CHECK(stalled.predict({70, 8, 0}) == Approx(t(70)).epsilon(0.1));
  feed(clean, 300, 2, false);  // the machine at half speed from now on
  CHECK(clean.predict({8, 8, 0}) == Approx(2 * t(8)).epsilon(1e-3));
  CHECK(clean.predict({70, 8, 0}) == Approx(2 * t(70)).epsilon(1e-3));
}

namespace {

// A scheduler with the latency target whose model has learned 20.25 ms + 1 ms per token.
std::unique_ptr<Scheduler> itl_scheduler(KvBlockManager& kv, double target_s, bool chunked = true,
                                         SchedulingPolicy policy = SchedulingPolicy::fcfs()) {
  auto owned = std::make_unique<Scheduler>(SchedulerConfig{512, 128, chunked, target_s}, kv, std::move(policy));
  Scheduler& s = *owned;
  for (int n : {8, 512, 64, 300}) {
    StepPlan p;  // one sampled row each: the rows' price folds into the fixed term
    p.seqs.push_back({1, 0, n, true});
    p.num_tokens = n;
    s.observe_step(p, 0.02025 + 0.001 * n);
  }
  return owned;
}

void step_all(Scheduler& s, const StepPlan& p) {
  std::vector<int32_t> sampled;
  for (const auto& q : p.seqs)
    if (q.samples) sampled.push_back(fake_next(s.state(q.id)->tokens));
  s.update(p, sampled, nullptr);
}

}  // namespace

TEST_CASE("latency target: streaming steps are capped, decodes keep their token, prefill still moves",
          "[scheduler][itl]") {
  KvBlockManager kv({512, 16, false});
  auto s_owned = itl_scheduler(kv, 0.1);
  Scheduler& s = *s_owned;
  for (int64_t id = 1; id <= 4; ++id) REQUIRE(s.add({id, prompt(10, static_cast<int>(id)), 200, 0}).ok());
  // Nobody streams yet: the whole budget (here 40 prompt tokens).
  StepPlan first = s.schedule();
  CHECK(first.num_tokens == 40);
  step_all(s, first);
  REQUIRE(s.add({9, prompt(1000, 9), 4, 0}).ok());
  // Four streams: max(100 ms, 3 x (20.25 + 4) ms) = 100 ms, i.e. 79 tokens; 75 go to the prompt.
  int prefilled = 0, steps = 0;
  while (prefilled < 1000) {
    StepPlan p = s.schedule();
    ++steps;
    REQUIRE(p.num_tokens <= 79);
    int decodes = 0;
    for (const auto& q : p.seqs) {
      if (q.id == 9)
        prefilled += q.num_new;
      else
        decodes += q.num_new == 1;
    }
    CHECK(decodes == 4);
    step_all(s, p);
    REQUIRE(steps < 100);
  }
  CHECK(steps == 14);  // ceil(1000 / 75)
  CHECK(s.num_capped_steps() == 14);
  // Without a target the same prompt goes in 512-token chunks.
  KvBlockManager kv2({512, 16, false});
  auto u_owned = itl_scheduler(kv2, 0);
  Scheduler& u = *u_owned;
  for (int64_t id = 1; id <= 4; ++id) REQUIRE(u.add({id, prompt(10, static_cast<int>(id)), 200, 0}).ok());
  step_all(u, u.schedule());
  REQUIRE(u.add({9, prompt(1000, 9), 4, 0}).ok());
  CHECK(u.schedule().num_tokens == 512);
  CHECK(u.num_capped_steps() == 0);
}

TEST_CASE("latency target: a floor of three decode-only steps, and off without chunked prefill", "[scheduler][itl]") {
  {
    // 100 streams: a decode-only step is predicted at 120.25 ms, so the cap is 3 x that
    // (340 tokens), not 100 ms.
    KvBlockManager kv({2048, 16, false});
    auto s_owned = itl_scheduler(kv, 0.1);
    Scheduler& s = *s_owned;
    for (int64_t id = 1; id <= 100; ++id) REQUIRE(s.add({id, prompt(4, static_cast<int>(id)), 50, 0}).ok());
    step_all(s, s.schedule());  // 400 prompt tokens: all 100 sample their first token
    REQUIRE(s.add({500, prompt(2000, 5), 4, 0}).ok());
    CHECK(s.schedule().num_tokens == 340);
  }
  {
    // Chunked prefill off: a prompt must go whole, so no cap applies (it would never fit).
    KvBlockManager kv({512, 16, false});
    auto s_owned = itl_scheduler(kv, 0.1, false);
    Scheduler& s = *s_owned;
    REQUIRE(s.add({1, prompt(10, 1), 50, 0}).ok());
    step_all(s, s.schedule());
    REQUIRE(s.add({2, prompt(400, 2), 4, 0}).ok());
    StepPlan p = s.schedule();
    CHECK(p.num_tokens == 401);
  }
}

TEST_CASE("latency target: a prefill ahead in policy order leaves the decodes after it their tokens",
          "[scheduler][itl]") {
  KvBlockManager kv({512, 16, false});
  auto s_owned = itl_scheduler(kv, 0.1, true, SchedulingPolicy::priority());
  Scheduler& s = *s_owned;
  REQUIRE(s.add({1, prompt(6, 1), 100, 5}).ok());
  REQUIRE(s.add({2, prompt(6, 2), 100, 5}).ok());
  step_all(s, s.schedule());
  REQUIRE(s.add({3, prompt(900, 3), 4, 0}).ok());  // more urgent: first in policy order once running
  step_all(s, s.schedule());                       // (admitted after the running ones)
  for (int step = 0; step < 5; ++step) {
    StepPlan p = s.schedule();
    REQUIRE(p.seqs.size() == 3);
    CHECK(p.seqs[0].id == 3);
    CHECK(p.seqs[0].num_new == p.num_tokens - 2);
    CHECK(p.num_tokens == 79);
    CHECK(p.seqs[1].num_new == 1);
    CHECK(p.seqs[2].num_new == 1);
    step_all(s, p);
  }
}

// The waiting queue is kept in order incrementally (an ordered set with a rank for ties)
// instead of stable-sorting it on every change; this follows a reference queue that does
// the old thing -- new requests at the back, preempted ones at the front, a stable sort by
// the policy after each change -- through random arrivals, admissions, preemptions under
// KV pressure and aborts, with a policy that ties often (priority alone, no arrival order).
TEST_CASE("the waiting queue keeps the order a stable sort by the policy would", "[scheduler][unit]") {
  for (int variant = 0; variant < 3; ++variant) {
    std::mt19937 rng(100 + variant);
    SchedulingPolicy ties{[](const SchedState& a, const SchedState& b) { return a.req.priority < b.req.priority; }};
    SchedulingPolicy policy = variant == 0   ? ties
                              : variant == 1 ? SchedulingPolicy::priority()
                                             : SchedulingPolicy::fcfs();
    KvBlockManager kv({24, 4, variant != 1});
    Scheduler s({12, 6}, kv, policy);
    std::vector<int64_t> ref;  // the reference waiting queue
    auto resort = [&] {
      std::stable_sort(ref.begin(), ref.end(),
                       [&](int64_t a, int64_t b) { return policy.before(*s.state(a), *s.state(b)); });
    };
    auto same = [&] {
      std::vector<int64_t> got(s.waiting().begin(), s.waiting().end());
      REQUIRE(got == ref);
    };
    int64_t next_id = 1;
    for (int step = 0; step < 400; ++step) {
      for (int k = static_cast<int>(rng() % 3); k > 0; --k) {
        const int64_t id = next_id++;
        SeqRequest r{id, prompt(2 + static_cast<int>(rng() % 20), static_cast<int>(id)),
                     1 + static_cast<int32_t>(rng() % 12), static_cast<int32_t>(rng() % 3)};
        REQUIRE(s.add(r).ok());
        ref.push_back(id);
        resort();
        same();
      }
      if (rng() % 7 == 0 && next_id > 1) {  // abort a random known id (waiting, running or gone)
        const int64_t id = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(next_id - 1));
        s.abort(id);
        ref.erase(std::remove(ref.begin(), ref.end(), id), ref.end());
        same();
      }
      StepPlan p = s.schedule();
      // Preempted sequences went to the front (each in turn, as push_front did); every
      // sequence in the plan runs (a victim may be admitted again in the same step).
      for (int64_t id : p.preempted) {
        ref.insert(ref.begin(), id);
        resort();
      }
      for (const auto& q : p.seqs) ref.erase(std::remove(ref.begin(), ref.end(), q.id), ref.end());
      same();
      std::vector<int32_t> sampled;
      for (const auto& q : p.seqs)
        if (q.samples) sampled.push_back(fake_next(s.state(q.id)->tokens));
      s.update(p, sampled, nullptr);
      same();
    }
    REQUIRE(s.num_preemptions() > 0);  // (the case under test happened)
  }
}
