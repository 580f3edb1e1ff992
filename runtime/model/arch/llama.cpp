// Llama family: Llama 2, Llama 3 (llama3 RoPE scaling), Mistral, SmolLM2 (tied embeddings).
// GGUF stores Q/K permuted for interleaved RoPE; HF checkpoints use NeoX pairing.
#include <climits>
#include <cmath>
#include <cstring>

#include "runtime/model/architectures.h"

namespace troupe {

Result<ModelConfig> llama_like_from_gguf(const gguf::File& f, std::string_view arch) {
  ModelConfig c;
  c.arch = std::string(arch);
  c.name = f.opt_string("general.name").value_or(c.arch);
  const std::string a(arch);
  auto need = [&](const std::string& key, int32_t& out) -> Status {
    auto v = f.get_int(a + "." + key);
    if (!v) return v.error();
    if (*v <= 0 || *v > (int64_t{1} << 30))
      return make_error("metadata '" + a + "." + key + "' is " + std::to_string(*v));
    out = static_cast<int32_t>(*v);
    return {};
  };
  TROUPE_TRY(need("block_count", c.num_layers));
  TROUPE_TRY(need("embedding_length", c.hidden));
  TROUPE_TRY(need("attention.head_count", c.num_heads));
  TROUPE_TRY(need("context_length", c.max_context));
  // Mixture of experts (Mixtral is llama with expert_count; qwen2moe adds its own keys).
  // (an expert_count of 0, as some converters write for dense models, means dense)
  if (f.opt_int(a + ".expert_count").value_or(0) != 0) {
    TROUPE_TRY(need("expert_count", c.moe.num_experts));
    TROUPE_TRY(need("expert_used_count", c.moe.experts_per_tok));
    if (f.find(a + ".expert_feed_forward_length")) TROUPE_TRY(need("expert_feed_forward_length", c.moe.expert_ffn));
    if (f.find(a + ".expert_shared_feed_forward_length"))
      TROUPE_TRY(need("expert_shared_feed_forward_length", c.moe.shared_ffn));
  }
  if (f.find(a + ".feed_forward_length") || !c.moe.enabled()) TROUPE_TRY(need("feed_forward_length", c.ffn));
  if (c.moe.enabled()) {
    if (c.moe.expert_ffn == 0) c.moe.expert_ffn = c.ffn;
    if (c.ffn == 0) c.ffn = c.moe.expert_ffn;
  }
  c.num_kv_heads = static_cast<int32_t>(f.opt_int(a + ".attention.head_count_kv").value_or(c.num_heads));
  c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
  if (auto kl = f.opt_int(a + ".attention.key_length")) c.head_dim = static_cast<int32_t>(*kl);
  if (auto rd = f.opt_int(a + ".rope.dimension_count"); rd && *rd != c.head_dim)
    return make_error("partial rotary embeddings (rope.dimension_count " + std::to_string(*rd) + ") are not supported");
  c.rms_eps = static_cast<float>(f.opt_number(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(f.opt_number(a + ".rope.freq_base").value_or(10000.0));
  if (auto st = f.opt_string(a + ".rope.scaling.type"); st && *st != "none") {
    if (*st != "linear") return make_error("unsupported rope scaling type '" + *st + "' (" + a + ".rope.scaling.type)");
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = static_cast<float>(f.opt_number(a + ".rope.scaling.factor").value_or(1.0));
  }
  // Sliding-window attention is not implemented: cap the context at the window instead.
  if (auto sw = f.opt_int(a + ".attention.sliding_window"); sw && *sw > 0 && *sw < c.max_context)
    c.max_context = static_cast<int32_t>(*sw);
  if (const auto* t = f.tensor("rope_freqs.weight")) {
    if (t->type != DType::F32 || t->n_dims != 1 || t->ne[0] * 2 != static_cast<uint64_t>(c.head_dim))
      return make_error("tensor 'rope_freqs.weight' must be f32 [head_dim/2]");
    c.rope_freq_factors.resize(t->ne[0]);
    std::memcpy(c.rope_freq_factors.data(), t->data, t->nbytes);
    for (float x : c.rope_freq_factors)
      if (!std::isfinite(x) || x <= 0) return make_error("tensor 'rope_freqs.weight' holds a non-positive factor");
  }
  auto vocab = f.opt_int(a + ".vocab_size");
  if (!vocab) {
    const auto* toks = f.find("tokenizer.ggml.tokens");
    if (toks)
      vocab = static_cast<int64_t>(toks->array.size());
    else if (const auto* e = f.tensor("token_embd.weight"))
      vocab = static_cast<int64_t>(e->ne[1]);
  }
  if (!vocab || *vocab <= 0 || *vocab > (1 << 22)) return make_error("cannot determine the vocabulary size");
  c.vocab = static_cast<int32_t>(*vocab);
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  c.rope_kind = RopeKind::Interleaved;
  TROUPE_TRY(c.validate());
  return c;
}

namespace {

// config.json readers: absent or null keeps `out` (the default) unless the field is
// required; a wrong type or an int32 overflow is an error naming the field (nlohmann's
// own messages do not name it, and a bare get<int32_t>() would silently truncate).
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

Status read_int(const nlohmann::json& j, const char* key, int32_t& out, bool required) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return make_error(std::string("missing field '") + key + "'");
    return {};
  }
  if (!it->is_number_integer()) return make_error(std::string("'") + key + "' must be an integer, not " + shown(*it));
  const bool fits = it->is_number_unsigned() ? it->get<uint64_t>() <= INT32_MAX
                                             : it->get<int64_t>() >= INT32_MIN && it->get<int64_t>() <= INT32_MAX;
  if (!fits) return make_error(std::string("'") + key + "' is out of range: " + shown(*it));
  out = static_cast<int32_t>(it->get<int64_t>());
  return {};
}

Status read_float(const nlohmann::json& j, const char* key, float& out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_number()) return make_error(std::string("'") + key + "' must be a number, not " + shown(*it));
  out = static_cast<float>(it->get<double>());
  return {};
}

Status read_bool(const nlohmann::json& j, const char* key, bool& out) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_boolean()) return make_error(std::string("'") + key + "' must be true or false, not " + shown(*it));
  out = it->get<bool>();
  return {};
}

}  // namespace

