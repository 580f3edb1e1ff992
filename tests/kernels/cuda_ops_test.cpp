// The CUDA backend op by op against the CPU: every op of the backend interface runs on both
// backends with the same random inputs (odd shapes, strided rows, every weight type) and
// every element must agree within the tolerance stated per op and dtype. Matmuls are also
// checked against a double-precision reference over the dequantized weights, since the
// CPU backend quantizes activations for the quantized types. Tagged [cuda]; on a machine
// without a GPU (or a build without nvcc) each case prints why it is skipped.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/backend.h"
#include "kernels/cpu/quant_ref.h"
#include "runtime/sample/sampler.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;
using test::expect_close;
using test::get;
using test::gpu_or_skip;
using test::put;
using test::stats_count;

TEST_CASE("cuda: rms_norm, rope, silu_mul, add, add_bias, gather_rows match the CPU", "[cuda][kernels]") {
  auto gpu = gpu_or_skip();
  if (!gpu) return;
  auto cpu = make_cpu_backend({2});
  std::mt19937 rng(11);
  for (int64_t dim : {7, 64, 577, 4096}) {
    const int64_t n = 5;
    auto x = test::random_floats(static_cast<size_t>(n * dim), rng, 3.0f);
    auto w = test::random_floats(static_cast<size_t>(dim), rng);
    auto run = [&](Backend& b) {
      float* y = b.alloc(x.size());
      b.rms_norm(put(b, x), put(b, w), 1e-5f, n, dim, y);
      return get(b, y, x.size());
    };
    expect_close(run(*gpu), run(*cpu), 1e-6, 2e-5, "rms_norm dim " + std::to_string(dim));
  }
  for (auto kind : {RopeKind::Interleaved, RopeKind::Neox}) {
    const int64_t heads = 3, hd = 10, n = 6, ld = heads * hd + 7;  // odd stride; padding untouched
    auto x = test::random_floats(static_cast<size_t>(n * ld), rng);
    std::vector<float> cs(static_cast<size_t>(n * hd));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < hd / 2; ++i) {
        cs[t * hd + 2 * i] = std::cos(0.3f * (t + 1) * (i + 1));
        cs[t * hd + 2 * i + 1] = std::sin(0.3f * (t + 1) * (i + 1));
      }
    auto run = [&](Backend& b) {
      float* p = put(b, x);
      b.rope(p, ld, n, heads, hd, put(b, cs), kind);
      return get(b, p, x.size());
    };
    expect_close(run(*gpu), run(*cpu), 1e-6, 1e-5, "rope");
  }
  {
    const int64_t n = 9, ffn = 1003;
    auto gu = test::random_floats(static_cast<size_t>(n * 2 * ffn), rng, 4.0f);
    auto run = [&](Backend& b) {
      float* o = b.alloc(static_cast<size_t>(n * ffn));
      b.silu_mul(put(b, gu), n, ffn, o);
      return get(b, o, static_cast<size_t>(n * ffn));
    };
    expect_close(run(*gpu), run(*cpu), 1e-6, 1e-5, "silu_mul");
  }
  {
    const int64_t n = 4, dim = 33, ld = 41;
    auto x = test::random_floats(static_cast<size_t>(n * ld), rng);
    auto y = test::random_floats(static_cast<size_t>(n * ld), rng);
    auto bias = test::random_floats(static_cast<size_t>(dim), rng);
    const std::vector<int32_t> rows = {3, 0, 3, 1};
    auto run = [&](Backend& b) {
      float* px = put(b, x);
      b.add(px, put(b, y), n * ld);
      b.add_bias(px, ld, put(b, bias), n, dim);
      float* g = b.alloc(static_cast<size_t>(rows.size() * ld));
      b.gather_rows(px, ld, rows.data(), static_cast<int64_t>(rows.size()), g);
      auto out = get(b, px, x.size());
      auto gathered = get(b, g, rows.size() * ld);
      out.insert(out.end(), gathered.begin(), gathered.end());
      return out;
    };
    expect_close(run(*gpu), run(*cpu), 0, 0, "add, add_bias, gather_rows (exact)");
  }
}

namespace {

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                              DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

int64_t cols_for(DType t, int variant) {
  const bool k_quant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
  const bool is_float = t == DType::F32 || t == DType::F16 || t == DType::BF16;
  if (k_quant) return variant == 0 ? 256 : 768;
  if (is_float) return variant == 0 ? 45 : 576;  // 45: not a multiple of 32 (padded rows)
  return variant == 0 ? 96 : 1536;
}

}  // namespace

