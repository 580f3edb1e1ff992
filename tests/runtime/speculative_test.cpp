// Speculative decoding (issue 35): the rejection sampler is lossless (chi-squared over
// 200k draws per case), verify_drafts gives the tokens sampling one row at a time gives,
// the scheduler plans drafts only from the budget and blocks a step leaves and rolls
// rejected ones back (KV invariants, every block back at the end, outputs equal to no
// drafts), and on the default model the engine's greedy and seeded output with n-gram
// drafts equals the output without, alone and batched.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <random>

#include "runtime/engine/engine.h"
#include "runtime/model/model_files.h"
#include "runtime/sample/speculative.h"
#include "runtime/sched/scheduler.h"
#include "runtime/spec/ngram_draft.h"
#include "tests/runtime/fake_next.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

// Pearson's chi-squared statistic of counts against probabilities (cells with p > 0).
double chi_squared(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int* dof) {
  double x2 = 0;
  *dof = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      REQUIRE(counts[i] == 0);  // a token the target rules out is never emitted
      continue;
    }
    const double e = p[i] * static_cast<double>(n);
    x2 += (counts[i] - e) * (counts[i] - e) / e;
    ++*dof;
  }
  return x2;
}

// The chi-squared quantile for p-value 0.001 (Wilson-Hilferty; within 1% for dof >= 3).
double chi2_critical_001(int dof) {
  const double z = 3.090232;  // the normal's 0.999 quantile
  const double k = dof;
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

std::vector<float> normalise(std::vector<float> v) {
  double s = 0;
  for (float x : v) s += x;
  for (float& x : v) x = static_cast<float>(x / s);
  return v;
}

}  // namespace

TEST_CASE("rejection sampler: emitted tokens follow the target's distribution", "[spec][sampling]") {
  std::mt19937_64 rng(20261207);
  std::uniform_real_distribution<double> u01(0, 1);
  const int32_t vocab = 12;
  std::vector<float> p(vocab), q(vocab);
  for (int i = 0; i < vocab; ++i) {
    p[i] = static_cast<float>(std::exp(std::sin(i * 1.7) * 2));
    q[i] = static_cast<float>(std::exp(std::cos(i * 0.9) * 2));
  }
  p[3] = 0;  // a token the target never emits, that the draft likes
  q[7] = 0;  // and one the draft never proposes
  p = normalise(p);
  q = normalise(q);
  std::vector<float> point(vocab, 0.0f);
  point[5] = 1;  // a deterministic draft (n-gram): q is a point mass
  struct Case {
    const char* what;
    const std::vector<float>* q;
  } cases[] = {
      {"draft distribution unlike the target", &q}, {"point-mass draft", &point}, {"draft equal to target", &p}};
  for (const auto& c : cases) {
    INFO(c.what);
    std::discrete_distribution<int32_t> from_q(c.q->begin(), c.q->end());
    const int64_t n = 200000;
    std::vector<int64_t> counts(vocab, 0);
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t x = from_q(rng);
      const RejectionDraw d = rejection_sample(p.data(), c.q->data(), vocab, x, u01(rng), u01(rng));
      REQUIRE(d.token >= 0);
      REQUIRE(d.token < vocab);
      ++counts[d.token];
      accepted += d.accepted ? 1 : 0;
    }
    int dof = 0;
    const double x2 = chi_squared(counts, std::vector<double>(p.begin(), p.end()), n, &dof);
    INFO("chi-squared " << x2 << " with " << dof << " degrees of freedom, critical value (p = 0.001) "
                        << chi2_critical_001(dof));
    CHECK(x2 < chi2_critical_001(dof));
    // Acceptance is sum_x min(p(x), q(x)) (1 - the total variation distance).
    double want = 0;
    for (int i = 0; i < vocab; ++i) want += std::min(p[i], (*c.q)[i]);
    CHECK(std::fabs(static_cast<double>(accepted) / n - want) < 0.01);
  }
}

