// Microbenchmark of the CPU attention tile: the blocked AVX2 body (attention_tile) beside
// the one-key-at-a-time path it reproduces bit for bit (attention_tile_portable), for a
// decode query (1 token, 3 query heads per KV head, as SmolLM2) and prefill tiles (4
// or 8 tokens), over contexts of 128..2048 positions of a paged f16 cache, one thread.
// Usage: troupe_attention_bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/fp16.h"

using namespace troupe;

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
  std::printf("| queries | context | portable us/tile | blocked us/tile | speed-up | blocked GFLOP/s |\n|---:|---:|---:|---:|---:|---:|\n");
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
  return 0;
}
