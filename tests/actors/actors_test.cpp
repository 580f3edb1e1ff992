// The actor runtime on a tiny real model, under CAF's deterministic test coordinator (no
// threads, no sleeps): request actors → tokenizer → scheduler → 1..3 pipeline stages →
// sampling → token streams. Greedy outputs equal solo runs; cancellation at any point
// returns the KV pool exactly to its baseline; n > 1 shares the prompt's blocks.
#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "actors/local_node.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/runtime/tiny_model.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

struct TinyFiles {
  std::string path;
  ModelFiles files;
  TinyFiles() {
    path = "/tmp/troupe_actors_" + std::to_string(::getpid()) + ".gguf";
    test::TinyModelSpec spec;
    spec.layers = 3;
    REQUIRE(test::tiny_model_writer(spec).write(path).ok());
    auto f = open_gguf(path);
    REQUIRE(f.ok());
    files = std::move(*f);
  }
  ~TinyFiles() { std::remove(path.c_str()); }
};

std::vector<int32_t> solo_greedy(const ModelFiles& files, const std::vector<int32_t>& prompt, int n) {
  auto be = make_cpu_backend({1});
  auto m = Model::build(files.config, *files.weights, *be, 64);
  REQUIRE(m.ok());
  auto r = SequenceRunner::create(**m, *be, 256);
  REQUIRE(r.ok());
  auto l = (*r)->feed(prompt);
  REQUIRE(l.ok());
  std::vector<int32_t> out;
  const int32_t vocab = files.config.vocab;
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(*l, *l + vocab) - *l);
    out.push_back(t);
    if (i + 1 < n) {
      l = (*r)->feed({t});
      REQUIRE(l.ok());
    }
  }
  return out;
}

// A node under the test coordinator; every request's updates are recorded.
struct TestNode {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  LocalNode node;
  std::map<int, std::vector<RequestUpdate>> updates;

  TestNode(const ModelFiles& files, int32_t stages, int32_t blocks, int32_t budget = 32,
           const std::string& device = "cpu") {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    NodeOptions opt;
    opt.num_stages = stages;
    opt.device = device;
    opt.threads = 1;
    opt.max_batch_tokens = 64;
    opt.detached_workers = false;
    opt.check_kv_invariants = true;
    opt.scheduler.scheduler = {budget, 8};
    opt.scheduler.kv = {blocks, 8, true};
    opt.scheduler.heartbeat = std::chrono::milliseconds(0);
    auto n = spawn_local_node(*sys, files, opt);
    REQUIRE(n.ok());
    node = std::move(*n);
  }
  ~TestNode() {
    node.stop();
    coordinator().run();
  }
  caf::scheduler::test_coordinator& coordinator() {
    return dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }
  request_actor submit(int key, RequestSpec spec) {
    spec.max_context = 256;
    auto* sink = &updates[key];
    return sys->spawn(request_fn, node.request_context, std::move(spec),
                      [sink](RequestUpdate u) { sink->push_back(std::move(u)); });
  }
  // Token ids per choice index, from the logprob records.
  std::map<int32_t, std::vector<int32_t>> tokens(int key) {
    std::map<int32_t, std::vector<int32_t>> out;
    for (const auto& u : updates[key])
      if (u.kind == RequestUpdate::Kind::delta)
        for (const auto& t : u.tokens) out[u.index].push_back(t.id);
    return out;
  }
  bool done(int key) {
    for (const auto& u : updates[key])
      if (u.kind == RequestUpdate::Kind::done) return true;
    return false;
  }
};

RequestSpec greedy_ids(const std::vector<int32_t>& prompt, int32_t n_new) {
  RequestSpec s;
  s.prompts.push_back({std::nullopt, prompt});
  s.max_tokens = n_new;
  s.seq.sampling.temperature = 0;
  s.seq.ignore_eos = true;
  s.want_logprobs = true;
  return s;
}

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back((j * 11 + i * 5 + 3) % test::tiny_vocab_size());
  return p;
}

}  // namespace

