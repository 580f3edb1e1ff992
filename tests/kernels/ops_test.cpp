// Differential tests of the non-matmul CPU ops against plain references written here:
// RMSNorm, RoPE (both pairings), SiLU-gated multiply, f16 row helpers, embedding lookup and
// paged attention (random block tables, GQA, odd head counts and lengths).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include <cstring>
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"  // detect_isa
#include "kernels/cpu/ops.h"
#include "kernels/fp16.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

TEST_CASE("rms_norm matches the formula", "[kernels][ops]") {
  std::mt19937 rng(1);
  for (int64_t dim : {1, 7, 64, 577}) {
    auto x = test::random_floats(static_cast<size_t>(3 * dim), rng, 3.0f);
    auto w = test::random_floats(static_cast<size_t>(dim), rng);
    std::vector<float> y(x.size());
    cpu::rms_norm_rows(x.data(), w.data(), 1e-5f, 0, 3, dim, y.data());
    for (int64_t r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < dim; ++j) ss += double(x[r * dim + j]) * x[r * dim + j];
      const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t j = 0; j < dim; ++j)
        REQUIRE(std::fabs(y[r * dim + j] - x[r * dim + j] * s * w[j]) <=
                1e-5 * (1 + std::fabs(x[r * dim + j] * s * w[j])));
    }
  }
}

TEST_CASE("rope rotates the right pairs by the right angles", "[kernels][ops]") {
  std::mt19937 rng(2);
  const int64_t heads = 3, hd = 10, n = 5, ld = heads * hd + 7;  // odd stride
  for (auto style : {cpu::RopeStyle::Interleaved, cpu::RopeStyle::Neox}) {
    auto x = test::random_floats(static_cast<size_t>(n * ld), rng);
    auto orig = x;
    std::vector<float> cs(static_cast<size_t>(n * hd));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double th = (t * 3 + 1) * std::pow(10000.0, -2.0 * i / hd);
        cs[t * hd + 2 * i] = static_cast<float>(std::cos(th));
        cs[t * hd + 2 * i + 1] = static_cast<float>(std::sin(th));
      }
    cpu::rope_rows(x.data(), ld, 0, n, heads, hd, cs.data(), style);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const int64_t a = style == cpu::RopeStyle::Interleaved ? 2 * i : i;
          const int64_t b = style == cpu::RopeStyle::Interleaved ? 2 * i + 1 : i + hd / 2;
          const double th = (t * 3 + 1) * std::pow(10000.0, -2.0 * i / hd);
          const double x0 = orig[t * ld + h * hd + a], x1 = orig[t * ld + h * hd + b];
          REQUIRE(std::fabs(x[t * ld + h * hd + a] - (x0 * std::cos(th) - x1 * std::sin(th))) < 1e-5);
          REQUIRE(std::fabs(x[t * ld + h * hd + b] - (x0 * std::sin(th) + x1 * std::cos(th))) < 1e-5);
        }
      for (int64_t j = heads * hd; j < ld; ++j) REQUIRE(x[t * ld + j] == orig[t * ld + j]);  // padding untouched
    }
  }
}

TEST_CASE("silu_mul matches the formula", "[kernels][ops]") {
  std::mt19937 rng(3);
  const int64_t ffn = 37, n = 3;
  auto gu = test::random_floats(static_cast<size_t>(n * 2 * ffn), rng, 4.0f);
  std::vector<float> out(static_cast<size_t>(n * ffn));
  cpu::silu_mul_rows(gu.data(), 0, n, ffn, out.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < ffn; ++j) {
      const double g = gu[r * 2 * ffn + j], u = gu[r * 2 * ffn + ffn + j];
      REQUIRE(std::fabs(out[r * ffn + j] - g / (1 + std::exp(-g)) * u) <= 1e-5 * (1 + std::fabs(g * u)));
    }
}

