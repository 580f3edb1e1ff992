// Llama family: Llama 2, Llama 3 (llama3 RoPE scaling), Mistral, SmolLM2 (tied embeddings).
// GGUF stores Q/K permuted for interleaved RoPE; HF checkpoints use NeoX pairing.
#include <cmath>
#include <cstring>

#include "runtime/architectures.h"

namespace troupe {

Result<ModelConfig> llama_like_from_gguf(const gguf::File& f, std::string_view arch) {
  ModelConfig c;
  c.arch = std::string(arch);
  c.name = f.opt_string("general.name").value_or(c.arch);
  const std::string a(arch);
  auto need = [&](const std::string& key, int32_t& out) -> Status {
    auto v = f.get_int(a + "." + key);
    if (!v) return v.error();
    if (*v <= 0 || *v > (int64_t{1} << 30)) return make_error("metadata '" + a + "." + key + "' is " + std::to_string(*v));
    out = static_cast<int32_t>(*v);
    return {};
  };
  TROUPE_TRY(need("block_count", c.num_layers));
  TROUPE_TRY(need("embedding_length", c.hidden));
  TROUPE_TRY(need("attention.head_count", c.num_heads));
  TROUPE_TRY(need("feed_forward_length", c.ffn));
  TROUPE_TRY(need("context_length", c.max_context));
  c.num_kv_heads = static_cast<int32_t>(f.opt_int(a + ".attention.head_count_kv").value_or(c.num_heads));
  c.head_dim = c.num_heads > 0 ? c.hidden / c.num_heads : 0;
  if (auto kl = f.opt_int(a + ".attention.key_length")) c.head_dim = static_cast<int32_t>(*kl);
  if (auto rd = f.opt_int(a + ".rope.dimension_count"); rd && *rd != c.head_dim)
    return make_error("partial rotary embeddings (rope.dimension_count " + std::to_string(*rd) + ") are not supported");
  c.rms_eps = static_cast<float>(f.opt_number(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(f.opt_number(a + ".rope.freq_base").value_or(10000.0));
  if (auto st = f.opt_string(a + ".rope.scaling.type"); st && *st == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = static_cast<float>(f.opt_number(a + ".rope.scaling.factor").value_or(1.0));
  }
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
    if (toks) vocab = static_cast<int64_t>(toks->array.size());
    else if (const auto* e = f.tensor("token_embd.weight")) vocab = static_cast<int64_t>(e->ne[1]);
  }
  if (!vocab || *vocab <= 0 || *vocab > (1 << 22)) return make_error("cannot determine the vocabulary size");
  c.vocab = static_cast<int32_t>(*vocab);
  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  c.rope_kind = RopeKind::Interleaved;
  TROUPE_TRY(c.validate());
  return c;
}

Result<ModelConfig> llama_like_from_hf(const nlohmann::json& j) {
  ModelConfig c;
  try {
    c.arch = j.value("model_type", std::string("llama"));
    c.name = j.value("_name_or_path", c.arch);
    c.num_layers = j.at("num_hidden_layers").get<int32_t>();
    c.hidden = j.at("hidden_size").get<int32_t>();
    c.num_heads = j.at("num_attention_heads").get<int32_t>();
    c.num_kv_heads = j.value("num_key_value_heads", c.num_heads);
    c.head_dim = j.contains("head_dim") && j["head_dim"].is_number_integer() ? j["head_dim"].get<int32_t>()
                                                                              : (c.num_heads ? c.hidden / c.num_heads : 0);
    c.ffn = j.at("intermediate_size").get<int32_t>();
    c.vocab = j.at("vocab_size").get<int32_t>();
    c.max_context = j.value("max_position_embeddings", 4096);
    c.rms_eps = j.value("rms_norm_eps", 1e-5f);
    c.rope_theta = j.value("rope_theta", 10000.0f);
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      const auto& rs = j["rope_scaling"];
      c.rope_scaling.type = rs.value("rope_type", rs.value("type", std::string()));
      c.rope_scaling.factor = rs.value("factor", 1.0f);
      c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0f);
      c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0f);
      c.rope_scaling.original_max_position = rs.value("original_max_position_embeddings", 8192);
      if (c.rope_scaling.type != "llama3" && c.rope_scaling.type != "linear" && c.rope_scaling.type != "default")
        return make_error("config.json: unsupported rope_scaling type '" + c.rope_scaling.type + "'");
    }
  } catch (const std::exception& e) {
    return make_error(std::string("config.json: ") + e.what());
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
