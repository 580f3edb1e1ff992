// Dummy weights from a config.json (load_format "dummy"): configs/tiny-llama.json builds and
// runs in several weight types, seeds are reproducible, bad types are refused; the shipped
// Llama-3 8B / 70B configs parse into the real shapes (without instantiating them); the MoE
// configs (tiny-mixtral runs; Mixtral-8x7B and Qwen1.5-MoE-A2.7B parse, 8x7B shares a layer).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/model/architectures.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

std::string config_path(const std::string& name) { return test::source_dir() + "/configs/" + name; }

Result<ModelFiles> open_dummy_model(const std::string& dtype, uint64_t seed) {
  OpenOptions o;
  o.load_format = "dummy";
  o.dummy_dtype = dtype;
  o.seed = seed;
  return open_model(config_path("tiny-llama.json"), o);
}

std::vector<float> run_dummy(const std::string& dtype, uint64_t seed) {
  auto m = open_dummy_model(dtype, seed);
  if (!m) FAIL(dtype << ": " << m.error().message);
  CHECK(m->format == "dummy");
  CHECK_FALSE(m->tokenizer.has_value());
  auto backend = make_cpu_backend({1});
  auto model = Model::build(m->config, *m->weights, *backend, 8);
  if (!model) FAIL(dtype << ": " << model.error().message);
  auto runner = SequenceRunner::create(**model, *backend, 32);
  REQUIRE(runner.ok());
  auto l = (*runner)->feed({1, 17, 300, 511, 42, 42, 9, 0, 250, 77});
  if (!l) FAIL(l.error().message);
  std::vector<float> out(*l, *l + m->config.vocab);
  auto l2 = (*runner)->feed({128});
  REQUIRE(l2.ok());
  out.insert(out.end(), *l2, *l2 + m->config.vocab);
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) FAIL("cannot open " << path);
  return nlohmann::json::parse(f);
}

Result<ModelConfig> hf_config(const std::string& name) {
  const auto j = read_json(config_path(name));
  const Architecture* arch = find_architecture(j.at("model_type").get<std::string>());
  REQUIRE(arch);
  return arch->from_hf(j);
}

}  // namespace

TEST_CASE("dummy weights from configs/tiny-llama.json run with finite, varied logits", "[model][dummy]") {
  for (const char* dtype : {"q8_0", "bf16", "q4_1", "f16", "f32"}) {
    INFO("dummy dtype " << dtype);
    const auto logits = run_dummy(dtype, 3);
    REQUIRE(logits.size() == 2 * 512);
    double mn = 1e30, mx = -1e30;
    for (float x : logits) {
      REQUIRE(std::isfinite(x));
      mn = std::min(mn, static_cast<double>(x));
      mx = std::max(mx, static_cast<double>(x));
    }
    CHECK(mx - mn > 1e-2);  // not a constant: the weights are really there
    // The decode step after the prompt gives other logits than the prompt's last token.
    CHECK(std::memcmp(logits.data(), logits.data() + 512, 512 * sizeof(float)) != 0);
  }
}

TEST_CASE("dummy weights: the same seed gives identical logits, another seed other ones", "[model][dummy]") {
  for (const char* dtype : {"q8_0", "bf16"}) {
    INFO("dummy dtype " << dtype);
    const auto a = run_dummy(dtype, 42), b = run_dummy(dtype, 42), c = run_dummy(dtype, 43);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) != 0);
  }
}

TEST_CASE("dummy weights: unsupported types and bad configs are refused", "[model][dummy][badinput]") {
  for (const char* dtype : {"q6_k", "q4_k", "q8_1", "q8_k", "int3", ""}) {
    auto m = open_dummy_model(dtype, 0);
    INFO("dummy dtype '" << dtype << "'");
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("unsupported dummy dtype"));
  }
  OpenOptions o;
  o.load_format = "dummy";
  auto missing = open_model(config_path("no-such-config.json"), o);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.error().message, Catch::Contains("no-such-config.json"));
  o.load_format = "pickle";
  auto fmt = open_model(config_path("tiny-llama.json"), o);
  REQUIRE_FALSE(fmt.ok());
  CHECK_THAT(fmt.error().message, Catch::Contains("pickle"));
}