TEST_CASE(
    "actors: concurrent requests through 1, 2 and 3 pipeline stages (a plan in flight per stage) equal solo greedy "
    "runs",
    "[actors]") {
  TinyFiles tf;
  const int n_new = 8;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> solo;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(prompt_of(i, 3 + 9 * i));
    solo.push_back(solo_greedy(tf.files, prompts.back(), n_new));
  }
  for (int32_t stages : {1, 2, 3}) {
    for (int32_t blocks : {64, 10}) {  // plenty; then oversubscribed (preemption and resume)
      INFO("stages " << stages << ", blocks " << blocks);
      TestNode t(tf.files, stages, blocks);
      for (int i = 0; i < 5; ++i) t.submit(i, greedy_ids(prompts[i], n_new));
      t.coordinator().run();
      for (int i = 0; i < 5; ++i) {
        REQUIRE(t.done(i));
        REQUIRE(t.tokens(i)[0] == solo[i]);
      }
      const EngineStats s = t.node.board->read();
      REQUIRE(s.kv_free == blocks);
      REQUIRE(s.num_running + s.num_waiting == 0);
      REQUIRE(s.generation_tokens == 5u * n_new);
      if (blocks == 10) REQUIRE(s.preemptions > 0);
      // One plan per stage in flight at once: later plans leave out the sequences the
      // earlier ones hold, and the tokens above are still the solo ones.
      CHECK(s.most_plans_in_flight <= static_cast<uint64_t>(stages));
      if (stages > 1)
        CHECK(s.most_plans_in_flight >= 2);
      else
        CHECK(s.most_plans_in_flight == 1);
    }
  }
}

TEST_CASE("actors: a list of GPUs spreads the pipeline stages over them in contiguous groups", "[actors][cli]") {
  auto all = [](const std::string& d, int32_t n) {
    auto r = stage_devices(d, n);
    REQUIRE(r.ok());
    return *r;
  };
  using V = std::vector<std::string>;
  CHECK(all("cpu", 3) == V{"cpu", "cpu", "cpu"});
  CHECK(all("cuda:1", 2) == V{"cuda:1", "cuda:1"});
  CHECK(all("cuda:0,1", 2) == V{"cuda:0", "cuda:1"});
  CHECK(all("cuda:0,1", 4) == V{"cuda:0", "cuda:0", "cuda:1", "cuda:1"});
  CHECK(all("cuda:2,0,1", 5) == V{"cuda:2", "cuda:2", "cuda:0", "cuda:0", "cuda:1"});
  CHECK(all("cuda:0,0", 2) == V{"cuda:0", "cuda:0"});
  for (const char* bad : {"cuda:0,", "cuda:,1", "cuda:0,x", "cuda:0,,1", "cuda:0,1234"}) {
    INFO(bad);
    auto r = stage_devices(bad, 4);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("expected cuda:N,M") != std::string::npos);
  }
  auto few = stage_devices("cuda:0,1,2", 2);
  REQUIRE_FALSE(few.ok());
  CHECK(few.error().message.find("--pipeline-stages at least 3") != std::string::npos);
  CHECK_FALSE(stage_devices("cpu", 0).ok());
  // One backend cannot take a list (troupe run and bench make one).
  auto one = make_backend("cuda:0,1", 1);
  REQUIRE_FALSE(one.ok());
  CHECK(one.error().message.find("only troupe serve takes a list") != std::string::npos);
  // A node refuses a list longer than its stages before loading anything.
  TinyFiles tf;
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{cfg};
  NodeOptions opt;
  opt.num_stages = 1;
  opt.device = "cuda:0,1";
  opt.max_batch_tokens = 64;
  opt.scheduler.scheduler = {32, 8};
  opt.detached_workers = false;
  auto n = spawn_local_node(sys, tf.files, opt);
  REQUIRE_FALSE(n.ok());
  INFO(n.error().message);
  CHECK(n.error().message.find("names 2 GPUs") != std::string::npos);
}

