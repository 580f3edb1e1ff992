// Qwen2-MoE / Qwen1.5-MoE: Qwen2 attention (Q/K/V biases) and a mixture-of-experts FFN with a
// shared expert behind a sigmoid gate; the top-k weights are not renormalised unless
// norm_topk_prob (HF config; llama.cpp's qwen2moe never renormalises).
#include "runtime/model/architectures.h"

namespace troupe {
namespace {

Result<ModelConfig> qwen2moe_gguf(const gguf::File& f) {
  auto c = llama_like_from_gguf(f, "qwen2moe");
  if (!c) return c;
  if (!c->moe.enabled())
    return make_error("qwen2moe: metadata 'qwen2moe.expert_count' is missing or 0 (a qwen2moe file needs experts)");
  c->qkv_bias = true;
  c->rope_kind = RopeKind::Neox;
  c->moe.norm_topk_prob = false;
  c->moe.shared_gate = c->moe.shared_ffn > 0;
  TROUPE_TRY(c->validate());
  return c;
}

Result<ModelConfig> qwen2moe_hf(const nlohmann::json& j) {
  auto c = llama_like_from_hf(j);
  if (!c) return c;
  c->qkv_bias = true;
  auto get_int = [&](const char* key, int32_t& out, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) return make_error(std::string("missing field '") + key + "'");
      return {};
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 30))
      return make_error(std::string("'") + key + "' must be a non-negative integer");
    out = static_cast<int32_t>(it->get<int64_t>());
    return {};
  };
  TROUPE_TRY(get_int("num_experts", c->moe.num_experts, true));
  TROUPE_TRY(get_int("num_experts_per_tok", c->moe.experts_per_tok, true));
  TROUPE_TRY(get_int("moe_intermediate_size", c->moe.expert_ffn, true));
  TROUPE_TRY(get_int("shared_expert_intermediate_size", c->moe.shared_ffn, false));
  c->moe.norm_topk_prob = false;
  if (auto it = j.find("norm_topk_prob"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return make_error("'norm_topk_prob' must be true or false");
    c->moe.norm_topk_prob = it->get<bool>();
  }
  c->moe.shared_gate = c->moe.shared_ffn > 0;
  int32_t step = 1;
  TROUPE_TRY(get_int("decoder_sparse_step", step, false));
  if (step != 1)
    return make_error("decoder_sparse_step " + std::to_string(step) +
                      " (dense layers between MoE layers) is not supported");
  if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array() && !it->empty())
    return make_error("mlp_only_layers (dense layers in a MoE model) is not supported");
  TROUPE_TRY(c->validate());
  return c;
}

}  // namespace

// Mixtral: HF model_type "mixtral"; llama.cpp writes it as general.architecture "llama".
Result<ModelConfig> mixtral_gguf(const gguf::File& f);

extern const Architecture kQwen2MoeArchitecture{"qwen2moe", qwen2moe_gguf, qwen2moe_hf};
extern const Architecture kQwen2MoeHfArchitecture{"qwen2_moe", qwen2moe_gguf, qwen2moe_hf};
Result<ModelConfig> mixtral_gguf(const gguf::File& f) { return llama_like_from_gguf(f, "mixtral"); }
extern const Architecture kMixtralArchitecture{"mixtral", mixtral_gguf, llama_like_from_hf};

}  // namespace troupe
