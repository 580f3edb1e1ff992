// KV-cache write through the slot mapping: f32 rows -> f16 cache slots (round to nearest).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

__global__ void kv_write_kernel(const int32_t* slots, const float* k, const float* v, int64_t ld, int64_t row,
                                __half* kc, __half* vc) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  for (int64_t j = threadIdx.x; j < row; j += blockDim.x) {
    kc[slot * row + j] = kv_half(k[t * ld + j]);
    vc[slot * row + j] = kv_half(v[t * ld + j]);
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernels above on the CPU)
cudaError_t kv_write(const DeviceStep& step, const float* k, const float* v, int64_t ld, int64_t row_elems,
                     uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  if (step.num_tokens <= 0) return cudaSuccess;
  kv_write_kernel<<<static_cast<unsigned>(step.num_tokens), 128, 0, stream>>>(
      step.slot_mapping, k, v, ld, row_elems, reinterpret_cast<__half*>(k_cache), reinterpret_cast<__half*>(v_cache));
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
