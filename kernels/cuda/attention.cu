// Causal paged attention over the f16 cache, for prefill, chunked prefill and decode alike:
// one block per (query token, head), four warps splitting the token's context, each with
// an online softmax; the warps' partial results are merged in shared memory. Queries are
// rounded to f16 like the keys they meet, as the CPU reference (and GGML) does.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

constexpr int kWarps = 4;

template <int DPL>  // head dims per lane: head_dim / 32
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(DeviceStep step, const float* __restrict__ q, int64_t ld_q, int num_heads, int num_kv_heads,
                     int block_size, float scale, const __half* __restrict__ kc, const __half* __restrict__ vc,
                     float* __restrict__ out) {
  constexpr int hd = DPL * 32;
  const int t = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = h / (num_heads / num_kv_heads);
  const int seq = step.token_seq[t];
  const int pos = step.positions[t];
  const int32_t* bt = step.block_tables + static_cast<int64_t>(seq) * step.max_blocks_per_seq;
  const int64_t row = static_cast<int64_t>(num_kv_heads) * hd;
  float qv[DPL], acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    qv[i] = __half2float(__float2half_rn(q[t * ld_q + h * hd + lane * DPL + i]));
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int p = warp; p <= pos; p += kWarps) {
    const int64_t slot = static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
    const __half* kp = kc + slot * row + kvh * hd + lane * DPL;
    float d = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) d += qv[i] * __half2float(kp[i]);
    d = warp_sum(d) * scale;
    const float mn = fmaxf(m, d);
    const float corr = expf(m - mn), e = expf(d - mn);
    l = l * corr + e;
    const __half* vp = vc + slot * row + kvh * hd + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * corr + e * __half2float(vp[i]);
    m = mn;
  }
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][hd];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) sacc[warp][lane * DPL + i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f, f[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    f[w] = sl[w] > 0.f ? expf(sm[w] - M) : 0.f;
    L += sl[w] * f[w];
  }
  float* o = out + (static_cast<int64_t>(t) * num_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += kWarps * 32) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += sacc[w][d] * f[w];
    o[d] = s / L;
  }
}

}  // namespace

cudaError_t attention(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                      int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                      const uint16_t* v_cache, float* out, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(step.num_tokens), static_cast<unsigned>(num_heads));
  const auto* kc = reinterpret_cast<const __half*>(k_cache);
  const auto* vc = reinterpret_cast<const __half*>(v_cache);
  switch (head_dim) {
#define TROUPE_ATTN_CASE(D)                                                                                           \
  case 32 * D:                                                                                                        \
    attention_kernel<D><<<grid, kWarps * 32, 0, stream>>>(step, q, ld_q, num_heads, num_kv_heads, block_size, scale, \
                                                          kc, vc, out);                                               \
    break;
    TROUPE_ATTN_CASE(1)
    TROUPE_ATTN_CASE(2)
    TROUPE_ATTN_CASE(3)
    TROUPE_ATTN_CASE(4)
    TROUPE_ATTN_CASE(5)
    TROUPE_ATTN_CASE(6)
    TROUPE_ATTN_CASE(8)
#undef TROUPE_ATTN_CASE
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace troupe::cuda
