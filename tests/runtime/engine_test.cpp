// The continuous-batching engine on real forward passes: many requests of different
// lengths run concurrently (chunked prefill mixed with decode, preemption under KV
// pressure) and each one's greedy output equals the same request run alone.
#include <catch2/catch.hpp>
#include <map>

#include "runtime/engine/engine.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/runtime/tiny_model.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

std::vector<int32_t> solo_greedy(Model& m, Backend& be, const std::vector<int32_t>& prompt, int n) {
  auto r = SequenceRunner::create(m, be, 256);
  REQUIRE(r.ok());
  auto l = (*r)->feed(prompt);
  REQUIRE(l.ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(*l, *l + m.config().vocab) - *l);
    out.push_back(t);
    if (i + 1 < n) {
      l = (*r)->feed({t});
      REQUIRE(l.ok());
    }
  }
  return out;
}

std::map<int64_t, std::vector<int32_t>> run_engine(Engine& e) {
  std::map<int64_t, std::vector<int32_t>> out;
  int guard = 0;
  while (e.has_work() && guard++ < 100000) {
    auto ev = e.step();
    REQUIRE(ev.ok());
    for (const auto& x : *ev) out[x.id].push_back(x.token);
    auto st = e.kv().check_invariants();
    if (!st.ok()) FAIL(st.error().message);
  }
  return out;
}

}  // namespace

TEST_CASE("engine: concurrent greedy requests equal solo runs, with and without KV pressure", "[engine][batch]") {
  auto w = test::tiny_model_writer();
  const std::string path = "/tmp/troupe_engine_" + std::to_string(::getpid()) + ".gguf";
  REQUIRE(w.write(path).ok());
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  auto be = make_cpu_backend({2});
  auto model = Model::build(files->config, *files->weights, *be, 32);
  REQUIRE(model.ok());
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 3 + 7 * i; ++j) p.push_back((j * 11 + i * 5 + 3) % test::tiny_vocab_size());
    prompts.push_back(p);
  }
  const int n_new = 10;
  std::map<int64_t, std::vector<int32_t>> solo;
  for (size_t i = 0; i < prompts.size(); ++i)
    solo[static_cast<int64_t>(i)] = solo_greedy(**model, *be, prompts[i], n_new);
  for (int32_t blocks : {64, 12}) {  // plenty, then about 2x oversubscribed
    for (bool prefix : {false, true}) {
      EngineConfig cfg;
      cfg.scheduler = {32, 8};
      cfg.kv = {blocks, 8, prefix};
      auto e = Engine::create(**model, *be, cfg, SchedulingPolicy::fcfs(), nullptr);
      REQUIRE(e.ok());
      for (size_t i = 0; i < prompts.size(); ++i) {
        SeqRequest r;
        r.id = static_cast<int64_t>(i);
        r.prompt = prompts[i];
        r.max_new_tokens = n_new;
        r.sampling.temperature = 0;
        REQUIRE((*e)->add(r).ok());
      }
      auto out = run_engine(**e);
      INFO("blocks " << blocks << " prefix caching " << prefix);
      REQUIRE(out == solo);
      REQUIRE((*e)->kv().num_free_blocks() == blocks);
      if (blocks == 12) REQUIRE((*e)->scheduler().num_preemptions() > 0);
    }
  }
  std::remove(path.c_str());
}

TEST_CASE("engine: bad requests are refused and harm nothing else", "[engine][badinput]") {
  auto w = test::tiny_model_writer();
  const std::string path = "/tmp/troupe_engine_bad_" + std::to_string(::getpid()) + ".gguf";
  REQUIRE(w.write(path).ok());
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  auto be = make_cpu_backend({1});
  auto model = Model::build(files->config, *files->weights, *be, 16);
  REQUIRE(model.ok());
  EngineConfig cfg;
  cfg.scheduler = {16, 4};
  cfg.kv = {16, 8, true};
  auto e = Engine::create(**model, *be, cfg, SchedulingPolicy::fcfs(), nullptr);
  REQUIRE(e.ok());
  SeqRequest bad;
  bad.id = 1;
  bad.prompt = {1, 2, 100000};
  REQUIRE_FALSE((*e)->add(bad).ok());
  bad.prompt = {1, 2};
  bad.sampling.logit_bias[-4] = 1.0f;
  REQUIRE_FALSE((*e)->add(bad).ok());
  bad.sampling.logit_bias.clear();
  bad.sampling.temperature = std::nanf("");
  REQUIRE_FALSE((*e)->add(bad).ok());
  bad.sampling.temperature = 0;
  bad.stop_token_ids = {-1};
  REQUIRE_FALSE((*e)->add(bad).ok());
  bad.stop_token_ids.clear();
  bad.max_new_tokens = 1000;  // over the 256-token context
  REQUIRE_FALSE((*e)->add(bad).ok());
  SeqRequest good;
  good.id = 2;
  good.prompt = {5, 6, 7};
  good.max_new_tokens = 4;
  good.sampling.temperature = 0;
  REQUIRE((*e)->add(good).ok());
  auto out = run_engine(**e);
  REQUIRE(out.size() == 1);
  REQUIRE(out[2].size() == 4);
  REQUIRE((*e)->kv().num_free_blocks() == 16);
  std::remove(path.c_str());
}
