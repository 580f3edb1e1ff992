// Causal paged attention over the f16 cache, for prefill, chunked prefill and decode alike.
// A token's keys are cut into fixed segments of kSegment positions; a block of four warps
// turns one segment into a partial (max, sum, unnormalised output), each warp running an
// online softmax over every fourth key, merged in warp order. Partials are merged in
// segment order by one formula. Small batches (decode) give each segment its own block
// and merge in a second pass (split-KV / flash-decoding); large batches loop over the
// segments inside one block. Both paths do the same arithmetic in the same order, so a
// token's output never depends on its batch (batch invariance). Queries are rounded to
// f16 like the keys they meet, as the CPU reference (and GGML) does.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kSegment = 256;

struct Args {
  DeviceStep step;
  const float* q;
  int64_t ld_q;
  int num_heads, num_kv_heads, block_size;
  float scale;
  const __half* kc;
  const __half* vc;
};

// Shared state of one block: per-warp partials, then the block's segment partial.
template <int HD>
struct Shared {
  float wm[kWarps], wl[kWarps];
  float wacc[kWarps][HD];
  float m, l;
  float acc[HD];
};

// The partial of keys [k0, k1) for query token t, head h, left in s.m, s.l, s.acc.
template <int DPL>
__device__ void segment_partial(const Args& a, int t, int h, int k0, int k1, Shared<DPL * 32>& s) {
  constexpr int hd = DPL * 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = h / (a.num_heads / a.num_kv_heads);
  const int32_t* bt = a.step.block_tables + static_cast<int64_t>(a.step.token_seq[t]) * a.step.max_blocks_per_seq;
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * hd;
  float qv[DPL], acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    qv[i] = __half2float(__float2half_rn(a.q[t * a.ld_q + h * hd + lane * DPL + i]));
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int p = k0 + warp; p < k1; p += kWarps) {
    const int64_t slot = static_cast<int64_t>(bt[p / a.block_size]) * a.block_size + p % a.block_size;
    const __half* kp = a.kc + slot * row + kvh * hd + lane * DPL;
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) d += qv[i] * __half2float(kp[i]);
    d = warp_sum(d) * a.scale;
    const float mn = fmaxf(m, d);
    const float corr = expf(m - mn), e = expf(d - mn);
    l = l * corr + e;
    const __half* vp = a.vc + slot * row + kvh * hd + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * corr + e * __half2float(vp[i]);
    m = mn;
  }
  if (lane == 0) {
    s.wm[warp] = m;
    s.wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) s.wacc[warp][lane * DPL + i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s.wm[w]);
  float f[kWarps], L = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s.wl[w] > 0.f ? expf(s.wm[w] - M) : 0.f;
    L += s.wl[w] * f[w];
  }
  for (int d = threadIdx.x; d < hd; d += kWarps * 32) {
    float v = 0.f;
    for (int w = 0; w < kWarps; ++w) v += s.wacc[w][d] * f[w];
    s.acc[d] = v;
  }
  if (threadIdx.x == 0) {
    s.m = M;
    s.l = L;
  }
  __syncthreads();
}

// Running merge of partials in segment order; each thread keeps dims threadIdx.x + 128 k.
template <int HD>
struct Merge {
  static constexpr int K = (HD + kWarps * 32 - 1) / (kWarps * 32);
  float m = -INFINITY, l = 0.f;
  float acc[K] = {};
  __device__ __forceinline__ void add(float pm, float pl, const float* pacc) {
    const float mn = fmaxf(m, pm);
    const float fr = expf(m - mn), fp = expf(pm - mn);
    l = l * fr + pl * fp;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int d = threadIdx.x + k * kWarps * 32;
      if (d < HD) acc[k] = acc[k] * fr + pacc[d] * fp;
    }
    m = mn;
  }
  __device__ __forceinline__ void store(float* o) const {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int d = threadIdx.x + k * kWarps * 32;
      if (d < HD) o[d] = acc[k] / l;
    }
  }
};

