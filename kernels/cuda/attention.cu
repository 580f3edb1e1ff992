// Causal paged attention over the f16 cache, for prefill, chunked prefill and decode alike.
// A block serves one query token and up to four query heads of one KV head (GQA: the KV
// rows are read once for the group). A token's keys are cut into fixed segments of
// kSegment positions; in a segment each warp takes 32 keys at a time, one key per lane
// (the lane forms the dot products with the group's queries; K rows staged in shared
// memory by coalesced loads for heads up to 128 wide), updates an online softmax
// with two warp reductions per 32 keys, then accumulates V with the weights broadcast
// lane to lane. The warps' partials are merged in warp order into the segment's partial
// (max, sum, unnormalised output), and segments are merged in order by one formula.
// Small batches (decode) give each segment its own block and merge in a second kernel
// (split-KV, flash-decoding); large batches loop over the segments inside one block. Both
// paths do the same arithmetic in the same order, so a token's output never depends on its
// batch (batch invariance): the arithmetic both paths share is written with explicit
// rounding intrinsics, so the compiler cannot contract it differently per kernel. Queries
// are rounded to f16 like the keys they meet, as the CPU reference (and GGML) does; the
// softmax weights are not rounded to f16 as the CPU does (one pass, online softmax).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quantize_q8.cuh"

namespace troupe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kSegment = kAttentionSegment;
constexpr int kGroup = 4;  // query heads per block

struct Args {
  DeviceStep step;
  const float* q;
  int64_t ld_q;
  int num_heads, num_kv_heads, block_size;
  float scale;
  const __half* kc;
  const __half* vc;
  bool skip_tc_tiles;  // tokens of tiles attention_tc takes are left to it
  uint8_t* xq;         // non-null: the output quantized too (quantize_q8.cuh), a row per token
  Q8Numerics nq;
  HalfOut xh;  // p non-null: the output in half too, for cuBLAS (ops.h)
};

// Stores element d of head h of token t's output, and quantizes it with the 31 other
// values of its 32-value block when asked: the caller's warp holds one whole block, lane j
// element j (head sizes are multiples of 32), and calls this uniformly. Or stores it in half too.
__device__ __forceinline__ void emit_out(const Args& a, float* out, int t, int h, int hd, int d, float v) {
  const int64_t dim = static_cast<int64_t>(a.num_heads) * hd, j = static_cast<int64_t>(h) * hd + d;
  out[t * dim + j] = v;
  if (a.xq) quantize_q8_block(v, threadIdx.x & 31, j / 32, dim / 32, a.xq + t * q8_row_bytes(dim), a.nq);
  if (a.xh.p) store_half(a.xh, t * dim + j, v);
}

// Head sizes up to 128 stage each warp's 32 K rows in shared memory with coalesced loads
// (two whole rows per load instruction) before a lane reads its own key's row there: read
// straight from global memory, one row per lane, every 16-byte load touched 32 cache lines.
// Rows are padded by 8 halves, so the lanes' 16-byte reads hit distinct banks. Wider heads
// read K directly (their staging would not fit the 48 KB of static shared memory).
template <int HD>
constexpr bool kStageK = HD <= 128;
template <int HD>
struct alignas(16) Shared {  // (16: the staged rows take uint4 stores and loads)
  float q[kGroup][HD];
  float wm[kWarps][kGroup], wl[kWarps][kGroup];
  float wacc[kWarps][kGroup][HD];
  float m[kGroup], l[kGroup];
  float acc[kGroup][HD];
  __half k[kStageK<HD> ? kWarps : 1][kStageK<HD> ? 32 : 1][kStageK<HD> ? HD + 8 : 8];
};
static_assert(sizeof(Shared<128>) <= 48 * 1024 && sizeof(Shared<256>) <= 48 * 1024, "static shared memory");

// The block's heads: kv head `kvh`, query heads h0 .. h0 + gn - 1.
struct Heads {
  int kvh, h0, gn;
};
__device__ __forceinline__ Heads block_heads(const Args& a, int y) {
  const int group = a.num_heads / a.num_kv_heads;
  const int chunks = (group + kGroup - 1) / kGroup;
  Heads hs;
  hs.kvh = y / chunks;
  const int g0 = (y % chunks) * kGroup;
  hs.h0 = hs.kvh * group + g0;
  hs.gn = min(kGroup, group - g0);
  return hs;
}

