// Prefill attention on tensor cores (WMMA, f16 inputs, f32 accumulation), for the
// non-batch-invariant mode (--cuda-cublas): flash-attention style over the paged cache.
// A block is one warp and one query head; it takes a tile of 16 consecutive step tokens
// that belong to one sequence ("uniform" tiles: the others, at sequence boundaries, stay
// with attention.cu's per-token kernel, which skips the uniform ones). Per 16-key tile:
// S = Q K^T (tensor cores), then per row the online softmax (running max and sum, the
// output rescaled), P rounded to f16, and O += P V (tensor cores). Q, K, V, S, P and O live
// in shared memory between the steps, so no fragment's element layout is ever assumed.
// tests/kernels/attention_tc_emu_test.cpp runs this source on the CPU.
#include <cmath>

#ifndef TROUPE_CUDA_EMULATION
#include <mma.h>
#endif

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

namespace {

using namespace nvcuda;
constexpr int kT = 16;  // queries per tile, keys per step, WMMA's 16 x 16 x 16

template <int HD>
struct alignas(32) TcShared {  // (WMMA loads and stores need 32-byte alignment)
  __half q[kT][HD];
  __half k[kT][HD];
  __half v[kT][HD];
  float s[kT][kT];
  __half p[kT][kT];
  float o[kT][HD];
  float m[kT], l[kT], corr[kT];
  int pos[kT];
};

template <int HD>
__global__ void __launch_bounds__(32) attention_tc_kernel(DeviceStep st, const float* __restrict__ q, int64_t ld_q,
                                                         int num_heads, int num_kv_heads, int block_size, float scale,
                                                         const __half* __restrict__ kc, const __half* __restrict__ vc,
                                                         float* __restrict__ out) {
  __shared__ TcShared<HD> s;
  const int tile = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  if (!tc_tile_uniform(st.token_seq, st.num_tokens, tile)) return;  // the whole warp: attention.cu's kernel does it
  const int t0 = tile * kT;
  const int rows = min(kT, st.num_tokens - t0);
  const int kvh = h / (num_heads / num_kv_heads);
  const int64_t row = int64_t{num_kv_heads} * HD;
  const int32_t* bt = st.block_tables + static_cast<int64_t>(st.token_seq[t0]) * st.max_blocks_per_seq;
  // Queries (rounded to f16; rows past the step are zero), positions, running state.
  for (int i = lane; i < kT * HD; i += 32) {
    const int r = i / HD, d = i % HD;
    s.q[r][d] = __float2half_rn(r < rows ? q[(t0 + r) * ld_q + int64_t{h} * HD + d] : 0.0f);
    s.o[r][d] = 0.0f;
  }
  if (lane < kT) {
    s.pos[lane] = lane < rows ? st.positions[t0 + lane] : -1;
    s.m[lane] = -INFINITY;
    s.l[lane] = 0.0f;
  }
  __syncwarp();
  const int last = st.positions[t0 + rows - 1];  // the tile's keys: 0 .. last
  for (int k0 = 0; k0 <= last; k0 += kT) {
    // K and V rows of keys k0 .. k0 + 15 (zero past `last`).
    for (int i = lane; i < kT * (HD / 8); i += 32) {
      const int j = i / (HD / 8), c = i % (HD / 8), p = k0 + j;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (p <= last) {
        const int64_t slot = static_cast<int64_t>(bt[p / block_size]) * block_size + p % block_size;
        kv = reinterpret_cast<const uint4*>(kc + slot * row + int64_t{kvh} * HD)[c];
        vv = reinterpret_cast<const uint4*>(vc + slot * row + int64_t{kvh} * HD)[c];
      }
      reinterpret_cast<uint4*>(&s.k[j][0])[c] = kv;
      reinterpret_cast<uint4*>(&s.v[j][0])[c] = vv;
    }
    __syncwarp();
    // S = Q K^T over HD / 16 chunks.
    {
      wmma::fragment<wmma::accumulator, kT, kT, kT, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int d = 0; d < HD; d += kT) {
        wmma::fragment<wmma::matrix_a, kT, kT, kT, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kT, kT, kT, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, &s.q[0][d], HD);
        wmma::load_matrix_sync(b, &s.k[0][d], HD);  // (d, key) at k[key][d]: K^T
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&s.s[0][0], acc, kT, wmma::mem_row_major);
    }
    __syncwarp();
    // The online softmax, a row per lane (causal mask: key > the row's position).
    if (lane < kT) {
      const int r = lane, pr = s.pos[r];
      float mx = s.m[r];
      for (int j = 0; j < kT; ++j)
        if (k0 + j <= pr) mx = fmaxf(mx, s.s[r][j] * scale);
      const float corr = pr >= k0 ? expf(s.m[r] - mx) : 1.0f;
      float sum = 0.0f;
      for (int j = 0; j < kT; ++j) {
        const float pj = k0 + j <= pr ? expf(s.s[r][j] * scale - mx) : 0.0f;
        const __half ph = __float2half_rn(pj);
        s.p[r][j] = ph;
        sum += __half2float(ph);
      }
      if (pr >= k0) {
        s.m[r] = mx;
        s.l[r] = s.l[r] * corr + sum;
      }
      s.corr[r] = corr;
    }
    __syncwarp();
    for (int i = lane; i < kT * HD; i += 32) s.o[i / HD][i % HD] *= s.corr[i / HD];
    __syncwarp();
    // O += P V, one 16-column slice of O at a time.
#pragma unroll
    for (int d = 0; d < HD; d += kT) {
      wmma::fragment<wmma::matrix_a, kT, kT, kT, __half, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, kT, kT, kT, __half, wmma::row_major> b;
      wmma::fragment<wmma::accumulator, kT, kT, kT, float> acc;
      wmma::load_matrix_sync(a, &s.p[0][0], kT);
      wmma::load_matrix_sync(b, &s.v[0][d], HD);
      wmma::load_matrix_sync(acc, &s.o[0][d], HD, wmma::mem_row_major);
      wmma::mma_sync(acc, a, b, acc);
      wmma::store_matrix_sync(&s.o[0][d], acc, HD, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int i = lane; i < rows * HD; i += 32) {
    const int r = i / HD, d = i % HD;
    out[(static_cast<int64_t>(t0 + r) * num_heads + h) * HD + d] = s.o[r][d] / s.l[r];
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernel above on the CPU)
cudaError_t attention_tc(const DeviceStep& step, const float* q, int64_t ld_q, int32_t num_heads, int32_t num_kv_heads,
                         int32_t head_dim, int32_t block_size, float scale, const uint16_t* k_cache,
                         const uint16_t* v_cache, float* out, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((step.num_tokens + kT - 1) / kT), static_cast<unsigned>(num_heads));
  const auto* kc = reinterpret_cast<const __half*>(k_cache);
  const auto* vc = reinterpret_cast<const __half*>(v_cache);
  switch (head_dim) {
#define TROUPE_TC(HD)                                                                                                 \
  case HD:                                                                                                            \
    attention_tc_kernel<HD><<<grid, 32, 0, stream>>>(step, q, ld_q, num_heads, num_kv_heads, block_size, scale, kc, \
                                                     vc, out);                                                       \
    break;
    TROUPE_TC(32)
    TROUPE_TC(64)
    TROUPE_TC(96)
    TROUPE_TC(128)
    TROUPE_TC(160)
    TROUPE_TC(192)
    TROUPE_TC(256)
#undef TROUPE_TC
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
#endif

}  // namespace troupe::cuda
