// Microbenchmark of the CPU attention tile: the body attention_tile dispatches to (AVX-512
// where the CPU has it, else the blocked AVX2 one; TROUPE_CPU_ISA=avx2 picks AVX2) beside
// the one-key-at-a-time path it reproduces bit for bit (attention_tile_portable), for a
// decode query (1 token, 3 query heads per KV head, as SmolLM2) and prefill tiles (4
// or 8 tokens), over contexts of 128..2048 positions of a paged f16 cache, one thread.
// Then a serving-like pass with the cache out of the CPU caches: decode tiles of 32
// sequences x 30 layers, each sequence's blocks scattered over a pool of ~280 MB.
// Usage: troupe_attention_bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/packed.h"
#include "kernels/fp16.h"

using namespace troupe;

namespace {

// Decode tiles as a serving step meets them: every (layer, sequence, KV head) once, the
// blocks of 32 sequences of 384 positions spread over 30 layers' pools.
void cold_decode(int32_t hd, int32_t group, int32_t nkv, int32_t bs, std::mt19937& rng) {
  const int32_t seqs = 32, ctx = 384, layers = 30, per_seq = ctx / bs;
  const int64_t row = int64_t{nkv} * hd;
  const int64_t layer_blocks = int64_t{seqs} * per_seq;
  // Allocated as the CPU backend allocates its KV cache (2 MiB aligned, transparent huge pages).
  const size_t elems = static_cast<size_t>(layers * layer_blocks * bs * row);
  auto k_mem = cpu::AlignedBytes::allocate(elems * 2), v_mem = cpu::AlignedBytes::allocate(elems * 2);
  if (!k_mem.ptr || !v_mem.ptr) return;
  auto* kp = reinterpret_cast<uint16_t*>(k_mem.ptr.get());
  auto* vp = reinterpret_cast<uint16_t*>(v_mem.ptr.get());
  std::fill_n(kp, elems, uint16_t{0x3c00});
  std::fill_n(vp, elems, uint16_t{0x3800});
  std::vector<int32_t> table(static_cast<size_t>(layer_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(static_cast<size_t>(nkv) * group * hd), out(q.size());
  for (auto& x : q) x = u(rng);
  const int32_t pos = ctx - 1;
  auto pass = [&] {
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t s = 0; s < seqs; ++s)
        for (int32_t h = 0; h < nkv; ++h) {
          cpu::AttentionTile at;
          at.k = kp + static_cast<size_t>(l * layer_blocks * bs * row);
          at.v = vp + static_cast<size_t>(l * layer_blocks * bs * row);
          at.row = row;
          at.head_dim = hd;
          at.block_size = bs;
          at.group = group;
          at.kv_head = h;
          at.block_table = table.data() + s * per_seq;
          at.scale = 0.125f;
          at.q = q.data();
          at.ld_q = int64_t{nkv} * group * hd;
          at.positions = &pos;
          at.num = 1;
          at.out = out.data();
          at.ld_out = at.ld_q;
          at.prefetch_heads = nkv - h;  // as the backend's per-sequence tasks do
          cpu::attention_tile(at);
        }
  };
  pass();
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  const double tiles = double(layers) * seqs * nkv, bytes = 2.0 * layers * seqs * ctx * row * 2;
  std::printf(
      "\nServing-like decode (cache cold): %d sequences x %d positions x %d layers, %.0f MB of KV: "
      "%.1f us/tile, %.2f ms per step, %.1f GB/s of KV\n",
      seqs, ctx, layers, double(elems) * 4 / 1e6, best / tiles, best / 1e3, bytes / best * 1e-3);
}

}  // namespace

int main() {
  const int32_t hd = 64, group = 3, nkv = 3, bs = 16, max_ctx = 2048;
  const int64_t row = int64_t{nkv} * hd;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const int32_t nblocks = max_ctx / bs + 1;
  std::vector<uint16_t> k(static_cast<size_t>(nblocks * bs * row)), v(k.size());
  for (auto& x : k) x = f32_to_f16(u(rng));
  for (auto& x : v) x = f32_to_f16(u(rng));
  std::vector<int32_t> table(static_cast<size_t>(nblocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::printf(
      "| queries | context | portable us/tile | blocked us/tile | speed-up | blocked GFLOP/s "
      "|\n|---:|---:|---:|---:|---:|---:|\n");
  for (int32_t num : {1, 4, 8}) {
    for (int32_t ctx : {128, 512, 2048}) {
      std::vector<int32_t> pos(static_cast<size_t>(num));
      std::iota(pos.begin(), pos.end(), ctx - num);
      std::vector<float> q(static_cast<size_t>(num) * nkv * group * hd), out(q.size());
      for (auto& x : q) x = u(rng);
      cpu::AttentionTile at;
      at.k = k.data();
      at.v = v.data();
      at.row = row;
      at.head_dim = hd;
      at.block_size = bs;
      at.group = group;
      at.block_table = table.data();
      at.scale = 1.0f / std::sqrt(float(hd));
      at.q = q.data();
      at.ld_q = int64_t{nkv} * group * hd;
      at.positions = pos.data();
      at.num = num;
      at.out = out.data();
      at.ld_out = at.ld_q;
      auto time = [&](void (*fn)(const cpu::AttentionTile&)) {
        const int reps = std::max(20, 200000 / ctx);
        fn(at);
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) fn(at);
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
      };
      const double slow = time(cpu::attention_tile_portable), fast = time(cpu::attention_tile);
      const double flops = 4.0 * num * group * hd * ctx;  // QK and PV, 2 flops per multiply-add
      std::printf("| %d | %d | %.1f | %.1f | %.2f | %.1f |\n", num, ctx, slow, fast, slow / fast, flops / fast * 1e-3);
    }
  }
  cold_decode(hd, group, nkv, bs, rng);
  return 0;
}