template <int DPL>
__device__ void load_queries(const Args& a, int t, const Heads& hs, Shared<DPL * 32>& s) {
  constexpr int hd = DPL * 32;
  for (int i = threadIdx.x; i < kGroup * hd; i += kThreads) {
    const int g = i / hd, d = i % hd;
    s.q[g][d] = g < hs.gn ? __half2float(__float2half_rn(a.q[t * a.ld_q + (hs.h0 + g) * hd + d])) : 0.f;
  }
  __syncthreads();
}

constexpr int kVAhead = 8;  // V rows loaded ahead of their accumulation, per lane

// A lane's DPL contiguous f16 values of a V row, in one load where the width allows (the
// row offset lane * DPL halves is then aligned to the load).
template <int DPL>
__device__ __forceinline__ void load_v(const __half* p, float* out) {
  if constexpr (DPL == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  } else if constexpr (DPL == 2 || DPL == 6 || DPL == 8) {
#pragma unroll
    for (int i = 0; i < DPL; i += 2) {
      const float2 f = __half22float2(reinterpret_cast<const __half2*>(p)[i / 2]);
      out[i] = f.x;
      out[i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < DPL; ++i) out[i] = __half2float(p[i]);
  }
}

// The partial of keys [k0, k1) for token t and the block's heads, left in s.m, s.l, s.acc.
// (kStage: K through shared memory; the same arithmetic, so the same bits, as without.)
template <int DPL, bool kStage>
__device__ void segment_partial(const Args& a, int t, const Heads& hs, int k0, int k1, Shared<DPL * 32>& s) {
  constexpr int hd = DPL * 32;
  static_assert(!kStage || kStageK<hd>, "staging needs the staged rows in Shared");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t* bt = a.step.block_tables + static_cast<int64_t>(a.step.token_seq[t]) * a.step.max_blocks_per_seq;
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * hd;
  float m[kGroup], l[kGroup], acc[kGroup][DPL];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[g][i] = 0.f;
  }
  for (int base = k0 + warp * 32; base < k1; base += kWarps * 32) {
    const int p = base + lane;
    const bool valid = p < k1;
    const int64_t slot = valid ? static_cast<int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size : 0;
    float dot[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) dot[g] = 0.f;
    if constexpr (kStage) {
      // The 32 rows' 16-byte pieces in order, one per lane and load: hd / 8 lanes a row.
      __syncwarp();  // (the previous keys' rows have been read)
#pragma unroll
      for (int piece = 0; piece < hd / 8; ++piece) {
        const int i = lane + 32 * piece, j = i / (hd / 8), c = i % (hd / 8);
        const int64_t sj = __shfl_sync(0xffffffffu, slot, j);
        if (base + j < k1)
          reinterpret_cast<uint4*>(&s.k[warp][j][0])[c] =
              reinterpret_cast<const uint4*>(a.kc + sj * row + hs.kvh * hd)[c];
      }
      __syncwarp();
    }
    if (valid) {
      const uint4* kp;
      if constexpr (kStage)
        kp = reinterpret_cast<const uint4*>(&s.k[warp][lane][0]);
      else
        kp = reinterpret_cast<const uint4*>(a.kc + slot * row + hs.kvh * hd);
#pragma unroll
      for (int c = 0; c < hd / 8; ++c) {
        const uint4 raw = kp[c];
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        float kv[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
          kv[2 * j] = f.x;
          kv[2 * j + 1] = f.y;
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g)
#pragma unroll
          for (int j = 0; j < 8; ++j) dot[g] = __fmaf_rn(s.q[g][c * 8 + j], kv[j], dot[g]);
      }
    }
    float pw[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float sc = valid ? __fmul_rn(dot[g], a.scale) : -INFINITY;
      const float mx = warp_max(sc);  // finite: lane 0's key is valid
      const float mn = fmaxf(m[g], mx);
      const float corr = expf(m[g] - mn);
      pw[g] = valid ? expf(sc - mn) : 0.f;
      l[g] = __fmaf_rn(l[g], corr, warp_sum(pw[g]));
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[g][i] = __fmul_rn(acc[g][i], corr);
      m[g] = mn;
    }
    // V rows of keys j0 .. j0 + kVAhead - 1 are loaded before any is accumulated (several
    // loads in flight per lane instead of one), then accumulated in key order as before:
    // the same arithmetic in the same order.
    const int count = min(32, k1 - base);
    for (int j0 = 0; j0 < count; j0 += kVAhead) {
      float vv[kVAhead][DPL];
#pragma unroll
      for (int jj = 0; jj < kVAhead; ++jj) {
        const int j = j0 + jj;  // < 32: j0 is a multiple of kVAhead below count <= 32
        const int64_t sj = __shfl_sync(0xffffffffu, slot, j);
        if (j < count) load_v<DPL>(a.vc + sj * row + hs.kvh * hd + lane * DPL, vv[jj]);
      }
#pragma unroll
      for (int jj = 0; jj < kVAhead; ++jj) {
        const int j = j0 + jj;
        if (j >= count) break;
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          const float wj = __shfl_sync(0xffffffffu, pw[g], j);
#pragma unroll
          for (int i = 0; i < DPL; ++i) acc[g][i] = __fmaf_rn(wj, vv[jj][i], acc[g][i]);
        }
      }
    }
  }
  if (lane == 0)
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      s.wm[warp][g] = m[g];
      s.wl[warp][g] = l[g];
    }
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int i = 0; i < DPL; ++i) s.wacc[warp][g][lane * DPL + i] = acc[g][i];
  __syncthreads();
  for (int i = threadIdx.x; i < kGroup * hd; i += kThreads) {
    const int g = i / hd, d = i % hd;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s.wm[w][g]);
    float L = 0.f, v = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = s.wl[w][g] > 0.f ? expf(s.wm[w][g] - M) : 0.f;
      L = __fmaf_rn(s.wl[w][g], f, L);
      v = __fmaf_rn(s.wacc[w][g][d], f, v);
    }
    s.acc[g][d] = v;
    if (d == 0) {
      s.m[g] = M;
      s.l[g] = L;
    }
  }
  __syncthreads();
}

