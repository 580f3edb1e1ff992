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

// Mixture-of-experts feed-forward (every layer is MoE when num_experts > 0). The router is
// softmax over the experts, top `experts_per_tok` (ties to the lower id), renormalised when
// norm_topk_prob; a shared expert (Qwen2-MoE) is added with a sigmoid gate when shared_gate.
struct MoeConfig {
  int32_t num_experts = 0;
  int32_t experts_per_tok = 0;
  int32_t expert_ffn = 0;  // each routed expert's intermediate size
  bool norm_topk_prob = true;
  int32_t shared_ffn = 0;  // 0: no shared expert
  bool shared_gate = false;
  bool enabled() const { return num_experts > 0; }
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
  // RMSNorm on Q and K after their projections, before RoPE: per head (Qwen3, Qwen3-MoE:
  // attn_q_norm/attn_k_norm of [head_dim]) or over the whole projection (OLMoE: [q rows],
  // [kv rows]).
  enum class QkNorm { None, PerHead, Full };
  QkNorm qk_norm = QkNorm::None;
  MoeConfig moe;

  // Checks every field for range and consistency; the error names the field and value.
  Status validate() const;
  // Inverse frequencies [head_dim / 2], with rope scaling applied.
  std::vector<float> rope_inv_freq() const;
};

}  // namespace troupe
