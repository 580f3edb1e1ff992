// Prefill attention on tensor cores, flash-attention-2 style, for the non-batch-invariant
// mode (--cuda-cublas). It takes attention_tc's tiles (16 consecutive step tokens of one
// sequence; the others stay with attention.cu's per-token kernel, which skips these) and
// its GQA grouping (a block of four warps, warp w query head w of a group of up to four
// sharing one KV head, so each K/V tile is loaded once for the group), but keeps everything
// between the two products in registers, where attention_tc goes through shared memory:
//   - S = Q K^T and O += P V with mma.sync m16n8k16 (f16 inputs, f32 accumulators);
//   - the online softmax works on S's accumulator fragments (a row's values spread over
//     the four lanes of a quad: two shuffles for its maximum, the sum kept per lane and
//     reduced once at the end), in base 2 with the scale folded into one multiply;
//   - P's f16 A fragments are S's registers rounded and paired (m16n8's accumulator layout
//     is m16n8k16's A layout, two key n-tiles a k-step), never stored;
//   - Q's, K's and V^T's fragments come from shared memory by ldmatrix (V transposed by
//     its .trans form); rows padded by 8 halves, so ldmatrix's eight rows hit distinct banks;
//   - K/V tiles of 64 keys are double-buffered with cp.async: the next tile's loads are in
//     flight while this one is computed (keys past the tile's last position zero-filled).
// Head sizes 32-128 (O is HD / 2 floats a lane); wider heads take attention_tc.
// Register fragments follow PTX's documented layouts; tests/kernels/cuda_emulation.h
// emulates the three instructions with those layouts, and tests/kernels/attention_emu_test.cpp
// runs this source on the CPU (cp.async's copies made only when waited for).
#include <atomic>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