template <int DPL, bool kStage = kStageK<DPL * 32>>
__global__ void __launch_bounds__(kThreads) attention_loop_kernel(Args a, float* __restrict__ out) {
  constexpr int hd = DPL * 32;
  constexpr int K = kGroup * hd / kThreads;
  __shared__ Shared<hd> s;
  const int t = blockIdx.x;
  if (a.skip_tc_tiles && tc_tile_uniform(a.step.token_seq, a.step.num_tokens, t / 16)) return;  // the whole block
  const Heads hs = block_heads(a, blockIdx.y);
  const int len = a.step.positions[t] + 1;
  load_queries<DPL>(a, t, hs, s);
  float m[K], l[K], acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.f;
    acc[k] = 0.f;
  }
  // Running merge of partials in segment order (merge_step, as attention_combine_kernel);
  // thread i keeps the (head, dim) pairs i, i + 128, ... of the block's kGroup x HD outputs.
  for (int k0 = 0; k0 < len; k0 += kSegment) {
    segment_partial<DPL, kStage>(a, t, hs, k0, min(k0 + kSegment, len), s);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = threadIdx.x + k * kThreads, g = i / hd, d = i % hd;
      merge_step(m[k], l[k], acc[k], s.m[g], s.l[g], s.acc[g][d]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    // (a warp's 32 consecutive i are one head's 32-value block: g is uniform in it)
    const int i = threadIdx.x + k * kThreads, g = i / hd, d = i % hd;
    if (g < hs.gn) emit_out(a, out, t, hs.h0 + g, hd, d, __fdiv_rn(acc[k], l[k]));
  }
}

// Split-KV, pass 1: one block per (token, head group, segment) writes its partials.
// partials: [num_tokens, num_heads, max_segments, hd + 2]
template <int DPL, bool kStage = kStageK<DPL * 32>>
__global__ void __launch_bounds__(kThreads)
    attention_split_kernel(Args a, int max_segments, float* __restrict__ partials) {
  constexpr int hd = DPL * 32;
  __shared__ Shared<hd> s;
  const int t = blockIdx.x, seg = blockIdx.z;
  const Heads hs = block_heads(a, blockIdx.y);
  const int len = a.step.positions[t] + 1;
  const int k0 = seg * kSegment;
  if (k0 >= len) return;
  load_queries<DPL>(a, t, hs, s);
  segment_partial<DPL, kStage>(a, t, hs, k0, min(k0 + kSegment, len), s);
  for (int i = threadIdx.x; i < hs.gn * hd; i += kThreads) {
    const int g = i / hd, d = i % hd;
    float* p = partials + ((static_cast<int64_t>(t) * a.num_heads + hs.h0 + g) * max_segments + seg) * (hd + 2);
    p[d] = s.acc[g][d];
    if (d == 0) {
      p[hd] = s.m[g];
      p[hd + 1] = s.l[g];
    }
  }
}