TEST_CASE("cuda: embedding rows of every weight type dequantize exactly as the reference", "[cuda][kernels]") {
  auto gpu = gpu_or_skip();
  if (!gpu) return;
  auto cpu = make_cpu_backend({2});
  std::mt19937 rng(12);
  for (DType t : kWeightTypes) {
    const int64_t rows = 37, cols = cols_for(t, 1);
    auto data = test::random_weight(t, rows, cols, rng);
    const std::vector<int32_t> ids = {36, 0, 5, 5, 17};
    std::vector<float> ref(ids.size() * cols);
    const size_t rb = *row_bytes(t, static_cast<uint64_t>(cols));
    for (size_t i = 0; i < ids.size(); ++i)
      cpu::dequantize_row_ref(t, data.data() + rb * ids[i], ref.data() + i * cols, cols);
    auto run = [&](Backend& b) {
      auto w = b.make_weight(t, cols, {{data.data(), rows}});
      if (!w) FAIL(w.error().message);
      float* out = b.alloc(ids.size() * cols);
      b.embed(**w, ids.data(), static_cast<int64_t>(ids.size()), out);
      return get(b, out, ids.size() * cols);
    };
    const std::string name(dtype_traits(t).name);
    auto got = run(*gpu);
    expect_close(got, ref, 0, 0, "embed " + name + " vs the reference dequantizer (exact)");
    // The CPU backend repacks K-quant sub-block scales and mins as f16 (d * sc, dmin * m),
    // which moves values by up to about 1e-3 of the row's range; the others are exact.
    const bool k_quant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
    float range = 0;
    for (float v : ref) range = std::max(range, std::fabs(v));
    expect_close(got, run(*cpu), k_quant ? 2e-3 * range : 0, k_quant ? 1e-3 : 0,
                 "embed " + name + " vs the CPU backend");
  }
}

TEST_CASE("cuda: matmul of every weight type matches the double reference and the CPU", "[cuda][kernels]") {
  // The batch-invariant GEMV, cuBLAS above 8 tokens, the tensor-core matmul (--cuda-tc-gemm).
  for (int mode : {0, 1, 2}) {
    const bool invariant = mode != 1, tc = mode == 2;
    auto gpu = gpu_or_skip(invariant, tc);
    if (!gpu) return;
    auto cpu = make_cpu_backend({2});
    std::mt19937 rng(13);
    for (DType t : kWeightTypes) {
      for (int variant : {0, 1}) {
        const int64_t cols = cols_for(t, variant);
        const int64_t rows = variant == 0 ? 37 : 301;
        auto data = test::random_weight(t, rows, cols, rng);
        std::vector<float> wf(static_cast<size_t>(rows * cols));
        const size_t rb = *row_bytes(t, static_cast<uint64_t>(cols));
        for (int64_t r = 0; r < rows; ++r) cpu::dequantize_row_ref(t, data.data() + rb * r, wf.data() + r * cols, cols);
        for (int64_t n : {1, 2, 3, 5, 8, 9, 33, 70}) {
          const int64_t ldy = rows + 3;  // strided output rows
          auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
          std::vector<float> ref(static_cast<size_t>(n * ldy), 0.f), mag(ref.size(), 0.f);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) {
              double s = 0, a = 0;
              for (int64_t k = 0; k < cols; ++k) {
                s += double(wf[r * cols + k]) * x[i * cols + k];
                a += std::fabs(double(wf[r * cols + k]) * x[i * cols + k]);
              }
              ref[i * ldy + r] = static_cast<float>(s);
              mag[i * ldy + r] = static_cast<float>(a);
            }
          auto run = [&](Backend& b) {
            auto w = b.make_weight(t, cols, {{data.data(), rows}});
            if (!w) FAIL(w.error().message);
            float* y = put(b, std::vector<float>(ref.size(), 0.f));
            b.matmul(**w, put(b, x), n, y, ldy);
            return get(b, y, ref.size());
          };
          auto got = run(*gpu);
          // Three numerics: f32 activations (floats): an fp32 dot product; the quantized
          // types: int8 activations as the CPU and llama.cpp (about 1% from the exact
          // product; the 32-block types' as close to the CPU as its own, the K-quants'
          // within the CPU's own activation and scale roundings); the cuBLAS path: x and W
          // rounded to f16. The tensor-core matmul: x rounded to the weight's f16/bf16.
          const bool tc_path = tc && (t == DType::F16 || t == DType::BF16);
          const bool half_path = (!invariant && n > 8) || tc_path;
          const bool block32 =
              t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
          const bool kquant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
          const bool q8 = !half_path && (block32 || kquant);
          const double rel = tc_path && t == DType::BF16 ? 5e-3 : half_path ? 2e-3 : q8 ? 2e-2 : 2e-5;
          size_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i)
            if (!(std::fabs(double(got[i]) - ref[i]) <= 1e-5 + rel * mag[i])) ++bad;
          INFO(dtype_traits(t).name << " rows " << rows << " cols " << cols << " n " << n
                                    << (tc          ? " (tensor-core matmul)"
                                        : invariant ? " (GEMV)"
                                                    : " (cuBLAS above 8)"));
          CHECK(bad == 0);
          auto cpu_y = run(*cpu);
          size_t far = 0;
          const double cpu_rel = q8 && block32 ? 2e-5 : 2e-2;
          for (size_t i = 0; i < got.size(); ++i)
            if (!(std::fabs(double(got[i]) - cpu_y[i]) <= 1e-5 + cpu_rel * mag[i])) ++far;
          CHECK(far == 0);
        }
      }
    }
  }
}