TEST_CASE("actors: two pipeline stages on a GPU list (cuda:0,0) give one GPU stage's greedy tokens", "[actors][cuda]") {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
    WARN("skipped: " << why);
    return;
  }
  TinyFiles tf;
  const int n_new = 8;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(prompt_of(i, 3 + 11 * i));
  auto run = [&](int32_t stages, const std::string& device) {
    TestNode t(tf.files, stages, 64, 32, device);
    for (int i = 0; i < 4; ++i) t.submit(i, greedy_ids(prompts[i], n_new));
    t.coordinator().run();
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < 4; ++i) {
      REQUIRE(t.done(i));
      out.push_back(t.tokens(i)[0]);
      REQUIRE(out.back().size() == static_cast<size_t>(n_new));
    }
    CHECK(t.node.board->read().kv_free == 64);
    return out;
  };
  // (batch-invariant by default, so each stage's arithmetic does not depend on the split)
  const auto one = run(1, "cuda");
  CHECK(run(2, "cuda:0,0") == one);
  // Two GPUs, where there are two: the stages on different devices, activations between
  // them through host memory (the host-run backend of tests/hostrun has two).
  if (auto second = make_backend("cuda:1", 1); !second.ok()) {
    WARN("the two-GPU half skipped: " << second.error().message);
  } else {
    CHECK(run(2, "cuda:0,1") == one);
    CHECK(run(3, "cuda:0,1") == one);  // (stages 0-1 on GPU 0, stage 2 on GPU 1)
  }
}

TEST_CASE("actors: n > 1 shares the prompt's blocks and seeds give reproducible choices", "[actors]") {
  TinyFiles tf;
  TestNode t(tf.files, 1, 64);
  RequestSpec s = greedy_ids(prompt_of(1, 40), 6);
  s.n = 4;
  s.seq.sampling.temperature = 1.0f;
  s.seq.sampling.seed = 1234;
  s.has_seed = true;
  t.submit(0, s);
  t.submit(1, s);
  t.coordinator().run();
  REQUIRE(t.done(0));
  REQUIRE(t.done(1));
  auto a = t.tokens(0), b = t.tokens(1);
  REQUIRE(a.size() == 4);
  REQUIRE(a == b);  // same seed, same choices
  REQUIRE(a[0] != a[1]);
  const EngineStats st = t.node.board->read();
  // 8 requests of 40 tokens: 5 full blocks each; all but the first find them cached.
  REQUIRE(st.prefix_hits >= 7u * 4u);
  REQUIRE(st.computed_prompt_tokens < 2u * 40u + 8u * 8u);
  REQUIRE(st.kv_free == 64);
}

TEST_CASE("actors: cancelling at any point returns the KV pool to its baseline", "[actors][lifecycle]") {
  TinyFiles tf;
  TestNode t(tf.files, 2, 24);
  std::mt19937 rng(7);
  for (int round = 0; round < 60; ++round) {
    const int k = static_cast<int>(rng() % 4) + 1;
    std::vector<request_actor> reqs;
    for (int i = 0; i < k; ++i) {
      RequestSpec s = greedy_ids(prompt_of(round * 4 + i, 5 + static_cast<int>(rng() % 50)), 12);
      s.n = (rng() % 2) ? 4 : 1;
      reqs.push_back(t.submit(1000 * round + i, s));
    }
    // Let a random number of messages through, then cancel some requests mid-flight.
    const int steps = static_cast<int>(rng() % 60);
    for (int j = 0; j < steps && t.coordinator().try_run_once(); ++j) {}
    for (auto& r : reqs)
      if (rng() % 3) caf::anon_send(r, cancel_atom::value);
    t.coordinator().run();
    const EngineStats s = t.node.board->read();
    INFO("round " << round);
    REQUIRE(s.kv_free == 24);
    REQUIRE(s.num_running + s.num_waiting == 0);
  }
}