Result<ModelConfig> llama_like_from_hf(const nlohmann::json& j) {
  if (!j.is_object()) return make_error("config.json is not a JSON object");
  ModelConfig c;
  c.arch = "llama";
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) c.arch = it->get<std::string>();
  c.name = c.arch;
  if (auto it = j.find("_name_or_path"); it != j.end() && it->is_string()) c.name = it->get<std::string>();
  TROUPE_TRY(read_int(j, "num_hidden_layers", c.num_layers, true));
  TROUPE_TRY(read_int(j, "hidden_size", c.hidden, true));
  TROUPE_TRY(read_int(j, "num_attention_heads", c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  TROUPE_TRY(read_int(j, "num_key_value_heads", c.num_kv_heads, false));
  c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
  TROUPE_TRY(read_int(j, "head_dim", c.head_dim, false));
  TROUPE_TRY(read_int(j, "intermediate_size", c.ffn, true));
  // Mixtral's experts: num_local_experts of intermediate_size each, top num_experts_per_tok.
  TROUPE_TRY(read_int(j, "num_local_experts", c.moe.num_experts, false));
  if (c.moe.num_experts != 0) {
    TROUPE_TRY(read_int(j, "num_experts_per_tok", c.moe.experts_per_tok, true));
    c.moe.expert_ffn = c.ffn;
  }
  TROUPE_TRY(read_int(j, "vocab_size", c.vocab, true));
  c.max_context = 4096;
  TROUPE_TRY(read_int(j, "max_position_embeddings", c.max_context, false));
  c.rms_eps = 1e-5f;
  TROUPE_TRY(read_float(j, "rms_norm_eps", c.rms_eps));
  c.rope_theta = 10000.0f;
  TROUPE_TRY(read_float(j, "rope_theta", c.rope_theta));
  c.tied_embeddings = false;
  TROUPE_TRY(read_bool(j, "tie_word_embeddings", c.tied_embeddings));
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return make_error("'rope_scaling' must be an object, not " + shown(*it));
    const auto& rs = *it;
    if (auto t = rs.find("rope_type"); t != rs.end() && t->is_string())
      c.rope_scaling.type = t->get<std::string>();
    else if (auto t2 = rs.find("type"); t2 != rs.end() && t2->is_string())
      c.rope_scaling.type = t2->get<std::string>();
    TROUPE_TRY(read_float(rs, "factor", c.rope_scaling.factor));
    TROUPE_TRY(read_float(rs, "low_freq_factor", c.rope_scaling.low_freq_factor));
    TROUPE_TRY(read_float(rs, "high_freq_factor", c.rope_scaling.high_freq_factor));
    TROUPE_TRY(read_int(rs, "original_max_position_embeddings", c.rope_scaling.original_max_position, false));
    if (c.rope_scaling.type != "llama3" && c.rope_scaling.type != "linear" && c.rope_scaling.type != "default")
      return make_error("unsupported rope_scaling type '" + c.rope_scaling.type + "'");
  }
  // Sliding-window attention (Mistral v0.1) is not implemented: within the window it is
  // ordinary causal attention, so the usable context is capped at the window.
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_number_integer()) {
    const int64_t w = it->get<int64_t>();
    if (w > 0 && w < c.max_context) c.max_context = static_cast<int32_t>(w);
  }
  c.rope_kind = RopeKind::Neox;
  TROUPE_TRY(c.validate());
  return c;
}

namespace {
Result<ModelConfig> llama_gguf(const gguf::File& f) { return llama_like_from_gguf(f, "llama"); }
Result<ModelConfig> mistral_gguf(const gguf::File& f) { return llama_like_from_gguf(f, "mistral"); }
}  // namespace

extern const Architecture kLlamaArchitecture{"llama", llama_gguf, llama_like_from_hf};
extern const Architecture kMistralArchitecture{"mistral", mistral_gguf, llama_like_from_hf};

}  // namespace troupe