TEST_CASE("cuda: a token's matmul result does not depend on its batch (bit for bit)", "[cuda][kernels][batch]") {
  // Q4_1 through the GEMV; bf16 through the tensor-core matmul, whose 41- and 200-token
  // batches take the tiled kernel and single tokens the small-batch one.
  for (const DType t : {DType::Q4_1, DType::BF16}) {
    auto gpu = gpu_or_skip(true, t == DType::BF16);
    if (!gpu) return;
    std::mt19937 rng(14);
    const int64_t rows = 200, cols = t == DType::BF16 ? 1100 : 576;
    auto data = test::random_weight(t, rows, cols, rng);
    auto w = gpu->make_weight(t, cols, {{data.data(), rows}});
    REQUIRE(w.ok());
    for (const int64_t n : {41L, 200L}) {
      auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
      float* px = put(*gpu, x);
      float* y = gpu->alloc(static_cast<size_t>(n * rows));
      gpu->matmul(**w, px, n, y, rows);
      auto all = get(*gpu, y, static_cast<size_t>(n * rows));
      for (int64_t i : {0L, 7L, 8L, 40L}) {
        for (const int64_t m : {1L, 3L}) {  // token i alone, and first of three
          if (i + m > n) continue;
          gpu->matmul(**w, px + i * cols, m, y, rows);
          auto some = get(*gpu, y, static_cast<size_t>(rows));
          INFO(dtype_traits(t).name << " token " << i << " of " << n << " alone or first of " << m);
          for (int64_t r = 0; r < rows; ++r) REQUIRE(some[r] == all[i * rows + r]);
        }
      }
    }
  }
}

TEST_CASE("cuda: bad device numbers and unsupported shapes are errors, not crashes", "[cuda][kernels]") {
  auto bad = make_backend("cuda:99", 1);
  CHECK_FALSE(bad.ok());
  CHECK_FALSE(make_backend("gpu", 1).ok());
  CHECK_FALSE(make_backend("cuda:x", 1).ok());
  auto gpu = gpu_or_skip();
  if (!gpu) {
    // Without a GPU the CUDA backend must refuse cleanly, naming why.
    auto r = make_backend("cuda", 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("cuda") != std::string::npos);
    return;
  }
  {
    // A TROUPE_CUDA_* value the backend does not take: refused, naming it (not the default).
    auto r = [] {
      test::EnvScope e("TROUPE_CUDA_Q8_MMA", "lots");
      return make_backend("cuda", 1);
    }();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("TROUPE_CUDA_Q8_MMA='lots'") != std::string::npos);
  }
  CHECK_FALSE(gpu->make_kv_cache(KvCacheShape{1, 4, 16, 2, 40}).ok());  // head_dim 40
  std::vector<uint8_t> junk(100);
  CHECK_FALSE(gpu->make_weight(DType::Q4_0, 33, {{junk.data(), 1}}).ok());  // not a block multiple
}