namespace {

constexpr int kMmaRows = 16;                             // query tokens per tile (attention_tc's tiles)
constexpr int kMmaWarps = 4;                             // query heads per block
constexpr int kMmaKeys = 64;                             // keys per step
constexpr int kMmaStages = 2;                            // K/V tiles in shared memory (one computed, one loading)
constexpr int kSegSteps = kAttentionSegment / kMmaKeys;  // key steps a segment
static_assert(kAttentionSegment % kMmaKeys == 0, "a segment is whole key steps");

// What the kernel does with its tile (one template each), as attention_tc's modes:
//   kMmaUniform: tiles of 16 consecutive step tokens all of one sequence (others are left
//                to attention.cu), every key in one online softmax (--cuda-cublas);
//   kMmaLooped:  the tiles of step.tiles, keys in kAttentionSegment segments, each
//                segment's partial merged in order (merge_step) in the block (batch-invariant);
//   kMmaSplit:   as kMmaLooped, one segment (blockIdx.z) a block, its partials written for
//                attention_combine (the same bits).
enum MmaMode { kMmaUniform, kMmaLooped, kMmaSplit };

template <int HD, int kMode>
struct alignas(16) MmaShared {        // (16: cp.async and ldmatrix move 16-byte pieces)
  static constexpr int kLd = HD + 8;  // halves a row
  static constexpr bool kMerged = kMode == kMmaLooped;
  __half k[kMmaStages][kMmaKeys][kLd];  // (k[1] first holds the block's queries: 64 rows)
  __half v[kMmaStages][kMmaKeys][kLd];
  int pos[kMmaRows];
  // kMmaLooped: the merged segments' unnormalised output, a lane's O fragment elements
  // (its registers hold the segment being computed).
  float acc[kMerged ? kMmaWarps : 1][kMerged ? HD / 2 : 1][32];
};
static_assert(kMmaWarps * kMmaRows == kMmaKeys, "the queries are staged in one K stage");

struct MmaArgs {
  DeviceStep st;
  const float* q;
  int64_t ld_q;
  int num_heads, num_kv_heads, block_size;
  float scale;
  const __half* kc;
  const __half* vc;
  float* out;
  float* partials;  // kMmaSplit: [num_tokens, num_heads, max_segments, HD + 2]
  int max_segments;
  HalfOut xh;  // kMmaUniform, p non-null: the output in half too, for cuBLAS (ops.h)
};

// D += A B for a 16 x 16 f16 A (row) and a 16 x 8 f16 B (col), f32 D.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef TROUPE_CUDA_EMULATION
  cuda_emu::mma_f16_16x8x16(d, a, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8 x 8 f16 matrices from shared memory; this lane gives one row's address (lanes
// 8i .. 8i + 7: matrix i's rows).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* row) {
#ifdef TROUPE_CUDA_EMULATION
  cuda_emu::ldmatrix_x4(r, row, kTrans);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// 16 bytes global -> shared without passing through registers (zeros where !valid; src is
// then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#ifdef TROUPE_CUDA_EMULATION
  cuda_emu::cp_async16(dst, src, !valid);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef TROUPE_CUDA_EMULATION
  cuda_emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits for this thread's committed groups but the newest `kPending`.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef TROUPE_CUDA_EMULATION
  cuda_emu::cp_async_wait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Two weights rounded to f16 and paired as an A fragment register; their rounded values
// added to `sum` (the sum of what P V multiplies), in one order.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi, float& sum) {
  const __half2 h = __floats2half2_rn(lo, hi);
  const float2 f = __half22float2(h);
  sum = __fadd_rn(sum, __fadd_rn(f.x, f.y));
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

// A row's sum over the four lanes of its quad, in one order.
__device__ __forceinline__ float quad_sum(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

constexpr float kLn2 = 0.693147180559945309f;  // a base-2 maximum in the scores' own units

template <int HD, int kMode>
__global__ void __launch_bounds__(kMmaWarps * 32) attention_mma_kernel(MmaArgs a) {
  using S = MmaShared<HD, kMode>;
  constexpr int kLd = S::kLd, KT = kMmaKeys;
  constexpr int NT = KT / 8;   // S's n-tiles (8 keys each)
  constexpr int DT = HD / 8;   // O's n-tiles (8 columns each)
  constexpr int DK = HD / 16;  // Q K^T's k-steps
  static_assert(HD % 32 == 0 && HD <= 128, "ldmatrix_x4 pairs of O's n-tiles; O in registers");
#ifdef TROUPE_CUDA_EMULATION
  __shared__ S s_block;  // (a static: the emulation runs blocks one after another)
  S& s = s_block;
#else
  extern __shared__ __align__(128) unsigned char mma_smem[];
  S& s = *reinterpret_cast<S*>(mma_smem);
#endif
  const DeviceStep& st = a.st;
  int t0, rows;
  if constexpr (kMode == kMmaUniform) {
    if (!tc_tile_uniform(st.token_seq, st.num_tokens, blockIdx.x))
      return;  // the whole block: attention.cu's kernel does it
    t0 = blockIdx.x * kMmaRows;
    rows = min(kMmaRows, st.num_tokens - t0);
  } else {
    t0 = st.tiles[blockIdx.x];
    rows = min(st.tiles[blockIdx.x + 1] - t0, kMmaRows);  // (0 past the last tile: the grid has a block per token)
    if (rows <= 0) return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane & 3;
  const int group = a.num_heads / a.num_kv_heads, chunks = (group + kMmaWarps - 1) / kMmaWarps;
  const int kvh = blockIdx.y / chunks, g0 = (blockIdx.y % chunks) * kMmaWarps;
  const int gn = min(kMmaWarps, group - g0);
  const bool active = warp < gn;  // (spare warps load tiles, compute nothing, write nothing)
  const int h = kvh * group + g0 + (active ? warp : gn - 1);
  const int32_t* bt = st.block_tables + static_cast<int64_t>(st.token_seq[t0]) * st.max_blocks_per_seq;

  // This warp's queries, rounded to f16 (rows past the tile zero), through k[1] into A
  // fragments; the rows' positions (-1 past the tile).
  __half* qs = &s.k[1][warp * kMmaRows][0];
  for (int i = lane; i < kMmaRows * HD / 2; i += 32) {
    const int r = i / (HD / 2), d = 2 * (i % (HD / 2));
    float x0 = 0.0f, x1 = 0.0f;
    if (r < rows) {
      const float* src = a.q + static_cast<int64_t>(t0 + r) * a.ld_q + int64_t{h} * HD + d;
      x0 = src[0];
      x1 = src[1];
    }
    *reinterpret_cast<__half2*>(qs + r * kLd + d) = __floats2half2_rn(x0, x1);
  }
  if (threadIdx.x < kMmaRows)
    s.pos[threadIdx.x] = static_cast<int>(threadIdx.x) < rows ? st.positions[t0 + threadIdx.x] : -1;
  if constexpr (S::kMerged)
    for (int i = 0; i < HD / 2; ++i) s.acc[warp][i][lane] = 0.0f;
  __syncthreads();
  uint32_t qf[DK][4];
#pragma unroll
  for (int c = 0; c < DK; ++c) ldmatrix_x4<false>(qf[c], qs + (lane & 15) * kLd + c * 16 + (lane >> 4) * 8);
  // This lane's rows of S and O: lane / 4 and lane / 4 + 8.
  const int r0 = lane >> 2, r1 = r0 + 8;
  const int pos0 = s.pos[r0], pos1 = s.pos[r1];
  int last = -1;  // the tile's keys: 0 .. last
  for (int r = 0; r < kMmaRows; ++r) last = max(last, s.pos[r]);
  __syncthreads();                     // (every warp has its queries before k[1] is loaded)
  if (last < 0) return;                // (no keys: not a valid step; the whole block)
  int first = 0, end = last / KT + 1;  // the key steps this block takes: [first, end)
  if constexpr (kMode == kMmaSplit) {
    first = static_cast<int>(blockIdx.z) * kSegSteps;
    if (first >= end) return;  // (the whole block)
    end = min(end, first + kSegSteps);
  }

  const int64_t row = int64_t{a.num_kv_heads} * HD;
  auto load = [&](int step, int stage) {  // keys of `step` into `stage`, one cp.async group
    for (int i = threadIdx.x; i < KT * (HD / 8); i += kMmaWarps * 32) {
      const int j = i / (HD / 8), c = i % (HD / 8), p = step * KT + j;
      const bool valid = p <= last;
      int64_t off = 0;
      if (valid)
        off = (static_cast<int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size) * row + int64_t{kvh} * HD +
              c * 8;
      cp_async16(&s.k[stage][j][c * 8], a.kc + off, valid);
      cp_async16(&s.v[stage][j][c * 8], a.vc + off, valid);
    }
    cp_async_commit();
  };

  // The online softmax's state (kMmaUniform: over every key; otherwise over the segment).
  float o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // running max (base 2) and this lane's part of the sum
  float mm0 = -INFINITY, mm1 = -INFINITY, ml0 = 0.0f, ml1 = 0.0f;  // kMmaLooped: the merged segments' max and sum
  const float scale2 = __fmul_rn(a.scale, 1.4426950408889634f);    // scores in base 2: exp(x) = 2^(x log2 e)
  load(first, first & 1);
  for (int it = first; it < end; ++it) {
    if (it + 1 < end)
      load(it + 1, (it + 1) & 1);
    else
      cp_async_commit();  // (an empty group: the wait below is the same every step)
    cp_async_wait<1>();   // this step's tile has landed (this thread's part) ...
    __syncthreads();      // ... and every thread's
    if (active) {
      const int stage = it & 1, k0 = it * KT;
      // S = Q K^T: K's rows are B's columns; one ldmatrix gives two n-tiles' fragments.
      float sc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int c = 0; c < DK; ++c)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
          uint32_t b[4];
          ldmatrix_x4<false>(b, &s.k[stage][n * 8 + (lane & 7) + ((lane >> 4) << 3)][c * 16 + ((lane >> 3) & 1) * 8]);
          mma_16816(sc[n], qf[c], b[0], b[1]);
          mma_16816(sc[n + 1], qf[c], b[2], b[3]);
        }
      // The causal mask (keys past a row's position) and the rows' new maxima.
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * quad + (e & 1);
          const float x = key <= (e < 2 ? pos0 : pos1) ? __fmul_rn(sc[n][e], scale2) : -INFINITY;
          sc[n][e] = x;
          if (e < 2)
            mx0 = fmaxf(mx0, x);
          else
            mx1 = fmaxf(mx1, x);
        }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // (a row without keys yet keeps -inf as its max: its weights are 0, not NaN; a row
      // whose keys all lie before this step keeps its max, so its correction is exactly 1)
      const float base0 = mx0 == -INFINITY ? 0.0f : mx0, base1 = mx1 == -INFINITY ? 0.0f : mx1;
      // (exactly 1 where the max is unchanged, without relying on exp2f(0))
      const float c0 = mx0 == m0 ? 1.0f : exp2f(__fsub_rn(m0, base0)),
                  c1 = mx1 == m1 ? 1.0f : exp2f(__fsub_rn(m1, base1));
      m0 = mx0;
      m1 = mx1;
      l0 = __fmul_rn(l0, c0);
      l1 = __fmul_rn(l1, c1);
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        o[n][0] = __fmul_rn(o[n][0], c0);
        o[n][1] = __fmul_rn(o[n][1], c0);
        o[n][2] = __fmul_rn(o[n][2], c1);
        o[n][3] = __fmul_rn(o[n][3], c1);
      }
      // P in f16, as A fragments: k-step kk is S's n-tiles 2 kk and 2 kk + 1.
      uint32_t pf[KT / 16][4];
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float* x = sc[2 * kk + hf];
          pf[kk][2 * hf] = pack_half2(exp2f(__fsub_rn(x[0], base0)), exp2f(__fsub_rn(x[1], base0)), l0);
          pf[kk][2 * hf + 1] = pack_half2(exp2f(__fsub_rn(x[2], base1)), exp2f(__fsub_rn(x[3], base1)), l1);
        }
        // O += P V: V's rows are B's rows (k = key), transposed by ldmatrix; one ldmatrix
        // gives two of O's n-tiles.
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk)
#pragma unroll
        for (int n = 0; n < DT; n += 2) {
          uint32_t b[4];
          ldmatrix_x4<true>(b, &s.v[stage][kk * 16 + (lane & 15)][n * 8 + (lane >> 4) * 8]);
          mma_16816(o[n], pf[kk], b[0], b[1]);
          mma_16816(o[n + 1], pf[kk], b[2], b[3]);
        }
      // kMmaLooped, a segment done: rows with keys in it merge its partial (m in the scores'
      // units, the quad's sum, O) in order, as attention_combine_kernel does, and the
      // softmax starts over.
      if constexpr (kMode == kMmaLooped) {
        if ((it + 1) % kSegSteps == 0 || it + 1 == end) {
          const int kb = (it / kSegSteps) * kAttentionSegment;
          const float pm0 = __fmul_rn(m0, kLn2), pm1 = __fmul_rn(m1, kLn2);
          const float pl0 = quad_sum(l0), pl1 = quad_sum(l1);
#pragma unroll
          for (int n = 0; n < DT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (e < 2 ? pos0 < kb : pos1 < kb) continue;
              float m = e < 2 ? mm0 : mm1, l = e < 2 ? ml0 : ml1;
              merge_step(m, l, s.acc[warp][n * 4 + e][lane], e < 2 ? pm0 : pm1, e < 2 ? pl0 : pl1, o[n][e]);
            }
          float unused = 0.0f;
          if (pos0 >= kb) merge_step(mm0, ml0, unused, pm0, pl0, 0.0f);
          if (pos1 >= kb) merge_step(mm1, ml1, unused, pm1, pl1, 0.0f);
#pragma unroll
          for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
          m0 = m1 = -INFINITY;
          l0 = l1 = 0.0f;
        }
      }
    }
    __syncthreads();  // (every warp is done with this stage before the next step loads it)
  }
  cp_async_wait<0>();  // (the last, empty group)
  if (!active) return;
  if constexpr (kMode == kMmaLooped) {
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      const int d = n * 8 + 2 * quad;
      if (r0 < rows) {
        float* p = a.out + (static_cast<int64_t>(t0 + r0) * a.num_heads + h) * HD + d;
        p[0] = __fdiv_rn(s.acc[warp][n * 4][lane], ml0);
        p[1] = __fdiv_rn(s.acc[warp][n * 4 + 1][lane], ml0);
      }
      if (r1 < rows) {
        float* p = a.out + (static_cast<int64_t>(t0 + r1) * a.num_heads + h) * HD + d;
        p[0] = __fdiv_rn(s.acc[warp][n * 4 + 2][lane], ml1);
        p[1] = __fdiv_rn(s.acc[warp][n * 4 + 3][lane], ml1);
      }
    }
    return;
  }
  const float sum0 = quad_sum(l0), sum1 = quad_sum(l1);
  if constexpr (kMode == kMmaSplit) {
    // Rows with keys in this segment: the partial as attention.cu's split kernel lays it out.
    const int kb = static_cast<int>(blockIdx.z) * kAttentionSegment;
    const float pm0 = __fmul_rn(m0, kLn2), pm1 = __fmul_rn(m1, kLn2);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = hf ? r1 : r0;
      if (r >= rows || (hf ? pos1 : pos0) < kb) continue;
      float* p =
          a.partials + ((static_cast<int64_t>(t0 + r) * a.num_heads + h) * a.max_segments + blockIdx.z) * (HD + 2);
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        p[n * 8 + 2 * quad] = o[n][2 * hf];
        p[n * 8 + 2 * quad + 1] = o[n][2 * hf + 1];
      }
      if (quad == 0) {
        p[HD] = hf ? pm1 : pm0;
        p[HD + 1] = hf ? sum1 : sum0;
      }
    }
    return;
  }
  const float inv0 = 1.0f / sum0, inv1 = 1.0f / sum1;
