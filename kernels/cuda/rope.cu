// RoPE in place on the Q or K columns of the fused QKV output, angles from the step's
// table; rope_kv_write also writes the rotated K and V rows into the f16 cache (the work of
// rope(q), rope(k) and kv_write in one launch, with the same bits).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t ld, int64_t num_heads, int64_t head_dim, const float* cos_sin,
                            bool neox) {
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  const float* cs = cos_sin + t * head_dim;
  for (int64_t k = threadIdx.x; k < num_heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float* v = x + t * ld + h * head_dim;
    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    rope_rotate(v[a], v[b], cs[2 * i], cs[2 * i + 1], &v[a], &v[b]);
  }
}

// One block per token: the (num_heads + num_kv_heads) * half pairs of Q and K are rotated
// in place; K's pairs and V's elements also go to the token's cache slot.
__global__ void rope_kv_write_kernel(float* qkv, int64_t ld, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                     const float* cos_sin, bool neox, const int32_t* slots, __half* kc, __half* vc) {
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2, row = num_kv_heads * head_dim;
  const float* cs = cos_sin + t * head_dim;
  float* r = qkv + t * ld;
  const int64_t slot = slots[t];
  for (int64_t k = threadIdx.x; k < (num_heads + num_kv_heads) * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float* v = r + h * head_dim;  // K heads follow the Q heads
    const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    float y0, y1;
    rope_rotate(v[a], v[b], cs[2 * i], cs[2 * i + 1], &y0, &y1);
    v[a] = y0;
    v[b] = y1;
    if (h >= num_heads) {
      const int64_t base = slot * row + (h - num_heads) * head_dim;
      kc[base + a] = kv_half(y0);
      kc[base + b] = kv_half(y1);
    }
  }
  const float* vr = r + (num_heads + num_kv_heads) * head_dim;
  for (int64_t j = threadIdx.x; j < row; j += blockDim.x) vc[slot * row + j] = kv_half(vr[j]);
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
cudaError_t rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin, bool neox,
                 cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(x, ld, num_heads, head_dim, cos_sin, neox);
  return cudaGetLastError();
}

cudaError_t rope_kv_write(const DeviceStep& step, float* qkv, int64_t ld, int64_t num_heads, int64_t num_kv_heads,
                          int64_t head_dim, const float* cos_sin, bool neox, uint16_t* k_cache, uint16_t* v_cache,
                          cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  rope_kv_write_kernel<<<static_cast<unsigned>(step.num_tokens), 256, 0, stream>>>(
      qkv, ld, num_heads, num_kv_heads, head_dim, cos_sin, neox, step.slot_mapping, reinterpret_cast<__half*>(k_cache),
      reinterpret_cast<__half*>(v_cache));
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
