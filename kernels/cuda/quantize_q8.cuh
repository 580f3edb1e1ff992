// The int8 activation quantizer's per-warp step (ops.h: q8_row_bytes, Q8Numerics), shared by
// quantize_q8_kernel (matmul_q8.cu) and the norms that quantize their output on the way out
// (rms_norm.cu): the same code on the same float, so the same bytes either way.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

// Block b (of nb in a token row `row`) from the warp's 32 values, lane j holding element j.
// Every lane of the warp must call it (warp reductions): id = 127 / amax, round half to
// even; d (f16-rounded for the 32-block types) and s = d * sum(q) (as f16 for Q4_1, Q5_1).
__device__ __forceinline__ void quantize_q8_block(float v, int lane, int64_t b, int64_t nb, uint8_t* __restrict__ row,
                                                  Q8Numerics nq) {
  const float amax = warp_max(fabsf(v));
  const float dd = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int q = __float2int_rn(v * id);
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  row[lane < 16 ? 16 * b + lane : 16 * (nb + b) + lane - 16] = static_cast<uint8_t>(static_cast<int8_t>(q));
  if (lane == 0) {
    float* f = reinterpret_cast<float*>(row);
    const float d = nq.d_as_f16 ? __half2float(__float2half_rn(dd)) : dd;
    f[8 * nb + b] = d;
    f[9 * nb + b] =
        nq.s_as_f16 ? __half2float(__float2half_rn(dd * static_cast<float>(sum))) : d * static_cast<float>(sum);
  }
}

}  // namespace troupe::cuda