TEST_CASE("the Llama-3 8B and 70B configs parse into the real shapes", "[model][dummy]") {
  auto c8 = hf_config("llama-3-8b.json");
  if (!c8) FAIL(c8.error().message);
  CHECK(c8->arch == "llama");
  CHECK(c8->hidden == 4096);
  CHECK(c8->num_layers == 32);
  CHECK(c8->num_heads == 32);
  CHECK(c8->num_kv_heads == 8);
  CHECK(c8->head_dim == 128);
  CHECK(c8->ffn == 14336);
  CHECK(c8->vocab == 128256);
  CHECK(c8->max_context == 8192);
  CHECK(c8->rope_theta == 500000.0f);
  CHECK(c8->rms_eps == 1e-5f);
  CHECK(c8->rope_scaling.type.empty());
  CHECK(c8->rope_kind == RopeKind::Neox);
  CHECK_FALSE(c8->tied_embeddings);
  CHECK_FALSE(c8->qkv_bias);

  auto c70 = hf_config("llama-3-70b.json");
  if (!c70) FAIL(c70.error().message);
  CHECK(c70->hidden == 8192);
  CHECK(c70->num_layers == 80);
  CHECK(c70->num_heads == 64);
  CHECK(c70->num_kv_heads == 8);
  CHECK(c70->head_dim == 128);
  CHECK(c70->ffn == 28672);
  CHECK(c70->vocab == 128256);
  CHECK(c70->max_context == 8192);
  CHECK(c70->rope_theta == 500000.0f);
  CHECK(c70->rms_eps == 1e-5f);
  CHECK_FALSE(c70->tied_embeddings);

  auto tiny = hf_config("tiny-llama.json");
  if (!tiny) FAIL(tiny.error().message);
  CHECK(tiny->hidden == 128);
  CHECK(tiny->num_layers == 2);
  CHECK(tiny->head_dim == 32);
  CHECK(tiny->vocab == 512);
}

TEST_CASE("dummy weights of a large shape share one layer, small shapes keep distinct layers", "[model][dummy]") {
  OpenOptions o;
  o.load_format = "dummy";
  o.dummy_dtype = "q4_0";
  // Llama-3-8B in q4_0: 3.9 GB of layers, over the 2 GiB sharing threshold.
  auto big = open_model(config_path("llama-3-8b.json"), o);
  if (!big) FAIL(big.error().message);
  std::map<const void*, uint64_t> unique;
  for (const auto& [name, t] : big->weights->tensors()) unique[t.data] = t.nbytes;
  uint64_t host = 0;
  for (const auto& [p, n] : unique) host += n;
  CHECK(big->weights->tensors().size() == 3 + 9 * 32);
  for (const char* part : {"attn_q.weight", "ffn_down.weight", "attn_norm.weight"}) {
    const TensorRef* first = big->weights->find(std::string("blk.0.") + part);
    const TensorRef* last = big->weights->find(std::string("blk.31.") + part);
    REQUIRE(first);
    REQUIRE(last);
    CHECK(first->data == last->data);
    CHECK(first->shape == last->shape);
  }
  CHECK(host < (uint64_t{1} << 30));  // embeddings, output and one layer: about 0.8 GB
  // The tiny shape: every layer its own random tensors.
  auto tiny = open_model(config_path("tiny-llama.json"), o);
  if (!tiny) FAIL(tiny.error().message);
  CHECK(tiny->weights->find("blk.0.attn_q.weight")->data != tiny->weights->find("blk.1.attn_q.weight")->data);
  CHECK(std::memcmp(tiny->weights->find("blk.0.attn_q.weight")->data, tiny->weights->find("blk.1.attn_q.weight")->data,
                    tiny->weights->find("blk.0.attn_q.weight")->nbytes) != 0);
}