TEST_CASE("f16 row helpers agree with the scalar conversions", "[kernels][ops]") {
  std::mt19937 rng(4);
  for (int64_t n : {1, 8, 13, 64, 100}) {
    auto x = test::random_floats(static_cast<size_t>(n), rng, 10.0f);
    auto y = test::random_floats(static_cast<size_t>(n), rng);
    std::vector<uint16_t> h(static_cast<size_t>(n));
    cpu::f32_to_f16_row(x.data(), h.data(), n);
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(h[i] == f32_to_f16(x[i]));
      dot += double(f16_to_f32(h[i])) * y[i];
    }
    std::vector<float> back(static_cast<size_t>(n));
    cpu::f16_to_f32_row(h.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) REQUIRE(back[i] == f16_to_f32(h[i]));
    REQUIRE(std::fabs(cpu::dot_f32(back.data(), y.data(), n) - dot) < 1e-4 * (1 + std::fabs(dot)));
    auto acc = y;
    cpu::axpy_f32(0.5f, back.data(), acc.data(), n);
    for (int64_t i = 0; i < n; ++i) REQUIRE(std::fabs(acc[i] - (y[i] + 0.5f * back[i])) < 1e-5f);
  }
}

TEST_CASE("the KV cache's f16 conversion stays finite: NaN to 0, saturation at +-65504", "[kernels][ops]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(f32_to_f16_kv(std::nanf("")) == 0);
  CHECK(f32_to_f16_kv(-std::nanf("")) == 0);
  CHECK(f32_to_f16_kv(inf) == 0x7bff);
  CHECK(f32_to_f16_kv(-inf) == 0xfbff);
  CHECK(f32_to_f16_kv(1e6f) == 0x7bff);
  CHECK(f32_to_f16_kv(65520.0f) == 0x7bff);  // f32_to_f16 gives Inf here
  CHECK(f32_to_f16(65520.0f) == 0x7c00);
  CHECK(f32_to_f16_kv(65519.0f) == 0x7bff);  // (rounds down to the largest f16 either way)
  CHECK(f32_to_f16_kv(-65504.0f) == 0xfbff);
  CHECK(f32_to_f16_kv(-0.0f) == 0x8000);
  // Rows mixing ordinary values with the extremes, through the SIMD body and the tail.
  std::mt19937 rng(6);
  const float extremes[] = {std::nanf(""), inf, -inf, 1e30f, -1e30f, 65520.0f, -70000.0f, 65504.0f};
  for (int64_t n : {1, 8, 13, 64, 100}) {
    auto x = test::random_floats(static_cast<size_t>(n), rng, 1000.0f);
    for (int64_t i = 0; i < n; i += 3) x[static_cast<size_t>(i)] = extremes[(i / 3) % 8];
    std::vector<uint16_t> h(static_cast<size_t>(n), 0xEEEE);
    cpu::f32_to_f16_kv_row(x.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      INFO("n " << n << " i " << i << " x " << x[i]);
      REQUIRE(h[i] == f32_to_f16_kv(x[i]));
      REQUIRE((h[i] & 0x7c00) != 0x7c00);                                  // never Inf or NaN
      if (std::fabs(x[i]) <= 65504.0f) REQUIRE(h[i] == f32_to_f16(x[i]));  // (NaN compares false)
    }
  }
}