namespace {

// A mixed step of three sequences for the RoPE + KV-write tests: a 3-token prefill, one
// token at position 17 and one at 40 (their earlier positions unwritten zeros on every
// backend), slots following the block tables, and RoPE angles for head size hd.
struct MixedStep {
  std::vector<int32_t> ids = {1, 2, 3, 4, 5}, pos = {0, 1, 2, 17, 40}, slots = {32, 33, 34, 17, 104};
  std::vector<int32_t> qs = {0, 3, 4, 5}, ctx = {3, 18, 41};
  std::vector<int32_t> tables = {2, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> cos_sin;
  int64_t n() const { return static_cast<int64_t>(ids.size()); }
  explicit MixedStep(int64_t hd) {
    cos_sin.resize(static_cast<size_t>(n() * hd));
    for (int64_t t = 0; t < n(); ++t)
      for (int64_t i = 0; i < hd / 2; ++i) {
        cos_sin[t * hd + 2 * i] = std::cos(0.01f * pos[t] * (i + 1));
        cos_sin[t * hd + 2 * i + 1] = std::sin(0.01f * pos[t] * (i + 1));
      }
  }
  StepInputs inputs() const {
    StepInputs st;
    st.num_tokens = static_cast<int32_t>(n());
    st.num_seqs = 3;
    st.token_ids = ids.data();
    st.positions = pos.data();
    st.query_start = qs.data();
    st.context_lens = ctx.data();
    st.slot_mapping = slots.data();
    st.block_tables = tables.data();
    st.max_blocks_per_seq = 4;
    return st;
  }
};

}  // namespace

TEST_CASE("cuda: fused add+RMSNorm and RoPE+KV-write give the unfused ops' bits", "[cuda][kernels]") {
  auto gpu = gpu_or_skip();
  if (!gpu) return;
  auto cpu = make_cpu_backend({2});
  std::mt19937 rng(21);
  for (int64_t dim : {7, 576, 4096}) {
    const int64_t n = 5;
    auto x = test::random_floats(static_cast<size_t>(n * dim), rng, 3.0f);
    auto y = test::random_floats(static_cast<size_t>(n * dim), rng, 2.0f);
    auto w = test::random_floats(static_cast<size_t>(dim), rng);
    // fused: out aliases y, as the model calls it
    auto run = [&](Backend& b, bool fused) {
      float* px = put(b, x);
      float* py = put(b, y);
      float* pw = put(b, w);
      if (fused) {
        b.add_rms_norm(px, py, pw, 1e-5f, n, dim, py);
      } else {
        b.add(px, py, n * dim);
        b.rms_norm(px, pw, 1e-5f, n, dim, py);
      }
      auto out = get(b, px, x.size());
      auto normed = get(b, py, y.size());
      out.insert(out.end(), normed.begin(), normed.end());
      return out;
    };
    const auto fused = run(*gpu, true);
    expect_close(fused, run(*gpu, false), 0, 0, "add_rms_norm vs add + rms_norm (exact), dim " + std::to_string(dim));
    expect_close(fused, run(*cpu, true), 1e-6, 2e-5, "add_rms_norm vs the CPU, dim " + std::to_string(dim));
  }
  for (auto kind : {RopeKind::Interleaved, RopeKind::Neox}) {
    const int32_t nh = 6, nkv = 2, hd = 64, bs = 16, num_blocks = 8;
    const int64_t ld = int64_t{nh + 2 * nkv} * hd + 3;  // odd stride
    const MixedStep step(hd);
    const int64_t n = step.n();
    auto qkv = test::random_floats(static_cast<size_t>(n * ld), rng);
    KvCacheShape ks{2, num_blocks, bs, nkv, hd};
    // What the ops write comes back: the rotated QKV rows, and layer 1's cache through
    // attention of the step's own queries over it.
    auto run = [&](Backend& b, bool fused) {
      auto cache = b.make_kv_cache(ks);
      if (!cache) FAIL(cache.error().message);
      b.begin_step(step.inputs());
      float* p = put(b, qkv);
      float* pcs = put(b, step.cos_sin);
      if (fused) {
        b.rope_kv_write(**cache, 1, p, ld, n, nh, nkv, hd, pcs, kind);
      } else {
        b.rope(p, ld, n, nh, hd, pcs, kind);
        b.rope(p + int64_t{nh} * hd, ld, n, nkv, hd, pcs, kind);
        b.kv_write(**cache, 1, p + int64_t{nh} * hd, p + int64_t{nh + nkv} * hd, ld);
      }
      auto out = get(b, p, qkv.size());
      float* att = b.alloc(static_cast<size_t>(n) * nh * hd);
      b.attention(**cache, 1, p, ld, nh, 0.125f, att);
      auto a = get(b, att, static_cast<size_t>(n) * nh * hd);
      out.insert(out.end(), a.begin(), a.end());
      return out;
    };
    const auto fused = run(*gpu, true);
    expect_close(fused, run(*gpu, false), 0, 0, "rope_kv_write vs rope + rope + kv_write (exact)");
    expect_close(fused, run(*cpu, true), 2e-3, 2e-3, "rope_kv_write vs the CPU");
  }
}

TEST_CASE("cuda: the GEMVs' fused SiLU and RoPE + KV-write epilogues give the unfused ops' bits", "[cuda][kernels]") {
  auto gpu = [] {
    test::EnvScope e("TROUPE_CUDA_FUSE", nullptr);  // (the backend reads it when made)
    return gpu_or_skip();
  }();
  if (!gpu) return;
  // How many fused calls took the fused kernels (the backend's stats line counts them).
  auto fused_calls = [&] { return stats_count(*gpu, "fused GEMV epilogues: "); };
  std::mt19937 rng(16);
  const int64_t cols = 512;
  // F32 has no fused kernel: its fused calls take the unfused ops (the same bits trivially).
  for (const DType t :
       {DType::BF16, DType::F16, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F32}) {
    for (const int64_t ffn : {37L, 2101L}) {  // one gate/up pair a warp, and two (a partial last warp)
      auto data = test::random_weight(t, 2 * ffn, cols, rng);
      auto w = gpu->make_weight(t, cols, {{data.data(), ffn}, {data.data() + data.size() / 2, ffn}});
      REQUIRE(w.ok());
      for (const int64_t n : {1L, 3L, 11L}) {
        auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
        float* px = put(*gpu, x);
        float* gu = gpu->alloc(static_cast<size_t>(n * 2 * ffn));
        float* out = gpu->alloc(static_cast<size_t>(n * ffn));
        const auto before = fused_calls();
        gpu->matmul_silu(**w, px, n, ffn, gu, out);
        const auto fused = get(*gpu, out, static_cast<size_t>(n * ffn));
        CHECK(fused_calls() == before + (t == DType::F32 ? 0 : 1));
        gpu->matmul(**w, px, n, gu, 2 * ffn);
        gpu->silu_mul(gu, n, ffn, out);
        expect_close(fused, get(*gpu, out, static_cast<size_t>(n * ffn)), 0, 0,
                     std::string("matmul_silu vs matmul + silu_mul (exact), ") + std::string(dtype_traits(t).name) +
                         " ffn " + std::to_string(ffn) + " n " + std::to_string(n));
      }
    }
    for (auto kind : {RopeKind::Interleaved, RopeKind::Neox}) {
      const int32_t nh = 6, nkv = 2, hd = 64, bs = 16;
      const int64_t rows = int64_t{nh + 2 * nkv} * hd, ld = rows + 3;  // odd stride
      auto data = test::random_weight(t, rows, cols, rng);
      auto w = gpu->make_weight(t, cols, {{data.data(), rows}});
      REQUIRE(w.ok());
      const MixedStep step(hd);  // (as the unfused test above)
      const int64_t n = step.n();
      auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
      auto run = [&](bool fused) {
        auto cache = gpu->make_kv_cache(KvCacheShape{2, 8, bs, nkv, hd});
        if (!cache) FAIL(cache.error().message);
        gpu->begin_step(step.inputs());
        float* px = put(*gpu, x);
        float* pcs = put(*gpu, step.cos_sin);
        float* p = gpu->alloc(static_cast<size_t>(n * ld));
        if (fused) {
          gpu->matmul_rope_kv_write(**w, px, **cache, 1, p, ld, n, nh, nkv, hd, pcs, kind);
        } else {
          gpu->matmul(**w, px, n, p, ld);
          gpu->rope_kv_write(**cache, 1, p, ld, n, nh, nkv, hd, pcs, kind);
        }
        // The rows (without the stride's gap) and attention over the written cache.
        auto all = get(*gpu, p, static_cast<size_t>(n * ld));
        std::vector<float> out;
        for (int64_t tk = 0; tk < n; ++tk) out.insert(out.end(), all.begin() + tk * ld, all.begin() + tk * ld + rows);
        float* att = gpu->alloc(static_cast<size_t>(n) * nh * hd);
        gpu->attention(**cache, 1, p, ld, nh, 0.125f, att);
        auto a = get(*gpu, att, static_cast<size_t>(n) * nh * hd);
        out.insert(out.end(), a.begin(), a.end());
        return out;
      };
      const auto before = fused_calls();
      const auto fused = run(true);
      CHECK(fused_calls() == before + (t == DType::F32 ? 0 : 1));
      expect_close(fused, run(false), 0, 0,
                   std::string("matmul_rope_kv_write vs matmul + rope_kv_write (exact), ") +
                       std::string(dtype_traits(t).name) + (kind == RopeKind::Neox ? " neox" : " interleaved"));
    }
  }
}

TEST_CASE("cuda: norms that quantize their output for the next matmul give the unfused ops' bits", "[cuda][kernels]") {
  auto gpu = [] {
    test::EnvScope e("TROUPE_CUDA_FUSE", nullptr);  // (the backend reads it when made)
    return gpu_or_skip();
  }();
  if (!gpu) return;
  auto quantized = [&] {
    return stats_count(*gpu, "activations quantized for the next matmul (by norms, attention, SiLU): ");
  };
  auto used = [&] { return stats_count(*gpu, "used by the next matmul: "); };
  std::mt19937 rng(17);
  const int64_t cols = 768, rows = 300;  // (a multiple of the K-quants' 256-value blocks)
  for (const DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::BF16}) {
    const bool int8 = t != DType::BF16;
    auto data = test::random_weight(t, rows, cols, rng);
    auto w = gpu->make_weight(t, cols, {{data.data(), rows}});
    REQUIRE(w.ok());
    const auto nw = test::random_floats(static_cast<size_t>(cols), rng);
    float* pw = put(*gpu, nw);
    for (const int64_t n : {1L, 3L, 11L}) {
      const auto x = test::random_floats(static_cast<size_t>(n * cols), rng, 3.0f);
      const auto y = test::random_floats(static_cast<size_t>(n * cols), rng);
      // hint: the norm names the matmul; alter: another op writes the norm's output before
      // the matmul (what the norm prepared must not be used then).
      auto run = [&](bool add, bool hint, bool alter) {
        float* px = put(*gpu, x);
        float* py = put(*gpu, y);
        float* out = gpu->alloc(static_cast<size_t>(n * rows));
        const Weight* next = hint ? w->get() : nullptr;
        if (add)
          gpu->add_rms_norm(px, py, pw, 1e-5f, n, cols, py, next);
        else
          gpu->rms_norm(px, pw, 1e-5f, n, cols, py, next);
        if (alter) gpu->add(py, px, n * cols);
        gpu->matmul(**w, py, n, out, rows);
        auto r = get(*gpu, out, static_cast<size_t>(n * rows));
        auto xs = get(*gpu, px, static_cast<size_t>(n * cols));
        r.insert(r.end(), xs.begin(), xs.end());
        return r;
      };
      for (bool add : {false, true}) {
        const std::string what =
            std::string(dtype_traits(t).name) + " n " + std::to_string(n) + (add ? " add_rms_norm" : " rms_norm");
        const auto before = quantized(), used_before = used();
        const auto hinted = run(add, true, false);
        CHECK(quantized() == before + (int8 ? 1 : 0));
        CHECK(used() == used_before + (int8 ? 1 : 0));
        expect_close(hinted, run(add, false, false), 0, 0,
                     "norm quantizing for the matmul vs norm + matmul (exact), " + what);
        const auto used_altered = used();
        const auto altered = run(add, true, true);
        CHECK(used() == used_altered);  // another op in between: the matmul quantizes itself
        expect_close(altered, run(add, false, true), 0, 0,
                     "a hint followed by another op: the matmul quantizes the changed output itself, " + what);
      }
    }
  }
}

