// Paged attention on the CUDA backend against the CPU (GQA, chunked prefill and decode, the
// --cuda-cublas tensor-core tiles, mma.sync and WMMA) and split-KV against the looped path, bit for bit, with K
// staged or read directly and with every token on tensor cores (TROUPE_CUDA_ATTN=tc and wmma).
// Tagged [cuda]; without a GPU each case prints why it is skipped (host-run runs them over
// the fake device).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <numeric>
#include <random>

#include "kernels/backend.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;
using test::expect_close;
using test::get;
using test::gpu_or_skip;
using test::put;

TEST_CASE("cuda: paged attention and KV writes match the CPU (GQA, chunked prefill + decode)", "[cuda][kernels]") {
  // The batch-invariant backend (per-token kernel), then the --cuda-cublas one (76 tokens:
  // the 70-token prefill's one-sequence tiles go to a tensor-core kernel, over two 64-key
  // steps): the mma.sync kernel, then the WMMA one (TROUPE_CUDA_ATTN=wmma).
  for (int mode = 0; mode < 3; ++mode) {
    const bool invariant = mode == 0;
    test::EnvScope env("TROUPE_CUDA_ATTN", mode == 2 ? "wmma" : nullptr);
    auto gpu = gpu_or_skip(invariant);
    if (!gpu) return;
    auto cpu = make_cpu_backend({2});
    std::mt19937 rng(15);
    for (int32_t hd : {64, 128}) {
      const int32_t nh = 6, nkv = 2, bs = 16, num_blocks = 64;
      // Three sequences: a 70-token prefill from position 0, a 5-token chunk at 40..44 (its
      // first 40 positions written by an earlier step) and one decode token at position 100.
      const std::vector<int32_t> first = {0, 40, 100}, count = {70, 5, 1};
      std::vector<int32_t> perm(num_blocks);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      const int32_t max_blocks = 8;
      std::vector<int32_t> tables(3 * max_blocks);
      for (int i = 0; i < 3 * max_blocks; ++i) tables[i] = perm[i];
      KvCacheShape ks{1, num_blocks, bs, nkv, hd};
      auto run = [&](Backend& b) {
        auto cache = b.make_kv_cache(ks);
        if (!cache) FAIL(cache.error().message);
        std::mt19937 r2(99);
        const int64_t qld = int64_t{nh + 2 * nkv} * hd;
        // Earlier steps: positions [0, first) of every sequence, then this step.
        std::vector<float> last_out;
        for (int phase = 0; phase < 2; ++phase) {
          std::vector<int32_t> ids, pos, slots, qs = {0}, ctx;
          for (int s = 0; s < 3; ++s) {
            const int32_t lo = phase == 0 ? 0 : first[s], hi = phase == 0 ? first[s] : first[s] + count[s];
            if (hi <= lo) continue;
            for (int32_t p = lo; p < hi; ++p) {
              ids.push_back(1);
              pos.push_back(p);
              slots.push_back(tables[s * max_blocks + p / bs] * bs + p % bs);
            }
            qs.push_back(static_cast<int32_t>(pos.size()));
            ctx.push_back(hi);
          }
          std::vector<int32_t> bt;
          for (int s = 0; s < 3; ++s)
            if ((phase == 0 && first[s] > 0) || phase == 1)
              bt.insert(bt.end(), tables.begin() + s * max_blocks, tables.begin() + (s + 1) * max_blocks);
          StepInputs st;
          st.num_tokens = static_cast<int32_t>(pos.size());
          st.num_seqs = static_cast<int32_t>(ctx.size());
          st.token_ids = ids.data();
          st.positions = pos.data();
          st.query_start = qs.data();
          st.context_lens = ctx.data();
          st.slot_mapping = slots.data();
          st.block_tables = bt.data();
          st.max_blocks_per_seq = max_blocks;
          auto qkv = test::random_floats(static_cast<size_t>(st.num_tokens * qld), r2);
          b.begin_step(st);
          float* p = put(b, qkv);
          b.kv_write(**cache, 0, p + int64_t{nh} * hd, p + int64_t{nh + nkv} * hd, qld);
          float* out = b.alloc(static_cast<size_t>(st.num_tokens) * nh * hd);
          b.attention(**cache, 0, p, qld, nh, 1.0f / std::sqrt(float(hd)), out);
          last_out = get(b, out, static_cast<size_t>(st.num_tokens) * nh * hd);
        }
        return last_out;
      };
      expect_close(run(*gpu), run(*cpu), 2e-3, 2e-3,
                   "attention hd " + std::to_string(hd) +
                       (mode == 1   ? " (mma.sync for the prefill tiles)"
                        : mode == 2 ? " (WMMA for the prefill tiles)"
                                    : ""));
    }
  }
}

