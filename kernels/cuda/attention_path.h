// Which attention kernel a step takes (CudaBackend::attention). Plain host code: it asks the
// kernels' shared-memory needs (ops.h) and nothing else, so the choice depends on the mode,
// the model's head size, the device's shared-memory limit and, only where the backend is
// not batch-invariant, the step's token count.
#pragma once

#include <cstdint>

namespace troupe::cuda {

// Steps of at least this many tokens use the tensor-core prefill attention when the backend
// is not batch-invariant (--cuda-cublas).
constexpr int32_t kTcMinTokens = 64;

struct AttentionInputs {
  bool batch_invariant = true;
  bool tc_attention = false;    // TROUPE_CUDA_ATTN=tc or wmma (CudaEnvOptions)
  bool wmma_attention = false;  // TROUPE_CUDA_ATTN=wmma
  int32_t num_tokens = 0;       // the step's
  int32_t head_dim = 0;
  int64_t max_shared_optin = 0;  // bytes of shared memory a block may opt into
};

struct AttentionPath {
  // Batch-invariant, TROUPE_CUDA_ATTN=tc or wmma: every token on tensor cores
  // (attention_mma_invariant where mma, else attention_tc_invariant).
  bool every_token = false;
  // Not batch-invariant, a prefill-sized step: the one-sequence tiles of 16 tokens on
  // tensor cores (attention_mma where mma, else attention_tc's WMMA), the rest per token.
  bool tiles = false;
  bool mma = false;  // the tensor-core kernel is the mma.sync one (only with every_token or tiles)
};

// Neither flag set: attention() alone (looped or split-KV) for every token.
AttentionPath attention_path(const AttentionInputs& in);

}  // namespace troupe::cuda
