// Differential tests of the CPU matmul kernels against the reference dequantizer, for
// every weight type, every ISA this CPU has, odd shapes and random + structured inputs.
#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <memory>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quant_ref.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;
using namespace troupe::cpu;

namespace {

std::vector<Isa> available_isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (detect_isa() >= Isa::Avx2)
    v.push_back(Isa::Avx2);
  else
    WARN("AVX2 kernels not exercised: this CPU (or TROUPE_CPU_ISA) does not allow them");
  if (detect_isa() >= Isa::Avx512)
    v.push_back(Isa::Avx512);
  else
    WARN("AVX-512 VNNI kernels not exercised: this CPU (or TROUPE_CPU_ISA) does not allow them");
  return v;
}

// y_ref[t, r] = sum_k deq(W)[r, k] * x[t, k] in double, and the scale sum |w| |x| that bounds
// the activation-quantization error.
void reference(DType type, const std::vector<uint8_t>& w, int64_t rows, int64_t cols, const std::vector<float>& x,
               int64_t n, std::vector<double>& y, std::vector<double>& mag) {
  const size_t rb = *row_bytes(type, static_cast<uint64_t>(cols));
  std::vector<float> row(static_cast<size_t>(cols));
  y.assign(static_cast<size_t>(n * rows), 0);
  mag.assign(static_cast<size_t>(n * rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    REQUIRE(dequantize_row_ref(type, w.data() + rb * r, row.data(), cols));
    for (int64_t t = 0; t < n; ++t) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < cols; ++k) {
        s += static_cast<double>(row[k]) * x[t * cols + k];
        m += std::fabs(static_cast<double>(row[k]) * x[t * cols + k]);
      }
      y[t * rows + r] = s;
      mag[t * rows + r] = m;
    }
  }
}

// Relative tolerance on sum|w x|: int8 activations carry 1/254 relative rounding per
// element, and errors add like a random walk, so 2% of the magnitude bounds it with room;
// float weights only see f32 rounding.
double tolerance(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return 1e-5;
    default:
      return 2e-2;
  }
}

}  // namespace

