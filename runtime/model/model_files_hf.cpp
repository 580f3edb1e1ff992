// Hugging Face directories and dummy weights.
#include <cmath>
#include <fstream>
#include <random>
#include <regex>

#include "kernels/cpu/quant_ref.h"
#include "kernels/fp16.h"
#include "runtime/model/architectures.h"
#include "runtime/model/model_files.h"
#include "runtime/format/safetensors.h"

namespace troupe {
namespace {

class HfSource final : public WeightSource {
 public:
  safetensors::Shards shards;
};

class OwnedSource final : public WeightSource {
 public:
  std::vector<std::vector<uint8_t>> buffers;
};

// HF tensor names -> GGUF names.
std::string gguf_name(const std::string& hf) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::pair<const char*, const char*> per_layer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},          {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},           {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  // Mixture of experts: the router, each expert (kept per expert: blk.N.ffn_gate.J.weight)
  // and Qwen2-MoE's shared expert with its gate.
  static const std::pair<const char*, const char*> moe[] = {
      {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
  };
  static const std::regex expert(
      R"((block_sparse_moe|mlp)\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight)");
  std::smatch m;
  if (std::regex_match(hf, m, layer)) {
    const std::string rest = m[2].str();
    for (const auto& [a, b] : per_layer)
      if (rest == a) return "blk." + m[1].str() + "." + b;
    for (const auto& [a, b] : moe)
      if (rest == a) return "blk." + m[1].str() + "." + b;
    std::smatch e;
    if (std::regex_match(rest, e, expert)) {
      const std::string w = e[3].str();
      const char* part = (w == "w1" || w == "gate_proj") ? "ffn_gate."
                         : (w == "w3" || w == "up_proj") ? "ffn_up."
                                                         : "ffn_down.";
      return "blk." + m[1].str() + "." + part + e[2].str() + ".weight";
    }
  }
  return "";
}

Result<nlohmann::json> read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error("cannot read " + path);
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) { return make_error(path + " is not JSON: " + e.what()); }
}

Result<ModelConfig> config_from_hf(const nlohmann::json& j, const std::string& where, bool any_architecture = false) {
  if (!j.is_object()) return make_error(where + ": not a JSON object");
  // j.value() would throw (and end the process) for a non-string model_type.
  std::string type = "llama";
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return make_error(where + ": model_type must be a string");
    type = it->get<std::string>();
  }
  const Architecture* arch = find_architecture(type);
  if (!arch && any_architecture) arch = find_architecture("llama");
  if (!arch)
    return make_error(where + ": unsupported model_type '" + type + "' (supported: " + supported_architectures() + ")");
  auto c = arch->from_hf(j);
  if (!c) return make_error(where + ": " + c.error().message);
  return c;
}

}  // namespace

Result<ModelConfig> read_hf_config(const std::string& config_path, bool any_architecture) {
  auto cj = read_json(config_path);
  if (!cj) return cj.error();
  return config_from_hf(*cj, config_path, any_architecture);
}

Result<ModelFiles> open_hf_dir(const std::string& dir) {
  auto cj = read_json(dir + "/config.json");
  if (!cj) return cj.error();
  auto cfg = config_from_hf(*cj, dir + "/config.json");
  if (!cfg) return cfg.error();
  auto shards = safetensors::Shards::open_dir(dir);
  if (!shards) return make_error(dir + ": " + shards.error().message);
  auto src = std::make_unique<HfSource>();
  for (const auto& t : shards->tensors()) {
    const std::string n = gguf_name(t.name);
    if (n.empty()) continue;  // rotary caches and other extras
    TensorRef r;
    r.name = n;
    r.type = t.type;
    r.shape.assign(t.shape.rbegin(), t.shape.rend());
    r.data = t.data;
    r.nbytes = t.nbytes;
    src->add(std::move(r));
  }
  src->shards = std::move(*shards);
  ModelFiles m;
  m.config = std::move(*cfg);
  m.format = "safetensors";
  m.path = dir;
  auto tok = Tokenizer::from_hf_dir(dir);
  if (!tok) return make_error(dir + ": tokenizer: " + tok.error().message);
  if (tok->vocab_size() > m.config.vocab)
    return make_error(dir + ": tokenizer has " + std::to_string(tok->vocab_size()) + " tokens, more than the model's " +
                      std::to_string(m.config.vocab));
  m.tokenizer = std::move(*tok);
  if (auto tc = read_json(dir + "/tokenizer_config.json"); tc && tc->is_object() && tc->contains("chat_template")) {
    const auto& t = (*tc)["chat_template"];
    if (t.is_string())
      m.chat_template = t.get<std::string>();
    else if (t.is_array())
      for (const auto& e : t)
        if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
            e["template"].is_string())
          m.chat_template = e["template"].get<std::string>();
  }
  m.weights = std::move(src);
  return m;
}