TEST_CASE("paged attention matches naive causal attention", "[kernels][ops][attention]") {
  std::mt19937 rng(5);
  auto be = make_cpu_backend({2});
  const int32_t hd = GENERATE(24, 64);  // 64: the blocked AVX2 body where the CPU has it
  const int32_t nkv = 3, group = 3, nh = nkv * group, bs = 4, nblocks = 40;
  KvCacheShape ks{1, nblocks, bs, nkv, hd};
  auto cache = be->make_kv_cache(ks);
  REQUIRE(cache.ok());
  // Two sequences: 9 tokens from scratch and 5 more tokens on top of 7 cached ones (written
  // in an earlier step), with scattered blocks.
  const std::vector<int32_t> prior = {0, 7}, fresh = {9, 5};
  std::vector<int32_t> perm(nblocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int32_t mb = 4;
  std::vector<int32_t> tables = {perm[0], perm[1], perm[2], perm[3], perm[4], perm[5], perm[6], perm[7]};
  // Full K/V per sequence (the reference), f16-rounded as the cache stores them.
  std::vector<std::vector<float>> K(2), V(2);
  for (int s = 0; s < 2; ++s) {
    const int total = prior[s] + fresh[s];
    K[s] = test::random_floats(static_cast<size_t>(total * nkv * hd), rng);
    V[s] = test::random_floats(static_cast<size_t>(total * nkv * hd), rng);
    for (auto* v : {&K[s], &V[s]})
      for (auto& f : *v) f = f16_to_f32(f32_to_f16(f));
  }
  auto write = [&](const std::vector<std::pair<int, int>>& toks) {  // (seq, position)
    std::vector<int32_t> ids, pos, slots, qs{0}, ctx;
    std::vector<float> k, v;
    int last = -1;
    for (auto [s, p] : toks) {
      if (s != last) {
        if (last >= 0) qs.push_back(static_cast<int32_t>(ids.size()));
        last = s;
        ctx.push_back(0);
      }
      ids.push_back(1);
      pos.push_back(p);
      slots.push_back(tables[s * mb + p / bs] * bs + p % bs);
      ctx.back() = p + 1;
      k.insert(k.end(), K[s].begin() + p * nkv * hd, K[s].begin() + (p + 1) * nkv * hd);
      v.insert(v.end(), V[s].begin() + p * nkv * hd, V[s].begin() + (p + 1) * nkv * hd);
    }
    qs.push_back(static_cast<int32_t>(ids.size()));
    return std::make_tuple(ids, pos, slots, qs, ctx, k, v);
  };
  auto run_step = [&](const std::vector<std::pair<int, int>>& toks, const std::vector<float>* q,
                      std::vector<float>* out) {
    auto [ids, pos, slots, qs, ctx, k, v] = write(toks);
    StepInputs st;
    st.num_tokens = static_cast<int32_t>(ids.size());
    st.num_seqs = static_cast<int32_t>(ctx.size());
    st.token_ids = ids.data();
    st.positions = pos.data();
    st.query_start = qs.data();
    st.context_lens = ctx.data();
    st.slot_mapping = slots.data();
    st.block_tables = toks.front().first == 1 ? tables.data() + mb : tables.data();
    st.max_blocks_per_seq = mb;
    be->begin_step(st);
    be->kv_write(**cache, 0, k.data(), v.data(), nkv * hd);
    if (q) be->attention(**cache, 0, q->data(), nh * hd, nh, 1.0f / std::sqrt(float(hd)), out->data());
  };
  // Step 1: sequence 1's first 7 tokens only (cache them).
  std::vector<std::pair<int, int>> pre;
  for (int p = 0; p < prior[1]; ++p) pre.push_back({1, p});
  run_step(pre, nullptr, nullptr);
  // Step 2: both sequences' fresh tokens together, with queries.
  std::vector<std::pair<int, int>> toks;
  for (int s = 0; s < 2; ++s)
    for (int p = prior[s]; p < prior[s] + fresh[s]; ++p) toks.push_back({s, p});
  auto q = test::random_floats(toks.size() * nh * hd, rng);
  std::vector<float> out(toks.size() * nh * hd);
  run_step(toks, &q, &out);
  for (size_t t = 0; t < toks.size(); ++t) {
    auto [s, p] = toks[t];
    for (int h = 0; h < nh; ++h) {
      const int kh = h / group;
      std::vector<double> w(static_cast<size_t>(p + 1));
      double mx = -1e300, z = 0;
      for (int j = 0; j <= p; ++j) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += double(q[t * nh * hd + h * hd + i]) * K[s][(j * nkv + kh) * hd + i];
        w[j] = d / std::sqrt(double(hd));
        mx = std::max(mx, w[j]);
      }
      for (auto& e : w) {
        e = std::exp(e - mx);
        z += e;
      }
      for (int i = 0; i < hd; ++i) {
        double o = 0;
        for (int j = 0; j <= p; ++j) o += w[j] / z * V[s][(j * nkv + kh) * hd + i];
        // Queries and weights are rounded to f16 (as GGML): 2^-11 relative each.
        REQUIRE(std::fabs(out[t * nh * hd + h * hd + i] - o) < 5e-3 * (1 + std::fabs(o)));
      }
    }
  }
}