TEST_CASE("verify_drafts: the tokens one row at a time gives, cut after the first miss", "[spec][sampling]") {
  const int32_t vocab = 50;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 2);
  std::vector<float> rows(6 * vocab);
  for (auto& v : rows) v = nd(rng);
  for (float temperature : {0.0f, 0.9f}) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.top_k = 20;
    sp.repetition_penalty = 1.2f;
    sp.seed = 99;
    // The reference: a sampler drawing each row in turn.
    Sampler ref(sp, vocab);
    std::vector<int32_t> want;
    for (int i = 0; i < 6; ++i) {
      auto r = ref.sample(rows.data() + i * vocab);
      ref.accept(r.token);
      want.push_back(r.token);
    }
    INFO("temperature " << temperature);
    for (int right = 0; right <= 5; ++right) {  // drafts matching the first `right` tokens, then wrong
      std::vector<int32_t> drafts(want.begin(), want.begin() + 5);
      if (right < 5) drafts[right] = (drafts[right] + 1) % vocab;
      Sampler s(sp, vocab);
      auto got = verify_drafts(s, drafts, [&](size_t i) { return rows.data() + i * vocab; });
      REQUIRE(got.size() == static_cast<size_t>(right + 1));
      for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].token == want[i]);
      CHECK(s.draws() == got.size());
    }
  }
}

namespace {

// Drafts for the fake model: its true continuation for the first `good` tokens, then wrong
// ones (`bad` of them), so that a step's acceptance is known in advance.
struct ScriptedDraft : DraftSource {
  int good = 2, bad = 2;
  int64_t released = 0;
  std::string name() const override { return "scripted"; }
  std::vector<int32_t> propose(int64_t, const std::vector<int32_t>& tokens, int32_t max) override {
    std::vector<int32_t> t = tokens, out;
    for (int i = 0; i < good + bad && static_cast<int32_t>(out.size()) < max; ++i) {
      const int32_t next = test::fake_next(t);
      out.push_back(i < good ? next : (next + 1) % 50);
      t.push_back(out.back());
    }
    return out;
  }
  void release(int64_t) override { ++released; }
};

// Runs the scheduler with the fake model verifying every plan's drafts; returns outputs.
std::map<int64_t, std::vector<int32_t>> drive_spec(Scheduler& s, KvBlockManager& kv, SpecStats* stats,
                                                   int32_t* most_tokens) {
  std::map<int64_t, std::vector<int32_t>> out;
  for (int step = 0; step < 20000 && (s.num_running() || s.num_waiting()); ++step) {
    StepPlan p = s.schedule();
    REQUIRE(p.num_tokens > 0);
    *most_tokens = std::max(*most_tokens, p.num_tokens);
    std::vector<int32_t> sampled, counts;
    for (const auto& q : p.seqs) {
      if (!q.samples) continue;
      REQUIRE(q.drafts.size() <= 3);  // num_speculative_tokens
      std::vector<int32_t> t = s.state(q.id)->tokens;
      int32_t n = 0;
      for (size_t i = 0; i <= q.drafts.size(); ++i) {
        const int32_t tok = test::fake_next(t);
        sampled.push_back(tok);
        t.push_back(tok);
        ++n;
        if (i == q.drafts.size() || tok != q.drafts[i]) break;
      }
      counts.push_back(n);
    }
    for (auto& f : s.update(
             p, sampled, [](int64_t, int32_t t) { return t == 0; }, &counts))
      out[f.id] = f.output;
    auto st = kv.check_invariants();
    if (!st.ok()) FAIL(st.error().message);
    for (const auto& q : p.seqs)  // a running sequence holds exactly the blocks its computed tokens need
      if (const SchedState* ss = s.state(q.id); ss && q.samples) REQUIRE(kv.num_tokens(q.id) <= ss->num_computed + 1);
  }
  *stats = s.spec_stats();
  return out;
}

}  // namespace

