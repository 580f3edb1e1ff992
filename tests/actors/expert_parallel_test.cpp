// Expert parallelism (actors/expert_actor.h): the routed experts of tiny formula MoE models
// (tests/runtime/formula_moe.h) run on expert-worker actors, in this process and behind a
// real node link on loopback; every layout -- 1..3 workers, replicas of hot experts, a
// worker for some layers only -- gives the single-process logits bit for bit, prefill and
// decode, alone and through the scheduler in batches. Bad placements, bad dispatches and
// a dead worker give errors that name what is wrong.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include "actors/codec.h"
#include "actors/expert_actor.h"
#include "actors/local_node.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/model/expert_placement.h"
#include "tests/runtime/formula_moe.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

struct MoeFile {
  std::string path;
  ModelFiles files;
  explicit MoeFile(const std::string& which) {
    path = "/tmp/troupe_ep_" + which + "_" + std::to_string(::getpid()) + ".gguf";
    REQUIRE(test::formula_moe_writer(test::formula_spec(which)).write(path).ok());
    auto f = open_gguf(path);
    REQUIRE(f.ok());
    files = std::move(*f);
  }
  ~MoeFile() { std::remove(path.c_str()); }
};

const std::vector<int32_t> kPrompt = {1, 260, 263, 259, 262, 263, 260};
const std::vector<int32_t> kDecode = {261, 263, 262, 260, 259, 263};

// Every logits row of the prompt (one prefill step) and of six decode steps.
std::vector<float> run_logits(Model& m, Backend& be) {
  auto r = SequenceRunner::create(m, be, 64);
  REQUIRE(r.ok());
  const int32_t V = m.config().vocab;
  std::vector<float> all(kPrompt.size() * static_cast<size_t>(V));
  REQUIRE((*r)->feed_rows(kPrompt, all.data()).ok());
  for (int32_t t : kDecode) {
    auto l = (*r)->feed({t});
    REQUIRE(l.ok());
    all.insert(all.end(), *l, *l + V);
  }
  return all;
}

// Expert workers for a placement, all local actors.
struct Workers {
  std::vector<expert_actor> actors;
  std::vector<ExpertRouter::Target> targets;
  Workers(caf::actor_system& sys, const ModelFiles& f, const ExpertPlacement& p, int32_t max_rows) {
    for (const auto& w : p.workers) {
      auto dev = std::make_shared<ExpertWorker>();
      dev->name = w.name;
      dev->backend = make_cpu_backend({1});
      auto shard = ExpertShard::build(f.config, *f.weights, *dev->backend, max_rows, w.experts);
      REQUIRE(shard.ok());
      dev->shard = std::move(*shard);
      auto a = sys.spawn<caf::detached>(expert_fn, dev);
      actors.push_back(a);
      targets.push_back({a, "expert worker '" + w.name + "'"});
    }
  }
  ~Workers() {
    for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
};

ExpertPlacement placement(const std::string& json, const ModelConfig& c) {
  auto p = ExpertPlacement::parse(json, c);
  INFO(json);
  REQUIRE(p.ok());
  return *p;
}

}  // namespace

TEST_CASE("expert parallelism: every layout gives the single-process logits bit for bit", "[moe][ep][actors]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (const char* which : {"mixtral", "qwen2moe", "mixtral_q8_0", "qwen2moe_q4_1", "olmoe"}) {
    MoeFile mf(which);
    const ModelConfig& c = mf.files.config;
    auto be = make_cpu_backend({1});
    auto ref_model = Model::build(c, *mf.files.weights, *be, 64);
    REQUIRE(ref_model.ok());
    const std::vector<float> ref = run_logits(**ref_model, *be);
    const int32_t E = c.moe.num_experts;
    std::vector<std::pair<std::string, ExpertPlacement>> layouts;
    for (int32_t n : {1, 2, 3}) layouts.emplace_back("even " + std::to_string(n), *ExpertPlacement::even(n, c));
    const std::string half = std::to_string(E / 2 - 1), rest = std::to_string(E / 2) + "-" + std::to_string(E - 1);
    layouts.emplace_back(
        "replicas",
        placement(R"({"workers": [{"name": "a", "experts": "0-)" + half + R"("}, {"name": "b", "experts": ")" + rest +
                      R"("}, {"name": "hot", "experts": [0, 1, )" + std::to_string(E - 1) +
                      R"(]}, {"name": "l1", "experts": "0-)" + std::to_string(E - 1) + R"(", "layers": [1]}]})",
                  c));
    for (const auto& [name, p] : layouts) {
      INFO(which << ", " << name);
      auto be2 = make_cpu_backend({1});
      auto m = Model::build(c, *mf.files.weights, *be2, 64, {}, {}, /*routed_experts=*/false);
      REQUIRE(m.ok());
      auto stats = std::make_shared<MoeStats>(c.num_layers, E);
      Workers w(sys, mf.files, p, 64 * c.moe.experts_per_tok);
      ExpertRouter router(sys, w.targets, p.replicas(c), std::chrono::seconds(30), stats);
      (*m)->set_expert_dispatcher(&router);
      (*m)->set_moe_stats(stats);
      const std::vector<float> got = run_logits(**m, *be2);
      REQUIRE(got.size() == ref.size());
      CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);
      const auto s = stats->snapshot();
      uint64_t routed = 0;
      for (uint64_t t : s.tokens) routed += t;
      // Every token of every step went to k experts in each layer.
      CHECK(routed == (kPrompt.size() + kDecode.size()) * c.moe.experts_per_tok * c.num_layers);
      CHECK(s.dispatches == (1 + kDecode.size()) * c.num_layers);
      CHECK(s.dispatch_bytes > 0);
      CHECK(s.combine_bytes > 0);
      CHECK(s.imbalance_max >= 1.0);
    }
  }
}

