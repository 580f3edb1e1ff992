// The CUDA sampling kernel's own source (kernels/cuda/sample.cu), run on the CPU through
// tests/kernels/cuda_emulation.h (one thread per CUDA thread, real barriers and warp
// exchanges), against the host Sampler on rows that reach every path: greedy, top-k below
// and above the kernel's 2048-key head, min-p and top-p cut in the head and in the tail
// (bisection), flat rows whose draw lands past the head, ties, NaN, -inf and signed zeros.
// This checks the kernel's logic on machines without a GPU; the [cuda] tests check the
// compiled kernel on one.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/sample.cu"

#include <catch2/catch.hpp>
#include <limits>
#include <random>

#include "runtime/sample/sampler.h"

using namespace troupe;

namespace {

struct Case {
  std::vector<float> row;
  SamplingParams p;
  uint64_t skip = 0;
  const char* what = "";
};

std::vector<float> normal_row(int32_t vocab, float sigma, std::mt19937& g) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::normal_distribution<float> nd(0.0f, sigma);
  for (auto& x : row) x = nd(g);
  return row;
}

}  // namespace

TEST_CASE("the CUDA sampling kernel's source, run on the CPU, picks the host sampler's tokens",
          "[sampling][kernels][cuda-emulation]") {
  std::mt19937 g(17);
  std::vector<Case> cases;
  auto add = [&](std::vector<float> row, float t, int32_t k, float top_p, float min_p, const char* what) {
    Case c;
    c.row = std::move(row);
    c.p.temperature = t;
    c.p.top_k = k;
    c.p.top_p = top_p;
    c.p.min_p = min_p;
    c.p.seed = g();
    c.p.report_logprob = true;
    c.skip = g() % 100;
    c.what = what;
    cases.push_back(std::move(c));
  };
  const int32_t V = 6000;  // > the 2048-key head, small enough for 1024 emulated threads
  for (int rep = 0; rep < 2; ++rep) {
    auto peaked = normal_row(V, 2.0f, g);
    for (int i = 0; i < 8; ++i) peaked[g() % V] += 6.0f + static_cast<float>(g() % 6);
    add(peaked, 0.0f, 0, 1.0f, 0.0f, "greedy");
    add(peaked, 0.8f, 0, 0.9f, 0.0f, "top-p in the head");
    add(peaked, 1.0f, 40, 1.0f, 0.0f, "top-k in the head");
    add(peaked, 0.7f, 3000, 0.95f, 0.02f, "top-k past the head, min-p, top-p");
    add(peaked, 1.3f, 0, 1.0f, 0.0f, "no cut");
    const auto flat = normal_row(V, 0.01f, g);
    add(flat, 1.0f, 0, 1.0f, 0.0f, "flat: the draw lands past the head");
    add(flat, 1.0f, 0, 0.9f, 0.0f, "flat: top-p cut in the tail");
    add(flat, 1.0f, 0, 1.0f, 0.5f, "flat: min-p keeps a tail");
    add(flat, 1.0f, 4000, 0.7f, 0.0f, "flat: top-k and top-p in the tail");
    add(flat, 2.0f, 2500, 1.0f, 0.0f, "flat: top-k just past the head");
    auto ties = normal_row(V, 1.0f, g);
    for (int i = 0; i < 400; ++i) ties[g() % V] = 2.5f;
    add(ties, 1.0f, 0, 0.8f, 0.0f, "ties");
    add(ties, 0.0f, 0, 1.0f, 0.0f, "ties, greedy");
    auto odd = normal_row(V, 1.5f, g);
    odd[g() % V] = std::numeric_limits<float>::quiet_NaN();
    odd[g() % V] = -std::numeric_limits<float>::infinity();
    odd[5] = 0.0f;
    odd[6] = -0.0f;
    add(odd, 0.9f, 0, 0.95f, 0.0f, "NaN, -inf, signed zeros");
  }
  // A small vocabulary (the head holds every candidate).
  add(normal_row(300, 1.0f, g), 1.0f, 0, 1.0f, 0.0f, "small vocabulary");
  add(normal_row(300, 1.0f, g), 0.5f, 7, 0.6f, 0.1f, "small vocabulary, every cut");

  int differ = 0;
  for (const auto& c : cases) {
    const int32_t vocab = static_cast<int32_t>(c.row.size());
    Sampler s(c.p, vocab);
    for (uint64_t i = 0; i < c.skip; ++i) s.skip_draw();
    const DeviceSampleParams dp = s.device_params();
    const SampleResult want = s.sample(c.row.data());
    int32_t token = -1;
    float logprob = 0;
    cuda_emu::launch(1, cuda::kThreads, cuda::sample_kernel, c.row.data(), vocab, &dp, &token, &logprob);
    INFO(c.what << " (T " << c.p.temperature << ", top_k " << c.p.top_k << ", top_p " << c.p.top_p << ", min_p "
                << c.p.min_p << "): kernel " << token << ", host " << want.token);
    REQUIRE(token >= 0);
    REQUIRE(token < vocab);
    if (token != want.token) {
      ++differ;
      WARN("differs: " << c.what);
    } else {
      CHECK(std::fabs(logprob - want.logprob) <= 1e-5f);
    }
    if (c.p.temperature == 0.0f) CHECK(token == want.token);
  }
  INFO(differ << " of " << cases.size() << " differ");
  // The same terms summed in another order can move a draw within rounding of a boundary
  // to its neighbour; here (host expf on both sides) that should not happen at all.
  CHECK(differ == 0);
}