TEST_CASE("actors: ten thousand random submit/cancel cycles leak nothing", "[actors][lifecycle]") {
  // RELIABILITY: 10,000 random connect/cancel cycles. Each cycle is a request actor (what an
  // HTTP connection drives) cancelled at a random point: queued, prefilling, decoding, or
  // never; the KV pool and the scheduler must return to empty after every round.
  TinyFiles tf;
  TestNode t(tf.files, 1, 32);
  std::mt19937 rng(11);
  int cycles = 0, cancelled = 0, completed = 0;
  for (int round = 0; cycles < 10000; ++round) {
    const int k = static_cast<int>(rng() % 6) + 1;
    std::vector<std::pair<int, request_actor>> reqs;
    for (int i = 0; i < k; ++i, ++cycles) {
      RequestSpec s = greedy_ids(prompt_of(cycles, 3 + static_cast<int>(rng() % 40)), 1 + static_cast<int>(rng() % 6));
      s.n = (rng() % 4) ? 1 : 3;
      reqs.emplace_back(cycles, t.submit(cycles, s));
    }
    const int steps = static_cast<int>(rng() % 40);
    for (int j = 0; j < steps && t.coordinator().try_run_once(); ++j) {}
    for (auto& [key, r] : reqs)
      if (rng() % 2) {
        caf::anon_send(r, cancel_atom::value);
        ++cancelled;
      }
    t.coordinator().run();
    for (auto& [key, r] : reqs) {
      if (t.done(key)) ++completed;
      t.updates.erase(key);
    }
    const EngineStats st = t.node.board->read();
    INFO("round " << round << ", cycle " << cycles);
    REQUIRE(st.kv_free == 32);
    REQUIRE(st.num_running + st.num_waiting == 0);
  }
  INFO(cancelled << " cancelled, " << completed << " completed");
  CHECK(cancelled > 4000);
  CHECK(completed > 1000);
}

TEST_CASE("actors: bad submissions end with an error and harm no other request", "[actors][badinput]") {
  TinyFiles tf;
  TestNode t(tf.files, 1, 64);
  RequestSpec bad = greedy_ids({1, 2, 999999}, 4);  // token outside the vocabulary
  t.submit(0, bad);
  RequestSpec too_long = greedy_ids(prompt_of(0, 200), 100);  // over the context of 256
  t.submit(1, too_long);
  t.submit(2, greedy_ids(prompt_of(3, 12), 5));
  t.coordinator().run();
  auto failed = [&](int key) {
    for (const auto& u : t.updates[key])
      if (u.kind == RequestUpdate::Kind::failed) return u.status;
    return 0;
  };
  REQUIRE(failed(0) == 400);
  REQUIRE(failed(1) == 400);
  REQUIRE(t.done(2));
  REQUIRE(t.tokens(2)[0] == solo_greedy(tf.files, prompt_of(3, 12), 5));
}