#pragma unroll
  for (int n = 0; n < DT; ++n) {
    const int d = n * 8 + 2 * quad;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if ((hf ? r1 : r0) >= rows) continue;
      const int64_t i = (static_cast<int64_t>(t0 + (hf ? r1 : r0)) * a.num_heads + h) * HD + d;
      const float v0 = o[n][2 * hf] * (hf ? inv1 : inv0), v1 = o[n][2 * hf + 1] * (hf ? inv1 : inv0);
      a.out[i] = v0;
      a.out[i + 1] = v1;
      if (a.xh.p) {
        store_half(a.xh, i, v0);
        store_half(a.xh, i + 1, v1);
      }
    }
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernel above on the CPU)
size_t attention_mma_shared_bytes(int32_t head_dim, bool invariant) {
  // (invariant: the looped mode's, larger than the split mode's, which it must cover: which
  // of the two runs is chosen step by step)
  switch (head_dim) {
    case 32:
      return invariant ? sizeof(MmaShared<32, kMmaLooped>) : sizeof(MmaShared<32, kMmaUniform>);
    case 64:
      return invariant ? sizeof(MmaShared<64, kMmaLooped>) : sizeof(MmaShared<64, kMmaUniform>);
    case 96:
      return invariant ? sizeof(MmaShared<96, kMmaLooped>) : sizeof(MmaShared<96, kMmaUniform>);
    case 128:
      return invariant ? sizeof(MmaShared<128, kMmaLooped>) : sizeof(MmaShared<128, kMmaUniform>);
    default:
      return 0;
  }
}

