// Embedding gather: one block per token, each thread decodes 32-element chunks of the row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {
namespace {

template <DType T>
__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, int64_t cols, const int32_t* ids, float* out) {
  const int64_t t = blockIdx.x;
  const uint8_t* row = table + static_cast<size_t>(ids[t]) * row_bytes;
  float* o = out + t * cols;
  float v[32];
  const int64_t nb = (cols + 31) / 32;
  for (int64_t c = threadIdx.x; c * 32 < cols; c += blockDim.x) {
    dequant32<T>(row, c, nb, v);
    const int64_t base = c * 32;
    const int lim = cols - base < 32 ? static_cast<int>(cols - base) : 32;
    for (int j = 0; j < lim; ++j) o[base + j] = v[j];
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION  // (tests/kernels/cuda_emulation.h runs the kernel above on the CPU)
bool is_supported_type(DType type) {
  bool found = false;
  dispatch_dtype(type, [&]<DType>() { found = true; });
  return found;
}

cudaError_t embed(DType type, const void* table, size_t row_bytes, int64_t cols, const int32_t* ids, int64_t n,
                  float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const bool ok = dispatch_dtype(type, [&]<DType T>() {
    embed_kernel<T>
        <<<static_cast<unsigned>(n), 128, 0, stream>>>(static_cast<const uint8_t*>(table), row_bytes, cols, ids, out);
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

#endif

}  // namespace troupe::cuda