TEST_CASE("expert parallelism: a model without its experts and without a dispatcher fails its step", "[moe][ep]") {
  MoeFile mf("mixtral");
  auto be = make_cpu_backend({1});
  auto m = Model::build(mf.files.config, *mf.files.weights, *be, 64, {}, {}, false);
  REQUIRE(m.ok());
  auto r = SequenceRunner::create(**m, *be, 64);
  REQUIRE(r.ok());
  auto l = (*r)->feed(kPrompt);
  REQUIRE(!l.ok());
  CHECK_THAT(l.error().message, Catch::Contains("without its routed experts"));
}

TEST_CASE("expert parallelism: placement files are checked, errors name the worker and key", "[moe][ep]") {
  MoeFile mf("mixtral");  // 2 layers, 4 experts
  const ModelConfig& c = mf.files.config;
  auto err = [&](const std::string& json) {
    auto p = ExpertPlacement::parse(json, c);
    REQUIRE(!p.ok());
    return p.error().message;
  };
  CHECK_THAT(err("not json"), Catch::Contains("not JSON"));
  CHECK_THAT(err("[]"), Catch::Contains("expected an object"));
  CHECK_THAT(err(R"({"workers": []})"), Catch::Contains("no workers"));
  CHECK_THAT(err(R"({"workers": [], "extra": 1})"), Catch::Contains("unknown key 'extra'"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": [0, 1]}]})"),
             Catch::Contains("expert 2 of layer 0 is on no worker"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": [0, 9]}]})"),
             Catch::Contains("worker 'a': \"experts\": 9 is outside 0..3"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "3-1"}]})"), Catch::Contains("'a'"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "x-y"}]})"), Catch::Contains("not an id or a range"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": []}]})"), Catch::Contains("the list is empty"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "0-3"}, {"name": "a", "experts": "0-3"}]})"),
             Catch::Contains("used twice"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "0-3", "layers": [5]}]})"),
             Catch::Contains("\"layers\": 5 is outside 0..1"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "0-3", "node": "nohost"}]})"), Catch::Contains("HOST:PORT"));
  CHECK_THAT(err(R"({"workers": [{"name": "a", "experts": "0-3", "gpu": 1}]})"), Catch::Contains("unknown key 'gpu'"));
  CHECK_THAT(err(R"({"workers": [{"name": "a"}]})"), Catch::Contains("\"experts\" is missing"));
  CHECK(!ExpertPlacement::even(0, c).ok());
  CHECK(!ExpertPlacement::even(5, c).ok());
  CHECK(!ExpertPlacement::load("/nonexistent/placement.json", c).ok());
  auto p = ExpertPlacement::parse(
      R"({"workers": [{"name": "a", "experts": ["0-1", 3]}, {"name": "b", "experts": [2, "3"]}]})", c);
  REQUIRE(p.ok());
  const auto rep = p->replicas(c);
  CHECK(rep[1][3] == std::vector<int32_t>{0, 1});
  CHECK(rep[0][2] == std::vector<int32_t>{1});
  // A dense model has no experts to place.
  ModelConfig dense = c;
  dense.moe = MoeConfig{};
  CHECK(!ExpertPlacement::parse(R"({"workers": [{"experts": [0]}]})", dense).ok());
}