TEST_CASE("scheduler: drafts take the budget a step leaves and rejected ones are rolled back", "[spec][scheduler]") {
  std::vector<SeqRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    SeqRequest r;
    r.id = i + 1;
    for (int j = 0; j < 5 + 9 * i; ++j) r.prompt.push_back(1 + (j * 7 + i * 3) % 40);
    r.max_new_tokens = 6 + 5 * i;
    reqs.push_back(r);
  }
  // Without drafts: the reference outputs, and the preemptions each pool size causes.
  std::map<int64_t, std::vector<int32_t>> plain;
  std::map<int32_t, uint64_t> plain_preemptions;
  for (int32_t blocks : {64, 24}) {
    KvBlockManager kv({blocks, 4, true});
    Scheduler s({16, 8}, kv, SchedulingPolicy::fcfs());
    for (const auto& r : reqs) REQUIRE(s.add(r).ok());
    SpecStats st;
    int32_t most = 0;
    plain = drive_spec(s, kv, &st, &most);
    CHECK(st.num_draft_tokens == 0);
    plain_preemptions[blocks] = s.num_preemptions();
  }
  CHECK(plain_preemptions[64] == 0);
  for (int good : {0, 2, 5}) {
    for (int32_t blocks : {64, 24}) {  // plenty, then tight (drafts must not preempt)
      INFO("good drafts " << good << ", blocks " << blocks);
      KvBlockManager kv({blocks, 4, true});
      SchedulerConfig cfg{16, 8};
      cfg.num_speculative_tokens = 3;
      Scheduler s(cfg, kv, SchedulingPolicy::fcfs());
      ScriptedDraft d;
      d.good = good;
      s.set_draft_source(&d);
      for (const auto& r : reqs) REQUIRE(s.add(r).ok());
      SpecStats st;
      int32_t most = 0;
      const auto out = drive_spec(s, kv, &st, &most);
      CHECK(out == plain);
      CHECK(most <= 16);  // drafts count against the budget
      CHECK(st.num_draft_tokens > 0);
      CHECK(st.num_accepted_tokens <= st.num_draft_tokens);
      if (good == 0) CHECK(st.num_accepted_tokens == 0);
      if (good >= 3) CHECK(st.num_accepted_tokens == st.num_draft_tokens);
      if (good == 2) CHECK(st.num_accepted_tokens < st.num_draft_tokens);
      CHECK(kv.num_free_blocks() == blocks);  // every block back
      CHECK(d.released == static_cast<int64_t>(reqs.size()));
      // Drafts take only free blocks: they never cause a preemption the plain run does not have.
      CHECK(s.num_preemptions() <= plain_preemptions[blocks]);
    }
  }
}

TEST_CASE("scheduler: no draft past max_new_tokens, none for a request that asks for none", "[spec][scheduler]") {
  KvBlockManager kv({32, 4, false});
  SchedulerConfig cfg{32, 8};
  cfg.num_speculative_tokens = 8;
  Scheduler s(cfg, kv, SchedulingPolicy::fcfs());
  ScriptedDraft d;
  d.good = 8;
  d.bad = 0;
  s.set_draft_source(&d);
  SeqRequest a;
  a.id = 1;
  a.prompt = {1, 2, 3, 4, 5};
  a.max_new_tokens = 4;
  SeqRequest b = a;
  b.id = 2;
  b.num_speculative_tokens = 0;
  REQUIRE(s.add(a).ok());
  REQUIRE(s.add(b).ok());
  StepPlan p1 = s.schedule();  // both prefills
  REQUIRE(p1.seqs.size() == 2);
  s.update(p1, {test::fake_next(s.state(1)->tokens), test::fake_next(s.state(2)->tokens)}, nullptr);
  StepPlan p2 = s.schedule();
  REQUIRE(p2.seqs.size() == 2);
  CHECK(p2.seqs[0].drafts.size() == 2);  // 3 tokens left: the last needs no draft after it
  CHECK(p2.seqs[1].drafts.empty());
  CHECK(p2.seqs[0].num_new == 3);
}