// One block per (token, head): every segment in turn, merged as it goes.
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32) attention_loop_kernel(Args a, float* __restrict__ out) {
  constexpr int hd = DPL * 32;
  __shared__ Shared<hd> s;
  const int t = blockIdx.x, h = blockIdx.y;
  const int len = a.step.positions[t] + 1;
  Merge<hd> mg;
  for (int k0 = 0; k0 < len; k0 += kSegment) {
    segment_partial<DPL>(a, t, h, k0, min(k0 + kSegment, len), s);
    mg.add(s.m, s.l, s.acc);
    __syncthreads();
  }
  mg.store(out + (static_cast<int64_t>(t) * a.num_heads + h) * hd);
}

// Split-KV, pass 1: one block per (token, head, segment) writes its partial.
// partials: [num_tokens, num_heads, max_segments, hd + 2]
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32) attention_split_kernel(Args a, int max_segments, float* __restrict__ partials) {
  constexpr int hd = DPL * 32;
  __shared__ Shared<hd> s;
  const int t = blockIdx.x, h = blockIdx.y, seg = blockIdx.z;
  const int len = a.step.positions[t] + 1;
  const int k0 = seg * kSegment;
  if (k0 >= len) return;
  segment_partial<DPL>(a, t, h, k0, min(k0 + kSegment, len), s);
  float* p = partials + ((static_cast<int64_t>(t) * a.num_heads + h) * max_segments + seg) * (hd + 2);
  for (int d = threadIdx.x; d < hd; d += kWarps * 32) p[d] = s.acc[d];
  if (threadIdx.x == 0) {
    p[hd] = s.m;
    p[hd + 1] = s.l;
  }
}

// Split-KV, pass 2: merges a token's segments in order, exactly as the loop kernel does.
template <int DPL>
__global__ void __launch_bounds__(kWarps * 32)
    attention_combine_kernel(Args a, int max_segments, const float* __restrict__ partials, float* __restrict__ out) {
  constexpr int hd = DPL * 32;
  const int t = blockIdx.x, h = blockIdx.y;
  const int len = a.step.positions[t] + 1;
  const int num_segments = (len + kSegment - 1) / kSegment;
  Merge<hd> mg;
  const float* base = partials + (static_cast<int64_t>(t) * a.num_heads + h) * max_segments * (hd + 2);
  for (int seg = 0; seg < num_segments; ++seg) {
    const float* p = base + static_cast<int64_t>(seg) * (hd + 2);
    mg.add(p[hd], p[hd + 1], p);
  }
  mg.store(out + (static_cast<int64_t>(t) * a.num_heads + h) * hd);
}

template <int DPL>
cudaError_t launch(const Args& a, int num_tokens, float* out, float* partials, int max_segments, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(a.num_heads));
  if (partials) {
    attention_split_kernel<DPL><<<dim3(grid.x, grid.y, static_cast<unsigned>(max_segments)), kWarps * 32, 0, stream>>>(
        a, max_segments, partials);
    attention_combine_kernel<DPL><<<grid, kWarps * 32, 0, stream>>>(a, max_segments, partials, out);
  } else {
    attention_loop_kernel<DPL><<<grid, kWarps * 32, 0, stream>>>(a, out);
  }
  return cudaGetLastError();
}

}  // namespace

int attention_segments(int32_t max_context) { return (max_context + kSegment - 1) / kSegment; }

cudaError_t attention(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                      int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, float* partials, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  const Args a{step, q, ld_q, num_heads, num_kv_heads, block_size, scale, reinterpret_cast<const __half*>(k_cache),
               reinterpret_cast<const __half*>(v_cache)};
  const int segs = attention_segments(step.max_context);
  switch (head_dim) {
    case 32: return launch<1>(a, step.num_tokens, out, partials, segs, stream);
    case 64: return launch<2>(a, step.num_tokens, out, partials, segs, stream);
    case 96: return launch<3>(a, step.num_tokens, out, partials, segs, stream);
    case 128: return launch<4>(a, step.num_tokens, out, partials, segs, stream);
    case 160: return launch<5>(a, step.num_tokens, out, partials, segs, stream);
    case 192: return launch<6>(a, step.num_tokens, out, partials, segs, stream);
    case 256: return launch<8>(a, step.num_tokens, out, partials, segs, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace troupe::cuda