TEST_CASE("expert parallelism: an expert worker refuses a dispatch that does not match what it holds", "[moe][ep]") {
  MoeFile mf("mixtral");
  const ModelConfig& c = mf.files.config;
  auto be = make_cpu_backend({1});
  auto shard = ExpertShard::build(c, *mf.files.weights, *be, 16, {{0, {1, 2}}});
  REQUIRE(shard.ok());
  ExpertWorker w;
  w.shard = std::move(*shard);
  const size_t H = static_cast<size_t>(c.hidden);
  auto dispatch = [&](int32_t layer, std::vector<int32_t> experts, std::vector<int32_t> counts, size_t rows) {
    ExpertDispatch d;
    d.id = 7;
    d.layer = layer;
    d.experts = std::move(experts);
    d.counts = std::move(counts);
    d.rows.assign(rows * H, 0.25f);
    return run_expert_dispatch(w, d);
  };
  auto ok = dispatch(0, {1, 2}, {2, 1}, 3);
  CHECK(ok.error.empty());
  CHECK(ok.id == 7);
  CHECK(ok.rows.size() == 3 * H);
  CHECK_THAT(dispatch(1, {1}, {1}, 1).error, Catch::Contains("no expert of layer 1"));
  CHECK_THAT(dispatch(0, {3}, {1}, 1).error, Catch::Contains("does not hold expert 3"));
  CHECK_THAT(dispatch(0, {1, 1}, {1, 1}, 2).error, Catch::Contains("appears twice"));
  CHECK_THAT(dispatch(0, {1}, {2}, 1).error, Catch::Contains("wrong size"));
  CHECK_THAT(dispatch(0, {1}, {0}, 0).error, Catch::Contains("row count"));
  CHECK_THAT(dispatch(0, {1}, {17}, 17).error, Catch::Contains("row count"));
  CHECK_THAT(dispatch(0, {1, 2}, {1}, 1).error, Catch::Contains("differ in length"));
  CHECK(dispatch(0, {1}, {1}, 1).rows.size() == H);  // the worker lives on
  // Building refuses what the model does not have.
  CHECK(!ExpertShard::build(c, *mf.files.weights, *be, 16, {{0, {4}}}).ok());
  CHECK(!ExpertShard::build(c, *mf.files.weights, *be, 16, {{2, {0}}}).ok());
  CHECK(!ExpertShard::build(c, *mf.files.weights, *be, 16, {{0, {1, 1}}}).ok());
}

TEST_CASE("expert parallelism: dispatch and result round-trip the codec, hostile bytes are errors",
          "[moe][ep][codec]") {
  ExpertDispatch d;
  d.id = 1234567890123ull;
  d.layer = 3;
  d.experts = {0, 5, 7};
  d.counts = {2, 1, 4};
  for (int i = 0; i < 7 * 8; ++i) d.rows.push_back(0.5f * static_cast<float>(i) - 3.0f);
  auto b = codec::encode(d);
  auto back = codec::decode_expert_dispatch(b);
  REQUIRE(back.ok());
  CHECK(back->id == d.id);
  CHECK(back->layer == d.layer);
  CHECK(back->experts == d.experts);
  CHECK(back->counts == d.counts);
  CHECK(back->rows == d.rows);
  ExpertResult r;
  r.id = 9;
  r.layer = 1;
  r.rows = {1.0f, -2.0f};
  r.error = std::string("bad\0thing", 9);
  r.compute_seconds = 0.25;
  auto rb = codec::decode_expert_result(codec::encode(r));
  REQUIRE(rb.ok());
  CHECK(rb->rows == r.rows);
  CHECK(rb->error == r.error);
  CHECK(rb->compute_seconds == 0.25);
  NodeHello h;
  h.experts = {{0, {1, 2}}, {3, {0}}};
  h.max_expert_rows = 64;
  auto hb = codec::decode_node_hello(codec::encode(h));
  REQUIRE(hb.ok());
  CHECK(hb->experts == h.experts);
  CHECK(hb->max_expert_rows == 64);
  // Truncated, misaligned and garbage bytes decode to errors, never a crash.
  for (size_t cut : {size_t{0}, size_t{8}, b.size() / 2, b.size() - 8}) {
    codec::Bytes t(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cut));
    CHECK(!codec::decode_expert_dispatch(t).ok());
  }
  codec::Bytes odd(b.begin(), b.end() - 3);
  CHECK(!codec::decode_expert_dispatch(odd).ok());
  codec::Bytes junk(256, 0xff);
  CHECK(!codec::decode_expert_result(junk).ok());
}