// Split-KV, pass 2: one block per (token, head) merges the segments in order.
template <int DPL>
__global__ void __launch_bounds__(kThreads)
    attention_combine_kernel(Args a, int max_segments, const float* __restrict__ partials, float* __restrict__ out) {
  constexpr int hd = DPL * 32;
  const int t = blockIdx.x, h = blockIdx.y;
  const int len = a.step.positions[t] + 1;
  const int num_segments = (len + kSegment - 1) / kSegment;
  const float* base = partials + (static_cast<int64_t>(t) * a.num_heads + h) * max_segments * (hd + 2);
  for (int d = threadIdx.x; d < hd; d += kThreads) {
    float m = -INFINITY, l = 0.f, acc = 0.f;
    for (int seg = 0; seg < num_segments; ++seg) {
      const float* p = base + static_cast<int64_t>(seg) * (hd + 2);
      merge_step(m, l, acc, p[hd], p[hd + 1], p[d]);
    }
    emit_out(a, out, t, h, hd, d, __fdiv_rn(acc, l));  // (warps past hd skip the loop whole)
  }
}

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
template <int DPL, bool kStage>
cudaError_t launch_staged(const Args& a, int num_tokens, float* out, float* partials, int max_segments,
                          cudaStream_t stream) {
  const unsigned ys = gqa_head_blocks(a.num_heads, a.num_kv_heads, kGroup);
  if (partials) {
    attention_split_kernel<DPL, kStage>
        <<<dim3(num_tokens, ys, max_segments), kThreads, 0, stream>>>(a, max_segments, partials);
    attention_combine_kernel<DPL>
        <<<dim3(num_tokens, a.num_heads), kThreads, 0, stream>>>(a, max_segments, partials, out);
  } else {
    attention_loop_kernel<DPL, kStage><<<dim3(num_tokens, ys), kThreads, 0, stream>>>(a, out);
  }
  return cudaGetLastError();
}
template <int DPL>
cudaError_t launch(const Args& a, int num_tokens, float* out, float* partials, int max_segments, bool direct_k,
                   cudaStream_t stream) {
  if constexpr (kStageK<DPL * 32>) {
    if (!direct_k) return launch_staged<DPL, true>(a, num_tokens, out, partials, max_segments, stream);
  }
  return launch_staged<DPL, false>(a, num_tokens, out, partials, max_segments, stream);
}

#endif

}  // namespace

#ifndef TROUPE_CUDA_EMULATION
int64_t attention_loop_blocks(int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads) {
  if (num_kv_heads <= 0) return 0;
  return int64_t{num_tokens} * gqa_head_blocks(num_heads, num_kv_heads, kGroup);
}

namespace {
// f.template operator()<DPL>() for head_dim = 32 DPL; cudaErrorInvalidValue for other widths.
template <typename F>
cudaError_t with_dpl(int32_t head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      return f.template operator()<1>();
    case 64:
      return f.template operator()<2>();
    case 96:
      return f.template operator()<3>();
    case 128:
      return f.template operator()<4>();
    case 160:
      return f.template operator()<5>();
    case 192:
      return f.template operator()<6>();
    case 256:
      return f.template operator()<8>();
    default:
      return cudaErrorInvalidValue;
  }
}
}  // namespace

cudaError_t attention_combine(const DeviceStep& step, int32_t num_heads, int32_t head_dim, const float* partials,
                              float* out, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  const Args a{step, nullptr, 0, num_heads, 1, 0, 0.0f, nullptr, nullptr, false, nullptr, {}, {}};
  const int segs = attention_segments(step.max_context);
  const dim3 grid(static_cast<unsigned>(step.num_tokens), static_cast<unsigned>(num_heads));
  return with_dpl(head_dim, [&]<int DPL>() {
    attention_combine_kernel<DPL><<<grid, kThreads, 0, stream>>>(a, segs, partials, out);
    return cudaGetLastError();
  });
}

cudaError_t attention(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                      int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, float* partials, cudaStream_t stream, bool skip_tc_tiles,
                      bool direct_k, uint8_t* xq, Q8Numerics nq, HalfOut xh) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  if (skip_tc_tiles && partials) return cudaErrorInvalidValue;  // only the looped path skips
  if (xq && (skip_tc_tiles || head_dim % 32 != 0)) return cudaErrorInvalidValue;
  const Args a{step,
               q,
               ld_q,
               num_heads,
               num_kv_heads,
               block_size,
               scale,
               reinterpret_cast<const __half*>(k_cache),
               reinterpret_cast<const __half*>(v_cache),
               skip_tc_tiles,
               xq,
               nq,
               xh};
  const int segs = attention_segments(step.max_context);
  return with_dpl(head_dim,
                  [&]<int DPL>() { return launch<DPL>(a, step.num_tokens, out, partials, segs, direct_k, stream); });
}

#endif

}  // namespace troupe::cuda
