// CudaBackend's choice of attention kernel (attention_path.h).
#include "kernels/cuda/attention_path.h"

#include <cstddef>

#include "kernels/cuda/ops.h"

namespace troupe::cuda {

AttentionPath attention_path(const AttentionInputs& in) {
  auto fits = [&](size_t bytes) { return bytes > 0 && bytes <= static_cast<size_t>(in.max_shared_optin); };
  const size_t tc_bytes = attention_tc_shared_bytes(in.head_dim);
  // mma.sync unless TROUPE_CUDA_ATTN=wmma or the device allows a block too little shared
  // memory for the mode (then the WMMA kernel, where it fits).
  const bool mma_fits = !in.wmma_attention && fits(attention_mma_shared_bytes(in.head_dim, in.batch_invariant));
  AttentionPath p;
  if (in.batch_invariant) {
    p.every_token = in.tc_attention && (mma_fits || (attention_tc_invariant_supported(in.head_dim) && fits(tc_bytes)));
  } else if (in.num_tokens >= kTcMinTokens) {
    p.tiles = mma_fits || fits(tc_bytes);
  }
  p.mma = (p.every_token || p.tiles) && mma_fits;
  return p;
}

}  // namespace troupe::cuda
