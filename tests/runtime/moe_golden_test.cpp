// Mixture-of-experts forward passes against llama.cpp on the same models (golden data made by
// tests/golden/moe/make_golden.py with llama-cpp-python 0.3.36): Mixtral-shaped and
// Qwen2-MoE-shaped GGUFs (F32, Q8_0, Q4_1) whose weights are formulas
// (tests/runtime/formula_moe.h), the logits
// of every prompt position after one batched prefill, and 16 greedy tokens after each prompt.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/engine/sequence_runner.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "tests/runtime/formula_moe.h"
#include "tests/test_util.h"

using namespace troupe;

TEST_CASE("MoE models: logits and greedy tokens match llama.cpp", "[model][moe][golden]") {
  const auto golden = test::load_moe_golden(test::source_dir() + "/tests/golden/moe");
  REQUIRE(golden.ok);
  const auto& g = golden.meta;
  const std::vector<float>& blob = golden.logits;
  size_t off = 0;
  for (const char* which : test::kFormulaMoeModels) {
    INFO("model " << which);
    const auto& gm = g.at("models").at(which);
    const std::string path = "/tmp/troupe_formula_" + std::string(which) + "_" + std::to_string(::getpid()) + ".gguf";
    REQUIRE(test::formula_moe_writer(test::formula_spec(which)).write(path).ok());
    auto f = open_gguf(path);
    if (!f) FAIL(f.error().message);
    const int32_t V = f->config.vocab;
    REQUIRE(V == 264);
    REQUIRE(f->config.moe.num_experts == gm.at("spec").at("experts").get<int>());
    auto backend = make_cpu_backend({2});
    auto model = Model::build(f->config, *f->weights, *backend, 128);
    REQUIRE(model.ok());
    for (const auto& p : gm.at("prompts")) {
      const auto ids = p.at("ids").get<std::vector<int32_t>>();
      const auto greedy = p.at("greedy").get<std::vector<int32_t>>();
      REQUIRE(off + ids.size() * V <= blob.size());
      // Every position: feed the prompt one token at a time after the first chunk, and also
      // as one batch (the last position), both against llama.cpp's batched logits.
      auto runner = SequenceRunner::create(**model, *backend, 128);
      REQUIRE(runner.ok());
      double max_err = 0, range = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        auto l = (*runner)->feed({ids[t]});
        REQUIRE(l.ok());
        const float* ref = blob.data() + off + t * V;
        for (int32_t i = 0; i < V; ++i) {
          max_err = std::max(max_err, static_cast<double>(std::fabs((*l)[i] - ref[i])));
          range = std::max(range, static_cast<double>(std::fabs(ref[i])));
        }
      }
      INFO("prompt of " << ids.size() << " tokens: max |troupe - llama.cpp| " << max_err << ", logit range " << range);
      // The same weights and an f16 KV cache: the two differ only in rounding (summation
      // order; measured on AVX-512: F32 up to 1e-4 x range, Q8_0 and Q4_1 bit-equal); a wrong
      // expert choice or weight moves logits by O(range).
      CHECK(max_err < 2e-3 * range);
      auto batch = SequenceRunner::create(**model, *backend, 128);
      REQUIRE(batch.ok());
      auto last = (*batch)->feed(ids);
      REQUIRE(last.ok());
      const float* ref_last = blob.data() + off + (ids.size() - 1) * V;
      double err_last = 0;
      for (int32_t i = 0; i < V; ++i)
        err_last = std::max(err_last, static_cast<double>(std::fabs((*last)[i] - ref_last[i])));
      CHECK(err_last < 2e-3 * range);
      // Greedy continuation: the same 16 ids.
      std::vector<int32_t> got;
      int32_t next = static_cast<int32_t>(std::max_element(*last, *last + V) - *last);
      for (size_t i = 0; i < greedy.size(); ++i) {
        got.push_back(next);
        auto l = (*batch)->feed({next});
        REQUIRE(l.ok());
        next = static_cast<int32_t>(std::max_element(*l, *l + V) - *l);
      }
      CHECK(got == greedy);
      off += ids.size() * V;
    }
    std::remove(path.c_str());
  }
  CHECK(off == blob.size());
}