TEST_CASE("matmul matches the reference for every type, ISA and odd shape", "[kernels][matmul]") {
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                         DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  std::mt19937 rng(1234);
  for (DType type : types) {
    const int64_t block = dtype_traits(type).block_size;
    const int64_t unit = block == 1 ? 1 : (block == 256 ? 256 : 32);
    const std::pair<int64_t, int64_t> shapes[] = {
        {1, unit == 1 ? 7 : unit}, {7, unit * 3}, {33, unit == 1 ? 129 : unit * 5}, {18, unit * 2}};
    for (auto [rows, cols] : shapes) {
      for (bool structured : {false, true}) {
        auto w = test::random_weight(type, rows, cols, rng, structured);
        for (int64_t n : {1, 3, 9}) {
          auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
          std::vector<double> yref, mag;
          reference(type, w, rows, cols, x, n, yref, mag);
          auto packed = pack_weight(type, rows, cols, w.data());
          REQUIRE(packed.ok());
          ThreadPool pool(2);
          for (Isa isa : available_isas()) {
            MatmulScratch scratch;
            std::vector<float> y(static_cast<size_t>(n * rows), -1.0f);
            matmul(*packed, x.data(), n, y.data(), pool, scratch, isa);
            for (size_t i = 0; i < y.size(); ++i) {
              const double err = std::fabs(y[i] - yref[i]);
              if (err > tolerance(type) * mag[i] + 1e-5) {
                FAIL("type " << dtype_traits(type).name << " isa " << isa_name(isa) << " shape " << rows << "x" << cols
                             << " n " << n << " elem " << i << ": got " << y[i] << " want " << yref[i] << " (mag "
                             << mag[i] << ")");
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("SIMD matmul agrees closely with the scalar kernel", "[kernels][matmul]") {
  std::mt19937 rng(99);
  for (DType type : {DType::Q4_1, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::Q5_1}) {
    const int64_t unit = dtype_traits(type).block_size;
    const int64_t rows = 37, cols = unit * (unit == 256 ? 3 : 9);
    auto w = test::random_weight(type, rows, cols, rng);
    auto x = test::random_floats(static_cast<size_t>(5 * cols), rng);
    auto packed = pack_weight(type, rows, cols, w.data());
    REQUIRE(packed.ok());
    ThreadPool pool(1);
    MatmulScratch s;
    std::vector<float> ys(5 * rows), yv(5 * rows);
    matmul(*packed, x.data(), 5, ys.data(), pool, s, Isa::Scalar);
    for (Isa isa : available_isas()) {
      matmul(*packed, x.data(), 5, yv.data(), pool, s, isa);
      for (size_t i = 0; i < ys.size(); ++i) {
        INFO("type " << dtype_traits(type).name << " isa " << isa_name(isa) << " elem " << i << " scalar " << ys[i]
                     << " simd " << yv[i]);
        REQUIRE(std::fabs(ys[i] - yv[i]) <= 1e-4f * (1 + std::fabs(ys[i])));
      }
    }
  }
}

TEST_CASE("matmul results do not depend on the other tokens in the call", "[kernels][matmul][batch]") {
  std::mt19937 rng(7);
  for (DType type : {DType::Q4_1, DType::Q8_0, DType::Q6_K, DType::F16}) {
    const int64_t unit = dtype_traits(type).block_size == 256 ? 256 : 64;
    const int64_t rows = 45, cols = unit * 3;
    auto w = test::random_weight(type, rows, cols, rng);
    auto packed = pack_weight(type, rows, cols, w.data());
    REQUIRE(packed.ok());
    // 5-16 tokens take the streaming kernel (up to 8 tokens a tile on AVX-512), 20 the
    // cache-blocked one (4 a tile): every token gets the bits it gets alone.
    for (int64_t n : {5, 8, 11, 20}) {
      auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
      ThreadPool pool(2);
      INFO("type " << dtype_traits(type).name << " tokens " << n);
      for (Isa isa : available_isas()) {
        MatmulScratch s;
        std::vector<float> all(static_cast<size_t>(n * rows)), one(static_cast<size_t>(rows));
        matmul(*packed, x.data(), n, all.data(), pool, s, isa);
        for (int64_t t = 0; t < n; ++t) {
          matmul(*packed, x.data() + t * cols, 1, one.data(), pool, s, isa);
          REQUIRE(std::memcmp(one.data(), all.data() + t * rows, rows * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("unpack_row reproduces the reference dequantizer", "[kernels][packed]") {
  std::mt19937 rng(5);
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                     DType::Q6_K, DType::BF16}) {
    const int64_t cols = dtype_traits(type).block_size == 256 ? 512 : 96, rows = 3;
    auto w = test::random_weight(type, rows, cols, rng);
    auto packed = pack_weight(type, rows, cols, w.data());
    REQUIRE(packed.ok());
    std::vector<float> a(static_cast<size_t>(cols)), b(static_cast<size_t>(cols));
    const size_t rb = *row_bytes(type, static_cast<uint64_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      unpack_row(*packed, r, a.data());
      dequantize_row_ref(type, w.data() + rb * r, b.data(), cols);
      // K-quant scale*sub-scale and min*sub-min are folded into f16 per 32-element block:
      // 2^-11 relative to each term, so bound by the row's largest magnitude.
      float amax = 0;
      for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(b[k]));
      for (int64_t k = 0; k < cols; ++k) REQUIRE(std::fabs(a[k] - b[k]) <= 1e-3f * amax);
    }
  }
}

// The AVX-512 kernels for the 32-block types are the AVX2 kernels' arithmetic (two rows per
// register, or scales formed 16 rows at a time): the same bits, which keeps greedy output
// equal to llama.cpp's on either CPU. Q6_K's integer sums are exact in both, then one fma.
TEST_CASE("AVX-512 and AVX2 matmuls give the same bits for the 32-block types and Q6_K", "[kernels][matmul]") {
  if (detect_isa() < Isa::Avx512) {
    WARN("skipped: this CPU (or TROUPE_CPU_ISA) has no AVX-512 VNNI, nothing to compare");
    return;
  }
  std::mt19937 rng(23);
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q6_K}) {
    for (int64_t rows : {1, 2, 7, 33, 67}) {
      for (int64_t n : {1, 2, 3, 4, 6, 9}) {
        // 32-block types: an odd number of blocks, the last pair half empty; Q6_K: 3 super-blocks
        const int64_t cols = type == DType::Q6_K ? 256 * 3 : 32 * 11;
        auto w = test::random_weight(type, rows, cols, rng);
        auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
        auto packed = pack_weight(type, rows, cols, w.data());
        REQUIRE(packed.ok());
        ThreadPool pool(2);
        MatmulScratch s;
        std::vector<float> y2(static_cast<size_t>(n * rows)), y5(y2.size());
        matmul(*packed, x.data(), n, y2.data(), pool, s, Isa::Avx2);
        matmul(*packed, x.data(), n, y5.data(), pool, s, Isa::Avx512);
        INFO("type " << dtype_traits(type).name << " rows " << rows << " tokens " << n);
        for (size_t i = 0; i < y2.size(); ++i)
          if (std::memcmp(&y2[i], &y5[i], 4)) WARN("elem " << i << " avx2 " << y2[i] << " avx512 " << y5[i]);
        REQUIRE(std::memcmp(y2.data(), y5.data(), y2.size() * sizeof(float)) == 0);
      }
    }
  }
}

// Activations for the RQ kernels: GGML's q8_0/q8_1 numerics (id = 127 / amax, round half to
// even, d and s stored as f16 where GGML does), whichever path this CPU takes (16 lanes at a
// time on AVX-512), checked against the formula written out here one element at a time.
TEST_CASE("activation quantization gives GGML's q8 values on every path", "[kernels][matmul]") {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t cols : {96, 576, 1536}) {
    for (bool f16 : {true, false}) {
      const int64_t nt = 5, nb = cols / 32, np = (cols + 63) / 64;
      std::vector<float> x(static_cast<size_t>(nt * cols));
      for (auto& v : x) v = nd(rng);
      // ties (x * id landing on .5), an all-zero block, -0, one huge value
      for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = (j - 16) * 0.5f;
      x[31] = 63.5f;  // amax 63.5: id = 2, so every (j - 16) * 0.5 * 2 is an integer; 63.5*2 = 127
      for (int j = 32; j < 64; ++j) x[static_cast<size_t>(j)] = 0.0f;
      x[64] = -0.0f;
      x[static_cast<size_t>(cols + 3)] = 1e30f;
      ActQ a;
      a.num_pairs = np;
      a.q.assign(static_cast<size_t>(nt * np * 64), 99);
      a.scales.assign(static_cast<size_t>(nt * np * 4), -1.0f);
      ActQuantMode mode;
      mode.d_as_f16 = f16;
      mode.s_as_f16 = f16;
      quantize_activations(x.data(), cols, a, 0, nt, mode);
      INFO("cols " << cols << " f16 " << f16);
      for (int64_t t = 0; t < nt; ++t) {
        for (int64_t b = 0; b < np * 2; ++b) {
          const int8_t* q = a.q.data() + (t * np * 64 + b * 32);
          const float* sc = a.scales.data() + t * np * 4 + (b / 2) * 4;
          float d = 0, s = 0;
          if (b < nb) {
            const float* xb = x.data() + t * cols + b * 32;
            float amax = 0;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; ++j) {
              const int v = static_cast<int>(std::nearbyint(xb[j] * id));  // to even (default rounding)
              REQUIRE(q[j] == v);
              sum += v;
            }
            const float dd = amax / 127.0f;
            d = f16 ? f16_to_f32(f32_to_f16(dd)) : dd;
            s = f16 ? f16_to_f32(f32_to_f16(dd * static_cast<float>(sum))) : d * static_cast<float>(sum);
          } else {
            for (int j = 0; j < 32; ++j) REQUIRE(q[j] == 0);
          }
          REQUIRE(std::memcmp(&sc[b % 2], &d, 4) == 0);
          REQUIRE(std::memcmp(&sc[2 + b % 2], &s, 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("a parked thread pool sleeps and wakes for the next region with every item done once", "[kernels][pool]") {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 200; ++round) {
    pool.parallel_for_chunks(1000, 7, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    });
    if (round % 2 == 0) pool.park();  // helpers go to sleep at once
    if (round % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& h : hits) CHECK(h.load() == 200);
  pool.park();
  pool.park();  // twice, then destroyed while parked: no hang
}

TEST_CASE("a group of matmuls gives each job the bits of its own matmul", "[kernels][matmul][moe]") {
  std::mt19937 rng(11);
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q8_0}) {
    const int64_t cols = 128;
    // Experts of one layer: same shape; rows not a multiple of the 16-row chunk; 0..9 rows each.
    const int64_t rows = 37;
    const int64_t counts[] = {3, 0, 1, 9, 4, 5, 2};
    const int64_t J = std::size(counts);
    std::vector<std::unique_ptr<PackedWeight>> ws;
    std::vector<std::vector<float>> xs;
    for (int64_t j = 0; j < J; ++j) {
      auto w = test::random_weight(type, rows, cols, rng);
      auto p = pack_weight(type, rows, cols, w.data());
      REQUIRE(p.ok());
      ws.push_back(std::make_unique<PackedWeight>(std::move(*p)));
      xs.push_back(test::random_floats(static_cast<size_t>(std::max<int64_t>(1, counts[j]) * cols), rng));
    }
    ThreadPool pool(2);
    for (Isa isa : available_isas()) {
      MatmulScratch s;
      const int64_t ldy = rows + 5;  // strided outputs, as gate and up into one buffer
      std::vector<std::vector<float>> ys(static_cast<size_t>(J));
      std::vector<GroupJob> jobs;
      for (int64_t j = 0; j < J; ++j) {
        ys[j].assign(static_cast<size_t>(std::max<int64_t>(1, counts[j]) * ldy), -7.0f);
        jobs.push_back({ws[j].get(), xs[j].data(), counts[j], ys[j].data(), ldy});
      }
      REQUIRE(can_group(jobs.data(), J));
      matmul_group(jobs.data(), J, pool, s, isa);
      for (int64_t j = 0; j < J; ++j) {
        std::vector<float> one(static_cast<size_t>(std::max<int64_t>(1, counts[j]) * rows));
        matmul(*ws[j], xs[j].data(), counts[j], one.data(), pool, s, isa);
        for (int64_t t = 0; t < counts[j]; ++t) {
          REQUIRE(std::memcmp(one.data() + t * rows, ys[j].data() + t * ldy, rows * sizeof(float)) == 0);
          for (int64_t c = rows; c < ldy; ++c) REQUIRE(ys[j][t * ldy + c] == -7.0f);  // the gap untouched
        }
      }
    }
    // Mixed column counts or a float weight: not grouped (the backend runs them in turn).
    auto f = test::random_weight(DType::F16, rows, cols, rng);
    auto pf = pack_weight(DType::F16, rows, cols, f.data());
    REQUIRE(pf.ok());
    GroupJob mixed[] = {{ws[0].get(), xs[0].data(), 1, nullptr, rows}, {&*pf, xs[0].data(), 1, nullptr, rows}};
    CHECK_FALSE(can_group(mixed, 2));
  }
}