TEST_CASE(
    "actors: a worker refuses a malformed step with an error its stage turns into StepFailed, then serves the next",
    "[actors]") {
  TinyFiles tf;
  TestNode t(tf.files, 2, 32);
  // A sink that records what the last stage answers.
  struct Seen {
    std::vector<StepDone> done;
    std::vector<StepFailed> failed;
  };
  auto seen = std::make_shared<Seen>();
  step_sink_actor sink = t.sys->spawn([seen]() -> step_sink_actor::behavior_type {
    return {[seen](StepDone& d) { seen->done.push_back(std::move(d)); },
            [seen](StepFailed& f) { seen->failed.push_back(std::move(f)); }};
  });
  auto good = [](uint64_t no) {
    StageStep s;
    s.step_no = no;
    s.token_ids = {1, 2, 3};
    s.positions = {0, 1, 2};
    s.query_start = {0, 3};
    s.context_lens = {3};
    s.slot_mapping = {0, 1, 2};
    s.block_tables = {0};
    s.max_blocks_per_seq = 1;
    s.logit_rows = {2};
    s.logit_seq = {7};
    NewSeqSampling ns;
    ns.seq_id = 7;
    ns.sampling.temperature = 0;
    ns.prompt = {1, 2, 3};
    s.new_seqs.push_back(ns);
    return s;
  };
  StageStep bad = good(1);
  bad.positions.pop_back();  // inconsistent token counts
  caf::anon_send(t.node.stages.front(), std::move(bad), sink);
  t.coordinator().run();
  REQUIRE(seen->failed.size() == 1);
  CHECK(seen->failed[0].step_no == 1);
  CHECK(seen->failed[0].error.find("inconsistent token counts") != std::string::npos);
  StageStep mid_bad = good(2);
  mid_bad.hidden = {1.0f, 2.0f};  // activations of the wrong size, sent straight to stage 2's worker
  caf::anon_send(t.node.stages.back(), std::move(mid_bad), sink);
  t.coordinator().run();
  REQUIRE(seen->failed.size() == 2);
  CHECK(seen->failed[1].error.find("activations have the wrong size") != std::string::npos);
  caf::anon_send(t.node.stages.front(), good(3), sink);
  t.coordinator().run();
  REQUIRE(seen->done.size() == 1);
  CHECK(seen->done[0].step_no == 3);
  REQUIRE(seen->done[0].sampled.size() == 1);
  // The greedy token of the 3-token prompt, as a solo run computes it.
  CHECK(seen->done[0].sampled[0].result.token == solo_greedy(tf.files, {1, 2, 3}, 1)[0]);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

TEST_CASE("actors: an id released and reused while its last step is in flight keeps a sampler", "[actors][lifecycle]") {
  // Step A samples sequence 7; step B, sent before A's answer is back, releases 7 and
  // brings a new sequence 7 (a client reusing an id). The new sampler must survive A's
  // answer and B's release, and C must find it.
  TinyFiles tf;
  TestNode t(tf.files, 1, 32);
  auto failed = std::make_shared<std::vector<std::string>>();
  auto done = std::make_shared<std::vector<StepDone>>();
  step_sink_actor sink = t.sys->spawn([failed, done]() -> step_sink_actor::behavior_type {
    return {[done](StepDone& d) { done->push_back(std::move(d)); },
            [failed](StepFailed& f) { failed->push_back(f.error); }};
  });
  auto step = [](uint64_t no, std::vector<int32_t> toks, int32_t pos0, int32_t block, bool is_new, bool release) {
    StageStep s;
    s.step_no = no;
    s.token_ids = toks;
    for (size_t i = 0; i < toks.size(); ++i) {
      s.positions.push_back(pos0 + static_cast<int32_t>(i));
      s.slot_mapping.push_back(block * 8 + pos0 + static_cast<int32_t>(i));
    }
    s.query_start = {0, static_cast<int32_t>(toks.size())};
    s.context_lens = {pos0 + static_cast<int32_t>(toks.size())};
    s.block_tables = {block};
    s.max_blocks_per_seq = 1;
    s.logit_rows = {static_cast<int32_t>(toks.size()) - 1};
    s.logit_seq = {7};
    if (release) s.released = {7};
    if (is_new) {
      NewSeqSampling ns;
      ns.seq_id = 7;
      ns.sampling.temperature = 1.0f;
      ns.sampling.seed = no;
      ns.prompt = toks;
      s.new_seqs.push_back(ns);
    }
    return s;
  };
  caf::anon_send(t.node.stages.front(), step(1, {1, 2, 3}, 0, 0, true, false), sink);
  caf::anon_send(t.node.stages.front(), step(2, {4, 5}, 0, 1, true, true), sink);
  t.coordinator().run();
  caf::anon_send(t.node.stages.front(), step(3, {6}, 2, 1, false, false), sink);
  t.coordinator().run();
  INFO((failed->empty() ? std::string() : failed->front()));
  CHECK(failed->empty());
  REQUIRE(done->size() == 3);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}