namespace {
template <int HD, int kMode>
cudaError_t launch_mma(const dim3& grid, const MmaArgs& a, cudaStream_t stream) {
  constexpr size_t bytes = sizeof(MmaShared<HD, kMode>);
  static std::atomic<uint64_t> opted{0};  // (per head size and mode)
  if (const cudaError_t e =
          opt_in_shared_memory(reinterpret_cast<const void*>(attention_mma_kernel<HD, kMode>), bytes, opted);
      e != cudaSuccess)
    return e;
  attention_mma_kernel<HD, kMode><<<grid, kMmaWarps * 32, bytes, stream>>>(a);
  return cudaGetLastError();
}

template <int kMode>
cudaError_t launch_mma_mode(const dim3& grid, const MmaArgs& a, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 32:
      return launch_mma<32, kMode>(grid, a, stream);
    case 64:
      return launch_mma<64, kMode>(grid, a, stream);
    case 96:
      return launch_mma<96, kMode>(grid, a, stream);
    case 128:
      return launch_mma<128, kMode>(grid, a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t attention_mma(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                          int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                          const uint16_t* v_cache, float* out, cudaStream_t stream, HalfOut xh) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  const MmaArgs a{step,
                  q,
                  ld_q,
                  num_heads,
                  num_kv_heads,
                  block_size,
                  scale,
                  reinterpret_cast<const __half*>(k_cache),
                  reinterpret_cast<const __half*>(v_cache),
                  out,
                  nullptr,
                  0,
                  xh};
  const dim3 grid(static_cast<unsigned>((step.num_tokens + kMmaRows - 1) / kMmaRows),
                  gqa_head_blocks(num_heads, num_kv_heads, kMmaWarps));
  return launch_mma_mode<kMmaUniform>(grid, a, head_dim, stream);
}

cudaError_t attention_mma_invariant(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads,
                                    int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
                                    const uint16_t* k_cache, const uint16_t* v_cache, float* out, float* partials,
                                    cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || !step.tiles ||
      attention_mma_shared_bytes(head_dim, true) == 0)
    return cudaErrorInvalidValue;
  const int segs = attention_segments(step.max_context);
  const MmaArgs a{step,
                  q,
                  ld_q,
                  num_heads,
                  num_kv_heads,
                  block_size,
                  scale,
                  reinterpret_cast<const __half*>(k_cache),
                  reinterpret_cast<const __half*>(v_cache),
                  out,
                  partials,
                  segs,
                  {}};
  // A block per token bounds the tiles (a tile holds at least one): those past the last
  // tile return at once. The grid thus depends on the step's shape alone.
  const unsigned tiles = static_cast<unsigned>(step.num_tokens),
                 ys = gqa_head_blocks(num_heads, num_kv_heads, kMmaWarps);
  if (!partials) return launch_mma_mode<kMmaLooped>(dim3(tiles, ys), a, head_dim, stream);
  if (const cudaError_t e =
          launch_mma_mode<kMmaSplit>(dim3(tiles, ys, static_cast<unsigned>(segs)), a, head_dim, stream);
      e != cudaSuccess)
    return e;
  return attention_combine(step, num_heads, head_dim, partials, out, stream);
}
#endif

}  // namespace troupe::cuda