TEST_CASE("dummy MoE weights: configs/tiny-mixtral.json runs, stacked experts, seeds reproducible",
          "[model][dummy][moe]") {
  OpenOptions o;
  o.load_format = "dummy";
  o.dummy_dtype = "q8_0";
  o.seed = 3;
  auto m = open_model(config_path("tiny-mixtral.json"), o);
  if (!m) FAIL(m.error().message);
  CHECK(m->config.moe.num_experts == 8);
  CHECK(m->config.moe.experts_per_tok == 2);
  CHECK(m->config.moe.expert_ffn == 192);
  CHECK(m->config.moe.norm_topk_prob);
  const TensorRef* gate = m->weights->find("blk.1.ffn_gate_exps.weight");
  REQUIRE(gate);
  CHECK(gate->shape == std::vector<int64_t>{128, 192, 8});
  CHECK(m->weights->find("blk.0.ffn_gate.weight") == nullptr);
  auto backend = make_cpu_backend({1});
  auto model = Model::build(m->config, *m->weights, *backend, 8);
  if (!model) FAIL(model.error().message);
  auto runner = SequenceRunner::create(**model, *backend, 32);
  REQUIRE(runner.ok());
  auto l = (*runner)->feed({1, 17, 300, 511, 42, 42, 9, 0, 250, 77});
  if (!l) FAIL(l.error().message);
  std::vector<float> a(*l, *l + m->config.vocab);
  for (float x : a) REQUIRE(std::isfinite(x));
  CHECK(*std::max_element(a.begin(), a.end()) > *std::min_element(a.begin(), a.end()) + 1e-3f);
  // Same seed, same logits; the dense tiny shape with the same seed differs.
  auto m2 = open_model(config_path("tiny-mixtral.json"), o);
  REQUIRE(m2.ok());
  auto model2 = Model::build(m2->config, *m2->weights, *backend, 8);
  REQUIRE(model2.ok());
  auto runner2 = SequenceRunner::create(**model2, *backend, 32);
  REQUIRE(runner2.ok());
  auto l2 = (*runner2)->feed({1, 17, 300, 511, 42, 42, 9, 0, 250, 77});
  REQUIRE(l2.ok());
  CHECK(std::equal(a.begin(), a.end(), *l2));
}

TEST_CASE("the shipped MoE configs parse into the real shapes, dummy Mixtral-8x7B shares one layer",
          "[model][dummy][moe]") {
  auto mx = hf_config("mixtral-8x7b.json");
  if (!mx) FAIL(mx.error().message);
  CHECK(mx->hidden == 4096);
  CHECK(mx->num_layers == 32);
  CHECK(mx->moe.num_experts == 8);
  CHECK(mx->moe.experts_per_tok == 2);
  CHECK(mx->moe.expert_ffn == 14336);
  CHECK(mx->moe.shared_ffn == 0);
  auto qw = hf_config("qwen1.5-moe-a2.7b.json");
  if (!qw) FAIL(qw.error().message);
  CHECK(qw->hidden == 2048);
  CHECK(qw->num_layers == 24);
  CHECK(qw->moe.num_experts == 60);
  CHECK(qw->moe.experts_per_tok == 4);
  CHECK(qw->moe.expert_ffn == 1408);
  CHECK(qw->moe.shared_ffn == 5632);
  CHECK(qw->moe.shared_gate);
  CHECK_FALSE(qw->moe.norm_topk_prob);
  CHECK(qw->qkv_bias);
  CHECK(qw->vocab == 151936);
  // Mixtral-8x7B in q4_0: 25 GB of layers; above the sharing threshold every layer is layer 0's.
  OpenOptions o;
  o.load_format = "dummy";
  o.dummy_dtype = "q4_0";
  auto big = open_model(config_path("mixtral-8x7b.json"), o);
  if (!big) FAIL(big.error().message);
  std::map<const void*, uint64_t> unique;
  for (const auto& [name, t] : big->weights->tensors()) unique[t.data] = t.nbytes;
  uint64_t host = 0;
  for (const auto& [p, n] : unique) host += n;
  const TensorRef* first = big->weights->find("blk.0.ffn_down_exps.weight");
  const TensorRef* last = big->weights->find("blk.31.ffn_down_exps.weight");
  REQUIRE(first);
  REQUIRE(last);
  CHECK(first->data == last->data);
  CHECK(first->shape == std::vector<int64_t>{14336, 4096, 8});
  CHECK(host < (uint64_t{11} << 27));  // embeddings, output and one layer: about 0.96 GB
}