TEST_CASE("cuda: the SiLU GEMV that quantizes its output for the down matmul gives the unfused ops' bits",
          "[cuda][kernels]") {
  auto gpu = [] {
    test::EnvScope e("TROUPE_CUDA_FUSE", nullptr);  // (the backend reads it when made)
    return gpu_or_skip();
  }();
  if (!gpu) return;
  auto quantized = [&] {
    return stats_count(*gpu, "activations quantized for the next matmul (by norms, attention, SiLU): ");
  };
  auto used = [&] { return stats_count(*gpu, "used by the next matmul: "); };
  std::mt19937 rng(18);
  const int64_t cols = 256, rows = 70;
  // gate/up and down types: the same, another rounding of the activations (Q6_K's f32 d),
  // and a down matmul without int8 activations (nothing quantized).
  const std::vector<std::pair<DType, DType>> pairs = {{DType::Q4_0, DType::Q4_0}, {DType::Q4_1, DType::Q4_1},
                                                      {DType::Q8_0, DType::Q8_0}, {DType::Q4_K, DType::Q4_K},
                                                      {DType::Q4_1, DType::Q6_K}, {DType::Q8_0, DType::BF16}};
  for (const auto& [tg, td] : pairs) {
    // one gate/up pair a warp (4 items a block), and two (8 items a block, 4608 rows)
    for (const int64_t ffn : {256L, 2304L}) {
      auto gdata = test::random_weight(tg, 2 * ffn, cols, rng);
      auto gw = gpu->make_weight(tg, cols, {{gdata.data(), 2 * ffn}});
      auto ddata = test::random_weight(td, rows, ffn, rng);
      auto dw = gpu->make_weight(td, ffn, {{ddata.data(), rows}});
      REQUIRE(gw.ok());
      REQUIRE(dw.ok());
      const bool int8 = td != DType::BF16;
      for (const int64_t n : {1L, 3L, 11L}) {
        const auto x = test::random_floats(static_cast<size_t>(n * cols), rng);
        // hint: matmul_silu names the down weight; alter: another op writes the SiLU output
        // before the down matmul (what was prepared must not be used then).
        auto run = [&](bool hint, bool alter) {
          float* px = put(*gpu, x);
          float* gu = gpu->alloc(static_cast<size_t>(n * 2 * ffn));
          float* act = gpu->alloc(static_cast<size_t>(n * ffn));
          float* y = gpu->alloc(static_cast<size_t>(n * rows));
          gpu->matmul_silu(**gw, px, n, ffn, gu, act, hint ? dw->get() : nullptr);
          if (alter) gpu->add(act, act, n * ffn);
          gpu->matmul(**dw, act, n, y, rows);
          auto r = get(*gpu, y, static_cast<size_t>(n * rows));
          auto a = get(*gpu, act, static_cast<size_t>(n * ffn));
          r.insert(r.end(), a.begin(), a.end());
          return r;
        };
        const std::string what = std::string(dtype_traits(tg).name) + " -> " + std::string(dtype_traits(td).name) +
                                 " ffn " + std::to_string(ffn) + " n " + std::to_string(n);
        const auto before = quantized(), used_before = used();
        const auto hinted = run(true, false);
        CHECK(quantized() == before + (int8 ? 1 : 0));
        CHECK(used() == used_before + (int8 ? 1 : 0));
        expect_close(hinted, run(false, false), 0, 0,
                     "SiLU GEMV quantizing for the down matmul vs not (exact), " + what);
        const auto used_altered = used();
        const auto altered = run(true, true);
        CHECK(used() == used_altered);  // another op in between: the down matmul quantizes itself
        expect_close(altered, run(false, true), 0, 0,
                     "a hint followed by another op: the down matmul quantizes the changed output itself, " + what);
        // a second hinted run (the block counters were left zero by the first)
        expect_close(run(true, false), hinted, 0, 0, "SiLU GEMV quantizing, run again, " + what);
      }
    }
  }
}

