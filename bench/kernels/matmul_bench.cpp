// Microbenchmark of the CPU matmul kernels: GB/s of weights streamed and ns per 32-weight
// block, for decode (1 token) and prefill tiles, per ISA.
// Usage: troupe_kernel_bench [threads] [type, e.g. q4_1] [isa, e.g. avx512-vnni]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quant_ref.h"

using namespace troupe;
using namespace troupe::cpu;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const std::string only_type = argc > 2 ? argv[2] : "";
  const std::string only_isa = argc > 3 ? argv[3] : "";
  // argv[4]: token counts, comma-separated (default 1,64).
  std::vector<int64_t> token_counts;
  for (const char* c = argc > 4 ? argv[4] : "1,64"; *c;) {
    token_counts.push_back(std::max<int64_t>(1, std::strtoll(c, const_cast<char**>(&c), 10)));
    if (*c == ',')
      ++c;
    else if (*c)
      break;
  }
  ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  struct Shape {
    int64_t rows, cols;
    const char* what;
  };
  const Shape shapes[] = {{576, 576, "576x576 (L2-resident)"},
                          {3072, 576, "3072x576 (gate+up)"},
                          {49152, 576, "49152x576 (logits)"},
                          {196608, 576, "196608x576 (from memory)"}};
  const DType types[] = {DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::F16};
  std::vector<Isa> isas{Isa::Scalar};
  if (detect_isa() >= Isa::Avx2) isas.push_back(Isa::Avx2);
  if (detect_isa() >= Isa::Avx512) isas.push_back(Isa::Avx512);
  std::printf(
      "| type | shape | isa | tokens | ms/call | weight GB/s | ns/block/token |\n|---|---|---|---|---|---|---|\n");
  for (DType t : types) {
    if (!only_type.empty() && only_type != dtype_traits(t).name) continue;
    for (const auto& s : shapes) {
      const int64_t cols = dtype_traits(t).block_size == 256 ? 512 : s.cols;
      std::vector<float> src(static_cast<size_t>(cols));
      const size_t rb = *row_bytes(t, static_cast<uint64_t>(cols));
      std::vector<uint8_t> w(rb * static_cast<size_t>(s.rows));
      for (int64_t r = 0; r < s.rows; ++r) {
        for (auto& x : src) x = nd(rng);
        if (!quantize_row_ref(t, src.data(), w.data() + rb * r, cols))
          for (size_t i = 0; i < rb; ++i) w[rb * r + i] = static_cast<uint8_t>(rng() & 0x3f);
      }
      auto packed = pack_weight(t, s.rows, cols, w.data());
      if (!packed) continue;
      for (int64_t n : token_counts) {
        std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * s.rows));
        for (auto& v : x) v = nd(rng);
        for (Isa isa : isas) {
          if (isa == Isa::Scalar && (n > 1 || s.rows > 4096)) continue;
          if (!only_isa.empty() && only_isa != isa_name(isa)) continue;
          MatmulScratch scratch;
          matmul(*packed, x.data(), n, y.data(), pool, scratch, isa);
          // The best of 5 trials of 0.1 s each: the VM's neighbours slow single trials by 10-20%.
          double per = 1e30;
          for (int trial = 0; trial < 5; ++trial) {
            int iters = 0;
            const auto t0 = std::chrono::steady_clock::now();
            double el = 0;
            do {
              matmul(*packed, x.data(), n, y.data(), pool, scratch, isa);
              ++iters;
              el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            } while (el < 0.1);
            per = std::min(per, el / iters);
          }
          const double bytes = static_cast<double>(packed->row_stride) * s.rows;
          const double blocks = static_cast<double>(s.rows) * cols / 32;
          std::printf("| %s | %s | %s | %ld | %.3f | %.1f | %.2f |\n", dtype_traits(t).name.data(), s.what,
                      isa_name(isa), static_cast<long>(n), per * 1e3, bytes / per / 1e9,
                      per * 1e9 / blocks / n * threads);
        }
      }
    }
  }
}
