// Qwen3, Qwen3-MoE and OLMoE from GGUF: NeoX RoPE, no Q/K/V biases, and an RMSNorm on Q and
// K before RoPE (Qwen3: per head, OLMoE: over the whole projection). Qwen3-MoE renormalises
// its top-k router weights (llama.cpp's qwen3moe always does), OLMoE does not. Hugging Face
// directories of these families are refused for now (their tensor names and configs are not
// tested yet): convert them to GGUF.
#include "runtime/model/architectures.h"

namespace troupe {
namespace {

Result<ModelConfig> qk_normed(const gguf::File& f, const char* arch, ModelConfig::QkNorm norm) {
  auto c = llama_like_from_gguf(f, arch);
  if (!c) return c;
  c->rope_kind = RopeKind::Neox;
  c->qk_norm = norm;
  return c;
}

Result<ModelConfig> qwen3_gguf(const gguf::File& f) {
  auto c = qk_normed(f, "qwen3", ModelConfig::QkNorm::PerHead);
  if (c && c->moe.enabled()) return make_error("qwen3: a file with experts should say qwen3moe");
  return c;
}

Result<ModelConfig> qwen3moe_gguf(const gguf::File& f) {
  auto c = qk_normed(f, "qwen3moe", ModelConfig::QkNorm::PerHead);
  if (!c) return c;
  if (!c->moe.enabled()) return make_error("qwen3moe: metadata 'qwen3moe.expert_count' is missing or 0");
  c->moe.norm_topk_prob = true;
  TROUPE_TRY(c->validate());
  return c;
}

Result<ModelConfig> olmoe_gguf(const gguf::File& f) {
  auto c = qk_normed(f, "olmoe", ModelConfig::QkNorm::Full);
  if (!c) return c;
  if (!c->moe.enabled()) return make_error("olmoe: metadata 'olmoe.expert_count' is missing or 0");
  c->moe.norm_topk_prob = false;
  TROUPE_TRY(c->validate());
  return c;
}

Result<ModelConfig> gguf_only(const nlohmann::json& j) {
  const std::string t = j.value("model_type", std::string("?"));
  return make_error("Hugging Face '" + t + "' directories are not supported yet; convert the model to GGUF");
}

}  // namespace

extern const Architecture kQwen3Architecture{"qwen3", qwen3_gguf, gguf_only};
extern const Architecture kQwen3MoeArchitecture{"qwen3moe", qwen3moe_gguf, gguf_only};
extern const Architecture kQwen3MoeHfArchitecture{"qwen3_moe", qwen3moe_gguf, gguf_only};
extern const Architecture kOlmoeArchitecture{"olmoe", olmoe_gguf, gguf_only};

}  // namespace troupe