TEST_CASE(
    "cuda: --cuda-cublas matmuls taking x in half from the norm or SiLU before them give the converting matmul's bits",
    "[cuda][kernels]") {
  auto gpu = [] {
    test::EnvScope e("TROUPE_CUDA_FUSE", nullptr);  // (the backend reads it when made)
    return gpu_or_skip(/*batch_invariant=*/false);
  }();
  if (!gpu) return;
  auto taken = [&] { return stats_count(*gpu, "cuBLAS inputs in half from the op before: "); };
  auto converted = [&] { return stats_count(*gpu, "(converted: "); };
  std::mt19937 rng(19);
  const int64_t cols = 320, rows = 72, ffn = 288;
  // bf16 (x in bf16), f16 and Q8_0 (dequantized to f16 for cuBLAS: x in f16). 9 and 20
  // tokens: above the GEMV's 8, so cuBLAS.
  for (const DType t : {DType::BF16, DType::F16, DType::Q8_0}) {
    auto data = test::random_weight(t, rows, cols, rng);
    auto w = gpu->make_weight(t, cols, {{data.data(), rows}});
    auto gdata = test::random_weight(t, 2 * ffn, cols, rng);
    auto gw = gpu->make_weight(t, cols, {{gdata.data(), 2 * ffn}});
    auto ddata = test::random_weight(t, rows, ffn, rng);
    auto dw = gpu->make_weight(t, ffn, {{ddata.data(), rows}});
    REQUIRE(w.ok());
    REQUIRE(gw.ok());
    REQUIRE(dw.ok());
    float* pw = put(*gpu, test::random_floats(static_cast<size_t>(cols), rng));
    for (const int64_t n : {9L, 20L}) {
      const auto x = test::random_floats(static_cast<size_t>(n * cols), rng, 3.0f);
      const auto y = test::random_floats(static_cast<size_t>(n * cols), rng);
      const auto g = test::random_floats(static_cast<size_t>(n * 2 * ffn), rng, 3.0f);
      // op 0: rms_norm, 1: add_rms_norm, 2: gate/up matmul + SiLU, 3: SiLU alone (separate
      // gate and up weights); then the matmul that reads the op's output. hint: the op names
      // that matmul; alter: another op writes the output before the matmul (what was
      // prepared must not be used then).
      auto run = [&](int op, bool hint, bool alter) {
        float* px = put(*gpu, x);
        float* py = put(*gpu, y);
        const bool silu = op >= 2;
        float* act = silu ? gpu->alloc(static_cast<size_t>(n * ffn)) : py;
        float* gu = silu ? gpu->alloc(static_cast<size_t>(n * 2 * ffn)) : nullptr;
        float* out = gpu->alloc(static_cast<size_t>(n * rows));
        const Weight* next = hint ? (silu ? dw->get() : w->get()) : nullptr;
        if (op == 0) gpu->rms_norm(px, pw, 1e-5f, n, cols, py, next);
        if (op == 1) gpu->add_rms_norm(px, py, pw, 1e-5f, n, cols, py, next);
        if (op == 2) gpu->matmul_silu(**gw, px, n, ffn, gu, act, next);
        if (op == 3) gpu->silu_mul(put(*gpu, g), n, ffn, act, next);
        if (alter) gpu->add(act, act, n * (silu ? ffn : cols));
        gpu->matmul(silu ? **dw : **w, act, n, out, rows);
        auto r = get(*gpu, out, static_cast<size_t>(n * rows));
        auto a = get(*gpu, act, static_cast<size_t>(n * (silu ? ffn : cols)));
        r.insert(r.end(), a.begin(), a.end());
        return r;
      };
      for (int op = 0; op < 4; ++op) {
        const std::string what = std::string(dtype_traits(t).name) + " n " + std::to_string(n) + " " +
                                 (op == 0   ? "rms_norm"
                                  : op == 1 ? "add_rms_norm"
                                  : op == 2 ? "gate/up + SiLU"
                                            : "SiLU");
        INFO(what << "; " << gpu->stats());
        const auto taken0 = taken(), converted0 = converted();
        const auto hinted = run(op, true, false);
        CHECK(taken() == taken0 + 1);
        CHECK(converted() == converted0 + (op == 2 ? 1 : 0));  // (the gate/up matmul converts the plain x)
        expect_close(hinted, run(op, false, false), 0, 0, "x in half from the op before vs converted (exact), " + what);
        const auto taken1 = taken();
        const auto altered = run(op, true, true);
        CHECK(taken() == taken1);  // another op in between: the matmul converts the changed output itself
        expect_close(altered, run(op, false, true), 0, 0,
                     "a hint followed by another op: the matmul converts the changed output itself, " + what);
      }
    }
  }
}