TEST_CASE("engine on the default model: n-gram and self-drafts change no token, alone or batched",
          "[spec][default_model]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  auto backend = make_cpu_backend({2});
  auto model = Model::build(files->config, *files->weights, *backend, 64);
  REQUIRE(model.ok());
  const auto& tok = *files->tokenizer;
  const std::string passage =
      "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
      "How vexingly quick daft zebras jump!";
  std::vector<std::vector<int32_t>> prompts = {
      tok.encode("Copy this text exactly.\nText: " + passage + "\nCopy: " + passage + "\nText: " + passage + "\nCopy:",
                 true, true),
      tok.encode("Once upon a time, in a small village by the sea, there lived", true, true),
      tok.encode("List the numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", true, true),
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.top_k = 40;
  seeded.top_p = 0.95f;
  seeded.repetition_penalty = 1.1f;
  seeded.seed = 77;
  auto is_eog = [&](int32_t t) { return tok.is_eog(t); };
  SpecStats spec;  // the last run's
  auto run = [&](const std::vector<size_t>& which, const SamplingParams& sp, int32_t drafts, uint64_t* accepted,
                 const std::string& method = "ngram") {
    EngineConfig cfg;
    cfg.scheduler = {64, 8};
    cfg.scheduler.num_speculative_tokens = drafts;
    cfg.kv = {64, 16, true};
    auto e = Engine::create(**model, *backend, cfg, SchedulingPolicy::fcfs(), is_eog);
    REQUIRE(e.ok());
    if (drafts > 0) {
      auto d = make_draft_source(method);
      REQUIRE(d.ok());
      REQUIRE((*e)->set_draft_source(std::move(*d)).ok());
    }
    for (size_t i : which) {
      SeqRequest r;
      r.id = static_cast<int64_t>(i);
      r.prompt = prompts[i];
      r.max_new_tokens = 40;
      r.sampling = sp;
      r.sampling.seed += i;
      REQUIRE((*e)->add(r).ok());
    }
    std::map<int64_t, std::vector<int32_t>> out;
    for (int guard = 0; (*e)->has_work() && guard < 10000; ++guard) {
      auto ev = (*e)->step();
      REQUIRE(ev.ok());
      for (const auto& x : *ev) out[x.id].push_back(x.token);
      auto st = (*e)->kv().check_invariants();
      if (!st.ok()) FAIL(st.error().message);
    }
    REQUIRE((*e)->kv().num_free_blocks() == 64);
    spec = (*e)->scheduler().spec_stats();
    *accepted = spec.num_accepted_tokens;
    return out;
  };
  for (const SamplingParams& sp : {greedy, seeded}) {
    INFO("temperature " << sp.temperature);
    uint64_t acc = 0;
    std::map<int64_t, std::vector<int32_t>> solo;
    for (size_t i = 0; i < prompts.size(); ++i) solo[static_cast<int64_t>(i)] = run({i}, sp, 0, &acc)[i];
    for (int32_t drafts : {2, 6}) {
      INFO("drafts " << drafts);
      uint64_t alone_accepted = 0;
      auto alone = run({0}, sp, drafts, &alone_accepted);
      CHECK(alone[0] == solo[0]);
      if (sp.temperature == 0) CHECK(alone_accepted > 0);  // the copy prompt copies
      uint64_t batch_accepted = 0;
      auto batched = run({0, 1, 2}, sp, drafts, &batch_accepted);
      CHECK(batched == solo);
      // Self-drafting from the first 8 of 30 layers: drafts from the model's own KV, in
      // rounds before the verifying pass; the same tokens alone and batched.
      uint64_t self_accepted = 0;
      CHECK(run({0}, sp, drafts, &self_accepted, "self:8")[0] == solo[0]);
      CHECK(spec.num_draft_tokens > 0);
      CHECK(run({0, 1, 2}, sp, drafts, &self_accepted, "self:8") == solo);
    }
  }
  // The whole model as its own draft: a greedy draft is the token the target picks next
  // (the draft rounds' one-token passes give the bits of the verifying pass: the kernels'
  // batch invariance), so every draft lands but those past a sequence's end.
  const int32_t n = files->config.num_layers;
  uint64_t acc = 0;
  std::map<int64_t, std::vector<int32_t>> solo;
  for (size_t i = 0; i < prompts.size(); ++i) solo[static_cast<int64_t>(i)] = run({i}, greedy, 0, &acc)[i];
  CHECK(run({0, 1, 2}, greedy, 6, &acc, "self:" + std::to_string(n)) == solo);
  INFO("drafted " << spec.num_draft_tokens << ", accepted " << spec.num_accepted_tokens);
  CHECK(spec.num_draft_tokens > 30);
  CHECK(spec.num_accepted_tokens + 3 * 6 >= spec.num_draft_tokens);
}

TEST_CASE("self-draft methods: names, layer counts checked against the model", "[spec]") {
  for (const char* bad : {"self:", "self:0", "self:x", "self:-2", "self:12345", "eagle"}) {
    INFO(bad);
    CHECK_FALSE(make_draft_source(bad).ok());
  }
  auto d = make_draft_source("self:8");
  REQUIRE(d.ok());
  CHECK((*d)->name() == "self:8");
  CHECK((*d)->self_draft_layers() == 8);
  CHECK((*d)->propose(1, {1, 2, 3}, 3) == std::vector<int32_t>{kWorkerDraft, kWorkerDraft, kWorkerDraft});
  CHECK_FALSE((*d)->bind({4, 1.0}).ok());  // more draft layers than the model has
  REQUIRE((*d)->bind({30, 6.0}).ok());
  CHECK((*d)->round_cost_estimate() == Approx(14.0 / 36.0));
  CHECK((*d)->bind({8, 0.0}).ok());  // the whole model as its draft (a check, never faster)
}
