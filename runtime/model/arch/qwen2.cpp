// Qwen2 / Qwen2.5: the Llama layout plus biases on Q, K and V, NeoX RoPE in both formats.
#include "runtime/model/architectures.h"

namespace troupe {
namespace {
Result<ModelConfig> qwen2_gguf(const gguf::File& f) {
  auto c = llama_like_from_gguf(f, "qwen2");
  if (!c) return c;
  c->qkv_bias = true;
  c->rope_kind = RopeKind::Neox;  // llama.cpp: LLM_ARCH_QWEN2 uses NEOX rope, weights unpermuted
  return c;
}
Result<ModelConfig> qwen2_hf(const nlohmann::json& j) {
  auto c = llama_like_from_hf(j);
  if (!c) return c;
  c->qkv_bias = true;
  return c;
}
}  // namespace

extern const Architecture kQwen2Architecture{"qwen2", qwen2_gguf, qwen2_hf};

}  // namespace troupe