namespace {

// A `troupe node`'s expert side on a loopback listener, in a thread (serve_stage_link reads
// the hello and hands an expert hello to serve_expert_link).
struct ExpertNode {
  link::Listener listener;
  std::thread thread;
  int port = 0;
  std::shared_ptr<link::Socket> accepted;
  std::mutex mu;
  ExpertNode(caf::actor_system& sys, const ModelFiles& files, const std::string& key) {
    auto p = listener.listen("127.0.0.1", 0);
    REQUIRE(p.ok());
    port = *p;
    thread = std::thread([this, &sys, &files, key] {
      auto s = listener.accept(20000);
      if (!s) return;
      auto sock = std::make_shared<link::Socket>(std::move(*s));
      {
        std::lock_guard<std::mutex> l(mu);
        accepted = sock;
      }
      if (!link::authenticate_as_node(*sock, key)) return;
      StageNodeOptions opt;
      opt.threads = 1;
      opt.max_batch_tokens = 64;
      (void)serve_stage_link(sys, *sock, files, opt);
    });
  }
  void kill() {
    listener.close();
    std::lock_guard<std::mutex> l(mu);
    if (accepted) accepted->shutdown();
  }
  ~ExpertNode() {
    kill();
    thread.join();
  }
};

}  // namespace

TEST_CASE("expert parallelism: a worker behind the node link gives the same bits, its loss is an error naming it",
          "[moe][ep][link]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  MoeFile mf("qwen2moe");  // 8 experts
  const ModelConfig& c = mf.files.config;
  auto be = make_cpu_backend({1});
  auto ref_model = Model::build(c, *mf.files.weights, *be, 64);
  REQUIRE(ref_model.ok());
  const std::vector<float> ref = run_logits(**ref_model, *be);

  const std::string key = "a key for the expert node test";
  ExpertNode node(sys, mf.files, key);
  auto p = placement(
      R"({"workers": [{"name": "here", "experts": "0-3"}, {"name": "far", "experts": "4-7", "node": "127.0.0.1:)" +
          std::to_string(node.port) + R"("}]})",
      c);
  const int32_t max_rows = 64 * c.moe.experts_per_tok;
  // Local worker 0, remote worker 1.
  ExpertPlacement local_only;
  local_only.workers = {p.workers[0]};
  Workers here(sys, mf.files, local_only, max_rows);
  RemoteStageOptions ro;
  ro.host = "127.0.0.1";
  ro.port = node.port;
  ro.key = key;
  ro.step_timeout_s = 10;
  NodeHello h;
  h.model = model_fingerprint(mf.files);
  h.experts = p.workers[1].experts;
  h.max_expert_rows = max_rows;
  auto sock = connect_stage_node(ro, h);
  REQUIRE(sock.ok());
  const std::string far_name = "expert worker 'far' (node 127.0.0.1:" + std::to_string(node.port) + ")";
  auto far = spawn_remote_expert(sys, *sock, far_name, ro, h, c.hidden);
  std::vector<ExpertRouter::Target> targets = {here.targets[0], {far, far_name}};
  auto be2 = make_cpu_backend({1});
  auto m = Model::build(c, *mf.files.weights, *be2, 64, {}, {}, false);
  REQUIRE(m.ok());
  ExpertRouter router(sys, targets, p.replicas(c), std::chrono::seconds(10), nullptr);
  (*m)->set_expert_dispatcher(&router);
  const std::vector<float> got = run_logits(**m, *be2);
  REQUIRE(got.size() == ref.size());
  CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);

  // A hello for another model, or for more rows than the node's batch allows, or for experts
  // the model does not have, is refused with the reason.
  auto refused = [&](NodeHello bad) {
    ExpertNode other(sys, mf.files, key);
    RemoteStageOptions o2 = ro;
    o2.port = other.port;
    auto s2 = connect_stage_node(o2, bad);
    REQUIRE(!s2.ok());
    return s2.error().message;
  };
  NodeHello bad = h;
  bad.model = "another model";
  CHECK_THAT(refused(bad), Catch::Contains("expert node") && Catch::Contains("another model"));
  bad = h;
  bad.max_expert_rows = 64 * c.moe.experts_per_tok + 1;
  CHECK_THAT(refused(bad), Catch::Contains("--batch allows"));
  bad = h;
  bad.experts = {{0, {8}}};
  CHECK_THAT(refused(bad), Catch::Contains("expert 8 of layer 0"));
  // The node goes away: the next step fails with an error naming the worker.
  node.kill();
  auto r = SequenceRunner::create(**m, *be2, 64);
  REQUIRE(r.ok());
  auto l = (*r)->feed(kPrompt);
  REQUIRE(!l.ok());
  CHECK_THAT(l.error().message, Catch::Contains("expert worker 'far'"));
  caf::anon_send_exit(far, caf::exit_reason::user_shutdown);
}