// Dummy models whose layers would take more host memory than this share one layer.
constexpr double kDummyShareBytes = 2.0 * (1 << 30);

Result<ModelFiles> open_dummy(const std::string& config_path, const OpenOptions& opts) {
  auto cj = read_json(config_path);
  if (!cj) return cj.error();
  auto cfg = config_from_hf(*cj, config_path);
  if (!cfg) return cfg.error();
  auto dt = dtype_from_name(opts.dummy_dtype);
  if (!dt || *dt == DType::Q8_1 || *dt == DType::Q8_K || *dt == DType::Q4_K || *dt == DType::Q5_K || *dt == DType::Q6_K)
    return make_error("unsupported dummy dtype '" + opts.dummy_dtype +
                      "' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1)");
  const ModelConfig& c = *cfg;
  // GGUF-layout dummy: interleaved RoPE is as valid as NeoX for random weights; keep NeoX.
  auto src = std::make_unique<OwnedSource>();
  std::mt19937_64 rng(opts.seed);
  // rows: every row of the tensor (a stacked expert tensor [cols, rows / E, E] has E times its rows).
  auto add_shaped = [&](const std::string& name, DType type, std::vector<int64_t> shape, float scale,
                        float offset) -> Status {
    const int64_t cols = shape[0];
    int64_t rows = 1;
    for (size_t d = 1; d < shape.size(); ++d) rows *= shape[d];
    auto rb = row_bytes(type, static_cast<uint64_t>(cols));
    if (!rb)
      return make_error("dummy tensor '" + name + "': " + std::to_string(cols) + " columns do not fit the block size");
    std::vector<uint8_t> buf(*rb * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& x : row) x = offset + u(rng);
      cpu::quantize_row_ref(type, row.data(), buf.data() + r * *rb, cols);
    }
    TensorRef t;
    t.name = name;
    t.type = type;
    t.shape = std::move(shape);
    t.data = buf.data();
    t.nbytes = buf.size();
    src->buffers.push_back(std::move(buf));
    src->add(std::move(t));
    return {};
  };
  auto add = [&](const std::string& name, DType type, int64_t cols, int64_t rows, float scale, float offset) {
    return add_shaped(name, type, rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows}, scale,
                      offset);
  };
  const int64_t H = c.hidden, q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  TROUPE_TRY(add("token_embd.weight", *dt, H, c.vocab, 1.0f, 0));
  TROUPE_TRY(add("output_norm.weight", DType::F32, H, 1, 0.1f, 1.0f));
  if (!c.tied_embeddings) TROUPE_TRY(add("output.weight", *dt, H, c.vocab, ws, 0));
  // Large shapes (Llama-3-8B, -70B) would need the whole model in host memory (141 GB for
  // 70B in bf16) and minutes of generation: above kDummyShareBytes every layer shares layer
  // 0's tensors (a device backend still gets its own copy per layer), which is all a
  // benchmark needs. (The 70B shape on one H200: --dtype q4_0 takes 40 GB; bf16, 141 GB,
  // leaves little for the KV cache.)
  const MoeConfig& moe = c.moe;
  const double ffn_values = moe.enabled()
                                ? 3.0 * double(H) * moe.expert_ffn * moe.num_experts + 3.0 * double(H) * moe.shared_ffn
                                : 3.0 * double(H) * c.ffn;
  const double layer_values = double(H) * (q + 2 * kv) + double(q) * H + ffn_values;
  const double layer_bytes = layer_values * dtype_traits(*dt).type_size / dtype_traits(*dt).block_size;
  const bool share = layer_bytes * c.num_layers > kDummyShareBytes;
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    if (share && i > 0) {
      for (const char* part : {"attn_norm.weight",
                               "ffn_norm.weight",
                               "attn_q.weight",
                               "attn_k.weight",
                               "attn_v.weight",
                               "attn_output.weight",
                               "ffn_gate.weight",
                               "ffn_up.weight",
                               "ffn_down.weight",
                               "attn_q.bias",
                               "attn_k.bias",
                               "attn_v.bias",
                               "ffn_gate_inp.weight",
                               "ffn_gate_exps.weight",
                               "ffn_up_exps.weight",
                               "ffn_down_exps.weight",
                               "ffn_gate_inp_shexp.weight",
                               "ffn_gate_shexp.weight",
                               "ffn_up_shexp.weight",
                               "ffn_down_shexp.weight"}) {
        const TensorRef* first = src->find(std::string("blk.0.") + part);
        if (!first) continue;  // (biases only where the family has them)
        TensorRef t = *first;
        t.name = p + part;
        src->add(std::move(t));
      }
      continue;
    }
    TROUPE_TRY(add(p + "attn_norm.weight", DType::F32, H, 1, 0.1f, 1.0f));
    TROUPE_TRY(add(p + "ffn_norm.weight", DType::F32, H, 1, 0.1f, 1.0f));
    TROUPE_TRY(add(p + "attn_q.weight", *dt, H, q, ws, 0));
    TROUPE_TRY(add(p + "attn_k.weight", *dt, H, kv, ws, 0));
    TROUPE_TRY(add(p + "attn_v.weight", *dt, H, kv, ws, 0));
    TROUPE_TRY(add(p + "attn_output.weight", *dt, q, H, ws, 0));
    if (moe.enabled()) {
      // Stacked experts as llama.cpp writes them ([cols, rows, experts]); the router in F32.
      const int64_t E = moe.num_experts, F = moe.expert_ffn, S = moe.shared_ffn;
      TROUPE_TRY(add(p + "ffn_gate_inp.weight", DType::F32, H, E, ws, 0));
      TROUPE_TRY(add_shaped(p + "ffn_gate_exps.weight", *dt, {H, F, E}, ws, 0));
      TROUPE_TRY(add_shaped(p + "ffn_up_exps.weight", *dt, {H, F, E}, ws, 0));
      TROUPE_TRY(add_shaped(p + "ffn_down_exps.weight", *dt, {F, H, E}, 1.0f / std::sqrt(static_cast<float>(F)), 0));
      if (S > 0) {
        if (moe.shared_gate) TROUPE_TRY(add(p + "ffn_gate_inp_shexp.weight", DType::F32, H, 1, ws, 0));
        TROUPE_TRY(add(p + "ffn_gate_shexp.weight", *dt, H, S, ws, 0));
        TROUPE_TRY(add(p + "ffn_up_shexp.weight", *dt, H, S, ws, 0));
        TROUPE_TRY(add(p + "ffn_down_shexp.weight", *dt, S, H, 1.0f / std::sqrt(static_cast<float>(S)), 0));
      }
    } else {
      TROUPE_TRY(add(p + "ffn_gate.weight", *dt, H, c.ffn, ws, 0));
      TROUPE_TRY(add(p + "ffn_up.weight", *dt, H, c.ffn, ws, 0));
      TROUPE_TRY(add(p + "ffn_down.weight", *dt, c.ffn, H, 1.0f / std::sqrt(static_cast<float>(c.ffn)), 0));
    }
    if (c.qkv_bias) {
      TROUPE_TRY(add(p + "attn_q.bias", DType::F32, q, 1, 0.01f, 0));
      TROUPE_TRY(add(p + "attn_k.bias", DType::F32, kv, 1, 0.01f, 0));
      TROUPE_TRY(add(p + "attn_v.bias", DType::F32, kv, 1, 0.01f, 0));
    }
  }
  ModelFiles m;
  m.config = c;
  m.format = "dummy";
  m.path = config_path;
  m.weights = std::move(src);
  return m;
}

}  // namespace troupe