namespace {

// Rows of logits of several shapes: peaked, flat (draws deep in the order), tied, with NaN,
// -inf and signed zeros.
std::vector<float> sampling_row(int64_t vocab, int kind, std::mt19937& g) {
  std::vector<float> row(static_cast<size_t>(vocab));
  std::normal_distribution<float> nd(0.0f, kind == 1 ? 0.01f : 1.0f + static_cast<float>(g() % 6));
  for (auto& x : row) x = nd(g);
  if (kind == 0)
    for (int i = 0; i < 10; ++i) row[g() % vocab] += static_cast<float>(g() % 15);
  if (kind == 2)
    for (int i = 0; i < 300; ++i) row[g() % vocab] = 1.5f;
  if (kind == 3) {
    row[g() % vocab] = std::numeric_limits<float>::quiet_NaN();
    row[g() % vocab] = -std::numeric_limits<float>::infinity();
    row[g() % vocab] = 0.0f;
    row[g() % vocab] = -0.0f;
    for (int i = 0; i < 5; ++i) row[g() % vocab] += 8.0f;
  }
  return row;
}

}  // namespace

TEST_CASE("cuda: on-device sampling picks the host sampler's tokens", "[cuda][kernels][sampling]") {
  auto gpu = gpu_or_skip();
  if (!gpu) return;
  REQUIRE(gpu->can_sample());
  std::mt19937 g(5);
  int checked = 0, differ = 0, greedy_differ = 0;
  double worst_logprob = 0;
  for (int64_t vocab : {1000, 49152, 151936}) {
    const int rows = vocab > 100000 ? 24 : 64;
    std::vector<float> logits;
    std::vector<DeviceSampleParams> params;
    std::vector<int32_t> want;
    std::vector<float> want_lp;
    for (int r = 0; r < rows; ++r) {
      const auto row = sampling_row(vocab, r % 4, g);
      SamplingParams p;
      const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 2.5f};
      p.temperature = temps[g() % 5];
      const int32_t ks[] = {0, 0, 1, 5, 100, 3000};
      p.top_k = ks[g() % 6];
      const float tps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.999f};
      p.top_p = tps[g() % 5];
      const float mps[] = {0.0f, 0.0f, 0.05f, 0.001f};
      p.min_p = mps[g() % 4];
      p.seed = g();
      p.report_logprob = g() % 2 == 0;
      Sampler s(p, static_cast<int32_t>(vocab));
      const uint64_t skip = g() % 50;
      for (uint64_t i = 0; i < skip; ++i) s.skip_draw();
      REQUIRE(s.device_eligible());
      params.push_back(s.device_params());
      const SampleResult res = s.sample(row.data());
      want.push_back(res.token);
      want_lp.push_back(res.logprob);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    float* dev = put(*gpu, logits);
    std::vector<int32_t> got(rows);
    std::vector<float> got_lp(rows);
    auto st = gpu->sample(dev, rows, vocab, params.data(), got.data(), got_lp.data());
    if (!st.ok()) FAIL(st.error().message);
    // The same rows one at a time, and again: the same tokens (no batch or run dependence).
    for (int r = 0; r < rows; ++r) {
      int32_t t1 = -1;
      float lp1 = 0;
      auto st1 = gpu->sample(dev + int64_t{r} * vocab, 1, vocab, &params[r], &t1, &lp1);
      if (!st1.ok()) FAIL(st1.error().message);
      CHECK(t1 == got[r]);
    }
    for (int r = 0; r < rows; ++r) {
      REQUIRE(got[r] >= 0);
      REQUIRE(got[r] < vocab);
      ++checked;
      if (got[r] != want[r]) {
        ++differ;
        if (params[r].temperature == 0.0f) ++greedy_differ;
        WARN("vocab " << vocab << " row " << r << ": device " << got[r] << ", host " << want[r] << " (T "
                      << params[r].temperature << ", top_k " << params[r].top_k << ", top_p " << params[r].top_p
                      << ", min_p " << params[r].min_p << ")");
      } else if (params[r].want_logprob) {
        worst_logprob = std::max(worst_logprob, std::fabs(double(got_lp[r]) - want_lp[r]));
      }
    }
  }
  WARN(differ << " of " << checked << " sampled tokens differ from the host sampler's; worst logprob diff "
              << worst_logprob);
  CHECK(greedy_differ == 0);
  // Both sum the same terms in a different order (and expf may differ by an ulp), so a draw
  // within rounding of a boundary may land on the neighbour; anything more is a bug.
  CHECK(differ <= checked / 100);
  CHECK(worst_logprob <= 1e-3);
}