namespace {

struct SeqOut {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string error;
};

// Submits every prompt at once (they share steps) and waits for all to finish.
std::vector<SeqOut> run_batch(caf::actor_system& sys, LocalNode& node, const std::vector<std::vector<int32_t>>& prompts,
                              int32_t base_id) {
  caf::scoped_actor self{sys};
  std::vector<SeqOut> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SeqRequest r;
    r.id = base_id + static_cast<int64_t>(i);
    r.prompt = prompts[i];
    r.max_new_tokens = 8;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    self->send(node.scheduler, std::move(r), caf::actor_cast<request_sink_actor>(self));
  }
  size_t done = 0;
  while (done < prompts.size()) {
    bool got = false;
    self->receive(
        [&](SeqEvent& ev) {
          got = true;
          SeqOut& o = out.at(static_cast<size_t>(ev.seq_id - base_id));
          if (!ev.error.empty()) o.error = ev.error;
          if (ev.token >= 0) {
            o.tokens.push_back(ev.token);
            o.logprobs.push_back(ev.logprob);
          }
          if (ev.finished || !ev.error.empty()) ++done;
        },
        caf::after(std::chrono::seconds(60)) >> [&] {});
    REQUIRE(got);
  }
  return out;
}

EngineStats stats_of(caf::actor_system& sys, LocalNode& node) {
  caf::scoped_actor self{sys};
  EngineStats s;
  self->request(node.scheduler, std::chrono::seconds(10), StatsQuery{})
      .receive([&](EngineStats& e) { s = e; }, [&](caf::error&) { FAIL("no stats"); });
  return s;
}

}  // namespace

TEST_CASE(
    "expert parallelism: served in batches the tokens equal the single-process ones, a dead worker fails the "
    "engine naming it",
    "[moe][ep][actors]") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  MoeFile mf("qwen2moe");
  const std::vector<std::vector<int32_t>> prompts = {
      kPrompt, {1, 262, 262, 263}, {1, 259, 260, 261, 262, 263, 259, 260, 261, 262}};
  auto spawn = [&](std::optional<ExpertPlacement> p) {
    NodeOptions o;
    o.threads = 1;
    o.max_batch_tokens = 64;
    o.experts = std::move(p);
    o.expert_threads = 1;
    o.scheduler.scheduler.max_batched_tokens = 64;
    o.scheduler.kv = kv_config_for_tokens(1024, 16, true);
    auto n = spawn_local_node(sys, mf.files, o);
    REQUIRE(n.ok());
    return std::move(*n);
  };
  LocalNode plain = spawn(std::nullopt);
  const auto ref = run_batch(sys, plain, prompts, 100);
  plain.stop();
  for (const auto& r : ref) {
    REQUIRE(r.error.empty());
    REQUIRE(r.tokens.size() == 8);
  }
  LocalNode ep = spawn(*ExpertPlacement::even(3, mf.files.config));
  REQUIRE(ep.experts.size() == 3);
  const auto got = run_batch(sys, ep, prompts, 200);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(got[i].error.empty());
    CHECK(got[i].tokens == ref[i].tokens);
    CHECK(std::memcmp(got[i].logprobs.data(), ref[i].logprobs.data(), ref[i].logprobs.size() * sizeof(float)) == 0);
  }
  REQUIRE(ep.moe);
  CHECK(ep.moe->snapshot().dispatches > 0);
  // Expert worker 1 dies: the next step fails with its name, and the engine reports it.
  {
    caf::scoped_actor self{sys};
    self->monitor(ep.experts[1]);
    caf::anon_send_exit(ep.experts[1], caf::exit_reason::kill);
    self->receive([](const caf::down_msg&) {});
  }
  const auto after = run_batch(sys, ep, {kPrompt}, 300);
  CHECK_THAT(after[0].error, Catch::Contains("expert worker 'expert-1'"));
  CHECK_THAT(stats_of(sys, ep).failure, Catch::Contains("expert worker 'expert-1'"));
  ep.stop();
}
