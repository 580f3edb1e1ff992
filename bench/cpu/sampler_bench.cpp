// Sampling cost per token on real logits: the default model's logits at 64 decode positions
// of a real prompt, sampled with the runtime's Sampler (staged partial sorts) and with the
// full-sort algorithm it replaced (tests/runtime/sampler_reference.h, plus the same
// log-softmax pass the old sampler made), for several sampling settings, in one run.
//   troupe_sampler_bench MODEL.gguf   (results: bench/results/sampler.md)
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "kernels/backend.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "kernels/philox.h"
#include "runtime/sample/sampler.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/runtime/sampler_reference.h"

using namespace troupe;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : default_model_path();
  auto files = open_model(path);
  if (!files || !files->tokenizer) {
    std::fprintf(stderr, "cannot open %s%s\n", path.c_str(), files ? ": no tokenizer" : "");
    return 1;
  }
  auto backend = make_backend("cpu", 0);
  if (!backend) return 1;
  auto model = Model::build(files->config, *files->weights, **backend, 64);
  if (!model) return 1;
  auto runner = SequenceRunner::create(**model, **backend, 512);
  if (!runner) return 1;
  const int32_t n = files->config.vocab;
  // Logits along a greedy continuation of a real prompt.
  std::vector<std::vector<float>> rows;
  auto l = (*runner)->feed(files->tokenizer->encode("The history of the printing press begins", true, false));
  for (int i = 0; l.ok() && i < 64; ++i) {
    rows.emplace_back(*l, *l + n);
    const int32_t next = static_cast<int32_t>(std::max_element(*l, *l + n) - *l);
    l = (*runner)->feed({next});
  }
  if (!l.ok()) return 1;
  struct Case {
    const char* name;
    float t, top_p, min_p;
    int32_t top_k;
  } cases[] = {{"T=1", 1, 1, 0, 0},
               {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0, 0},
               {"T=1 min_p=0.05", 1, 1, 0.05f, 0},
               {"T=0.8 top_k=40", 0.8f, 1, 0, 40},
               {"T=1.5 top_p=0.95", 1.5f, 0.95f, 0, 0}};
  std::printf(
      "| setting | full sort ms/token | staged ms/token | speed-up | same tokens |\n|---|---:|---:|---:|---:|\n");
  for (const auto& c : cases) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    p.seed = 42;
    const int reps = 5;
    std::vector<int32_t> staged_tokens, full_tokens;
    // Staged: the runtime's Sampler (log-softmax for the logprob, then the staged walk).
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) {
      Sampler s(p, n);
      for (const auto& row : rows) staged_tokens.push_back(s.sample(row.data()).token);
    }
    const double staged = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / (reps * rows.size());
    // Full sort: the same draws, the old algorithm, with the old log-softmax pass (double exp).
    t0 = Clock::now();
    double sink = 0;
    for (int r = 0; r < reps; ++r) {
      uint64_t draw = 0;
      for (const auto& row : rows) {
        float mx = row[0];
        for (float v : row) mx = std::max(mx, v);
        double z = 0;
        for (float v : row) z += std::exp(static_cast<double>(v - mx));
        sink += z;
        const double u01 = philox_uniform(p.seed, draw++);
        full_tokens.push_back(test::full_sort_reference(row, p, u01));
      }
    }
    const double full = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / (reps * rows.size());
    size_t same = 0;
    for (size_t i = 0; i < staged_tokens.size(); ++i) same += staged_tokens[i] == full_tokens[i];
    std::printf("| %s | %.3f | %.3f | %.1fx | %zu/%zu |\n", c.name, full, staged, full / staged, same,
                staged_tokens.size());
    if (sink < 0) std::printf("(unreachable)\n");
  }
  return 0;
}
