// The default model's forward pass against llama.cpp on the same GGUF file (golden data
// made by tests/golden/forward/make_golden.py with llama-cpp-python 0.3.36): last-position
// logits within a stated tolerance, and the first 32 greedy tokens identical.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

struct Golden {
  nlohmann::json meta;
  std::vector<float> logits;
};

Golden load_golden() {
  const std::string dir = test::source_dir() + "/tests/golden/forward/";
  std::ifstream jf(dir + "smollm2_q4_1.json");
  REQUIRE(jf);
  Golden g;
  g.meta = nlohmann::json::parse(jf);
  std::ifstream bf(dir + "smollm2_q4_1_logits.f32", std::ios::binary);
  REQUIRE(bf);
  g.logits.resize(static_cast<size_t>(g.meta["logits_file"]["bytes"].get<size_t>() / 4));
  bf.read(reinterpret_cast<char*>(g.logits.data()), static_cast<std::streamsize>(g.logits.size() * 4));
  REQUIRE(bf.gcount() == static_cast<std::streamsize>(g.logits.size() * 4));
  return g;
}

}  // namespace

TEST_CASE("default model: logits and greedy tokens match llama.cpp", "[model][golden][default_model]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  Golden g = load_golden();
  const int32_t vocab = files->config.vocab;
  REQUIRE(g.meta["n_vocab"].get<int32_t>() == vocab);
  auto backend = make_cpu_backend({2});
  auto model = Model::build(files->config, *files->weights, *backend, 512);
  REQUIRE(model.ok());
  size_t index = 0;
  int stable_checked = 0, exact = 0;
  for (const auto& c : g.meta["cases"]) {
    const std::string name = c["name"].get<std::string>();
    INFO("prompt '" << name << "'");
    auto ids = c["prompt_ids"].get<std::vector<int32_t>>();
    auto runner = SequenceRunner::create(**model, *backend, 512);
    REQUIRE(runner.ok());
    auto logits = (*runner)->feed(ids);
    REQUIRE(logits.ok());
    const float* want = g.logits.data() + index * vocab;
    double max_err = 0, sum_err = 0, sum_signed = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      const double e = std::fabs((*logits)[i] - want[i]);
      max_err = std::max(max_err, e);
      sum_err += e;
      sum_signed += (*logits)[i] - want[i];
    }
    WARN(name << ": logits max |diff| " << max_err << ", mean |diff| " << sum_err / vocab << ", mean diff "
              << sum_signed / vocab << " (a constant offset does not change probabilities)");
    // Tolerance: llama.cpp disagrees with itself by up to 1.07 (max |diff|; logits span
    // about 40) between its batched and token-by-token paths on these prompts, and by 1.9
    // with flash attention on. Both quantize activations to int8 per 32 values, with
    // different accumulation orders. We allow max 1.5, and 0.2 for the spread of the
    // difference around its mean (a shift common to every logit leaves the softmax
    // unchanged). A wrong RoPE, norm or attention moves logits by several units.
    double spread = 0;
    for (int32_t i = 0; i < vocab; ++i) spread += std::fabs((*logits)[i] - want[i] - sum_signed / vocab);
    spread /= vocab;
    INFO("max |diff| " << max_err << ", spread " << spread);
    CHECK(max_err < 1.5);
    CHECK(spread < 0.2);
    // Greedy: 32 tokens, one decode step each, no stop at EOS.
    const auto want_greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    REQUIRE(want_greedy.size() >= 32);
    std::vector<int32_t> got;
    const float* l = *logits;
    for (int i = 0; i < 32; ++i) {
      const int32_t t = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
      got.push_back(t);
      auto next = (*runner)->feed({t});
      REQUIRE(next.ok());
      l = *next;
    }
    size_t first_diff = 0;
    while (first_diff < got.size() && got[first_diff] == want_greedy[first_diff]) ++first_diff;
    // llama.cpp's own greedy output changes on some prompts between its batched and
    // token-by-token paths (recorded in noise_floor by make_golden.py): those prompts have
    // near-ties that no independent implementation can be expected to break the same way.
    // Every prompt llama.cpp is self-consistent on must match all 32 tokens.
    const auto& unstable = g.meta["noise_floor"]["batch512_vs_token_by_token"]["greedy_changed"];
    const bool peer_stable = std::find(unstable.begin(), unstable.end(), name) == unstable.end();
    WARN(name << ": greedy tokens identical to llama.cpp for the first " << first_diff << " of 32"
              << (peer_stable ? "" : " (llama.cpp itself is unstable on this prompt)"));
    if (peer_stable) {
      CHECK(std::vector<int32_t>(want_greedy.begin(), want_greedy.begin() + 32) == got);
      ++stable_checked;
    }
    if (first_diff >= 32) ++exact;
    ++index;
  }
  REQUIRE(stable_checked >= 5);
  REQUIRE(exact >= 5);
}

TEST_CASE("default model: run names Paris", "[model][default_model]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  auto backend = make_cpu_backend({2});
  auto model = Model::build(files->config, *files->weights, *backend, 64);
  REQUIRE(model.ok());
  auto runner = SequenceRunner::create(**model, *backend, 128);
  REQUIRE(runner.ok());
  auto ids = files->tokenizer->encode("The capital of France is", true, true);
  auto logits = (*runner)->feed(ids);
  REQUIRE(logits.ok());
  std::vector<int32_t> out;
  for (int i = 0; i < 8; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(*logits, *logits + files->config.vocab) - *logits);
    out.push_back(t);
    logits = (*runner)->feed({t});
    REQUIRE(logits.ok());
  }
  REQUIRE_THAT(files->tokenizer->decode(out), Catch::Contains("Paris"));
}