TEST_CASE("cuda: split-KV decode attention gives the same bits as the looped path", "[cuda][kernels][batch]") {
  auto gpu = gpu_or_skip();
  if (!gpu) return;
  auto cpu = make_cpu_backend({2});
  const int32_t nh = 6, nkv = 2, hd = 64, bs = 16, max_blocks = 64;
  KvCacheShape ks{1, 2 * max_blocks, bs, nkv, hd};
  const int64_t qld = int64_t{nh + 2 * nkv} * hd;
  // Sequence 0 owns blocks [0, 64), sequence 1 blocks [64, 128).
  std::vector<int32_t> tables(2 * max_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  struct Tok {
    int32_t seq, pos;
  };
  // Runs one step (tokens grouped by sequence, in order); returns the attention output.
  auto step = [&](Backend& b, KvCache& cache, const std::vector<Tok>& toks, uint32_t seed) {
    std::vector<int32_t> ids, pos, slots, qs = {0}, ctx, bt;
    for (size_t i = 0; i < toks.size(); ++i) {
      ids.push_back(1);
      pos.push_back(toks[i].pos);
      slots.push_back(tables[toks[i].seq * max_blocks + toks[i].pos / bs] * bs + toks[i].pos % bs);
      if (i + 1 == toks.size() || toks[i + 1].seq != toks[i].seq) {
        qs.push_back(static_cast<int32_t>(i + 1));
        ctx.push_back(toks[i].pos + 1);
        bt.insert(bt.end(), tables.begin() + toks[i].seq * max_blocks, tables.begin() + (toks[i].seq + 1) * max_blocks);
      }
    }
    StepInputs st{static_cast<int32_t>(pos.size()),
                  static_cast<int32_t>(ctx.size()),
                  ids.data(),
                  pos.data(),
                  qs.data(),
                  ctx.data(),
                  slots.data(),
                  bt.data(),
                  max_blocks};
    // Each token's q, k, v depend on (sequence, position) only, whatever its batch.
    std::vector<float> qkv;
    for (const Tok& tk : toks) {
      std::mt19937 r(seed + static_cast<uint32_t>(tk.seq * 100003 + tk.pos));
      auto row = test::random_floats(static_cast<size_t>(qld), r);
      qkv.insert(qkv.end(), row.begin(), row.end());
    }
    b.begin_step(st);
    float* p = put(b, qkv);
    b.kv_write(cache, 0, p + int64_t{nh} * hd, p + int64_t{nh + nkv} * hd, qld);
    float* out = b.alloc(static_cast<size_t>(st.num_tokens) * nh * hd);
    b.attention(cache, 0, p, qld, nh, 0.125f, out);
    return get(b, out, static_cast<size_t>(st.num_tokens) * nh * hd);
  };
  auto run = [&](Backend& b) {
    auto cache = b.make_kv_cache(ks);
    if (!cache) FAIL(cache.error().message);
    std::vector<Tok> fill;
    for (int32_t p = 0; p < 700; ++p) fill.push_back({1, p});
    step(b, **cache, fill, 1);  // sequence 1: positions 0..699 (looped path)
    // Position 700 of sequence 1 alone (2 looped blocks: split-KV over 3 segments) ...
    auto alone = step(b, **cache, {{1, 700}}, 2);
    // ... and again beside a 400-token prefill of sequence 0 (401 tokens x 2 KV heads:
    // 802 looped blocks, at least 4 per multiprocessor on GPUs of up to 200: looped path).
    std::vector<Tok> mixed;
    for (int32_t p = 0; p < 400; ++p) mixed.push_back({0, p});
    mixed.push_back({1, 700});
    auto with = step(b, **cache, mixed, 2);
    std::vector<float> last(with.end() - nh * hd, with.end());
    return std::make_pair(alone, last);
  };
  auto [g_alone, g_with] = run(*gpu);
  REQUIRE(g_alone == g_with);  // bit for bit
  // K rows read directly instead of staged in shared memory (TROUPE_CUDA_ATTN=direct): the
  // same bits on both paths.
  auto direct = [] {
    test::EnvScope e("TROUPE_CUDA_ATTN", "direct");
    return gpu_or_skip();
  }();
  auto [d_alone, d_with] = run(*direct);
  REQUIRE(d_alone == g_alone);
  REQUIRE(d_with == g_with);
  auto [c_alone, c_with] = run(*cpu);
  expect_close(g_alone, c_alone, 2e-3, 2e-3, "split-KV decode attention vs the CPU");
  // Every token on tensor cores (TROUPE_CUDA_ATTN=tc: the mma.sync kernel; =wmma: the WMMA
  // one): the decode token split-KV alone and looped in a tile of its own beside the
  // prefill's 16-token tiles, the same bits.
  std::vector<float> kernels_alone[2];
  for (int k = 0; k < 2; ++k) {
    auto tc = [&] {
      test::EnvScope e("TROUPE_CUDA_ATTN", k == 0 ? "tc" : "wmma");
      return gpu_or_skip();
    }();
    auto [t_alone, t_with] = run(*tc);
    REQUIRE(t_alone == t_with);  // bit for bit
    CHECK(t_alone != g_alone);   // (another kernel: P rounded to f16)
    expect_close(t_alone, c_alone, 3e-3, 3e-3,
                 std::string("tensor-core decode attention vs the CPU, ") + (k == 0 ? "mma.sync" : "WMMA"));
    kernels_alone[k] = t_alone;
  }
  CHECK(kernels_alone[0] != kernels_alone[1]);  // (two kernels ran, not one twice)
}
