// Real weights as a bf16 Hugging Face directory: the default model's GGUF converted by
// tests/runtime/hf_from_gguf.h (dequantized, Q/K rows in HF order, BF16 safetensors) loads
// through the safetensors path (NeoX RoPE, HF names, tied embeddings) and predicts what the
// GGUF predicts. The files differ only by bf16 rounding of the dequantized weights and the
// GGUF path's int8 activations, so logits agree closely and greedy tokens agree for a
// while. cuda_model_test.cpp runs the same directory on the GPU against the CPU.
#include <catch2/catch.hpp>
#include <cmath>

#include "runtime/model/model_files.h"
#include "tests/runtime/greedy_util.h"
#include "tests/runtime/hf_from_gguf.h"
#include "tests/test_util.h"

using namespace troupe;

TEST_CASE("the default model as a bf16 HF directory predicts what its GGUF predicts", "[model][hf]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto g = open_model(path, {});
  REQUIRE(g.ok());
  test::BfDir dir;
  const std::string err = test::write_bf16_hf_dir(*g, dir.path);
  if (!err.empty()) FAIL(err);
  auto h = open_model(dir.path.string(), {});
  if (!h) FAIL(h.error().message);
  CHECK(h->format == "safetensors");
  CHECK(h->config.num_layers == g->config.num_layers);
  CHECK(h->config.tied_embeddings);
  CHECK(h->config.rope_kind == RopeKind::Neox);
  CHECK(g->config.rope_kind == RopeKind::Interleaved);
  auto cpu = make_cpu_backend({0});
  auto mg = Model::build(g->config, *g->weights, *cpu, 64);
  auto mh = Model::build(h->config, *h->weights, *cpu, 64);
  if (!mg) FAIL(mg.error().message);
  if (!mh) FAIL(mh.error().message);
  for (const char* text : {"The capital of France is", "def fibonacci(n):\n", "Once upon a time, there was a"}) {
    const auto ids = g->tokenizer->encode(text, true, false);
    const int n = 16;
    const auto a = test::greedy(**mg, *cpu, ids, n), b = test::greedy(**mh, *cpu, ids, n);
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < a.first_logits.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(a.first_logits[i]) - b.first_logits[i]));
      max_abs = std::max(max_abs, std::fabs(double(a.first_logits[i])));
    }
    const size_t same = test::common_prefix(a.tokens, b.tokens);
    WARN("'" << text << "': bf16 directory vs GGUF: " << same << " of " << n
             << " greedy tokens equal; prompt logits max |diff| " << max_diff << " (max |logit| " << max_abs << ")");
    CHECK(a.tokens[0] == b.tokens[0]);
    CHECK(max_diff <= 0.05 * max_abs);
  }
}
