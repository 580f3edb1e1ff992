// The shape and hyper-parameters of a decoder-only transformer, independent of file format.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "common/dtype.h"
#include "common/result.h"

namespace troupe {

struct RopeScaling {
  std::string type;  // "", "llama3", "linear"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_max_position = 8192;
};

struct ModelConfig {
  std::string arch;  // llama, mistral, qwen2 (SmolLM2 is llama)
  std::string name;
  int32_t num_layers = 0;
  int32_t hidden = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t ffn = 0;
  int32_t vocab = 0;
  int32_t max_context = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  std::vector<float> rope_freq_factors;  // GGUF rope_freqs.weight (llama3 scaling), divides inv_freq
  RopeKind rope_kind = RopeKind::Neox;
  bool tied_embeddings = false;
  bool qkv_bias = false;

  // Checks every field for range and consistency; the error names the field and value.
  Status validate() const;
  // Inverse frequencies [head_dim / 2], with rope scaling applied.
  std::vector<float> rope_inv_freq() const;
};

}  // namespace troupe