TEST_CASE("blocked attention gives the bits of the one-key-at-a-time path", "[kernels][ops][attention]") {
  // attention_tile (what the backend calls) and each SIMD body this CPU has, called directly:
  // attention_tile dispatches once per process, so on an AVX-512 machine it alone would never
  // reach the AVX2 body.
  std::vector<std::pair<const char*, void (*)(const cpu::AttentionTile&)>> bodies{
      {"attention_tile", cpu::attention_tile}};
  if (cpu::detect_isa() >= cpu::Isa::Avx2)
    bodies.push_back({"avx2", cpu::attention_tile_avx2});
  else
    WARN("AVX2 attention body not exercised: this CPU (or TROUPE_CPU_ISA) lacks AVX2/FMA/F16C");
  if (cpu::detect_isa() >= cpu::Isa::Avx512)
    bodies.push_back({"avx512", cpu::attention_tile_avx512});
  else
    WARN("AVX-512 attention body not exercised: this CPU (or TROUPE_CPU_ISA) lacks AVX-512");
  std::mt19937 rng(11);
  for (int32_t hd : {64, 128}) {
    for (int32_t group : {1, 2, 3, 4, 5}) {
      const int32_t nkv = 2, bs = 16, nblocks = 24, nh = nkv * group;
      const int64_t row = int64_t{nkv} * hd;
      std::vector<uint16_t> k(static_cast<size_t>(nblocks * bs * row)), v(k.size());
      for (auto& x : k) x = f32_to_f16(std::uniform_real_distribution<float>(-2, 2)(rng));
      for (auto& x : v) x = f32_to_f16(std::uniform_real_distribution<float>(-2, 2)(rng));
      std::vector<int32_t> table(nblocks);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      for (int32_t num : {1, 3, 4})
        for (const int32_t first :
             {0, 5, std::uniform_int_distribution<int32_t>(0, 300)(rng)}) {  // short and odd lengths
          for (const auto& [body_name, body] : bodies) {
            std::vector<int32_t> pos(static_cast<size_t>(num));
            std::iota(pos.begin(), pos.end(), first);
            const auto q = test::random_floats(static_cast<size_t>(num * nh * hd), rng);
            std::vector<float> fast(q.size(), 7.0f), slow(q.size(), -7.0f);
            for (int32_t h = 0; h < nkv; ++h) {
              cpu::AttentionTile at;
              at.k = k.data();
              at.v = v.data();
              at.row = row;
              at.head_dim = hd;
              at.block_size = bs;
              at.group = group;
              at.kv_head = h;
              at.block_table = table.data();
              at.scale = 1.0f / std::sqrt(float(hd));
              at.q = q.data();
              at.ld_q = int64_t{nh} * hd;
              at.positions = pos.data();
              at.num = num;
              at.ld_out = at.ld_q;
              at.out = fast.data();
              body(at);
              at.out = slow.data();
              cpu::attention_tile_portable(at);
            }
            INFO(body_name << ": hd " << hd << " group " << group << " num " << num << " first " << first);
            for (size_t i = 0; i < q.size(); ++i) REQUIRE(std::memcmp(&fast[i], &slow[i], sizeof(float)) == 0);
          }
        }
    }
  }
}

TEST_CASE("the softmax's vector exp gives std::exp's bits", "[kernels][ops][attention]") {
  std::mt19937 rng(17);
  // Negative inputs: the softmax; positive ones up to 88.5 too: silu_mul's exp(-gate).
  std::uniform_real_distribution<float> wide(-110.0f, 0.0f), narrow(-2.0f, 0.0f), positive(0.0f, 88.5f);
  std::vector<float> x(1 << 20);
  for (int round = 0; round < 8; ++round) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 2 ? positive : i % 3 ? wide : narrow)(rng);
    // Edges: 0, the underflow threshold and its neighbours, subnormal results, tiny inputs.
    const float edges[] = {0.0f,
                           -0.0f,
                           -0x1.9fe368p6f,
                           std::nextafter(-0x1.9fe368p6f, 0.0f),
                           std::nextafter(-0x1.9fe368p6f, -200.0f),
                           -87.5f,
                           -88.7f,
                           -1e-30f,
                           -200.0f,
                           1e-30f,
                           87.9f,
                           88.0f,
                           88.1f,
                           88.7f,
                           89.0f,
                           200.0f};
    std::copy(std::begin(edges), std::end(edges), x.begin());
    const float sub = round % 2 ? 0.0f : 1.5f;
    auto got = x;
    cpu::exp_sub_row(got.data(), static_cast<int32_t>(got.size()) - round, sub);  // odd lengths: the scalar tail
    size_t mismatches = 0;
    for (size_t i = 0; i + round < x.size(); ++i) {
      const float want = std::exp(x[i] - sub);
      if (std::memcmp(&want, &got[i], sizeof(float)) != 0 && mismatches++ == 0)
        WARN("x " << x[i] << " sub " << sub << ": std::exp " << want << ", exp_sub_row " << got[i]);
    }
    REQUIRE(mismatches == 0);
  }
}
