// Hugging Face directories: a tiny Llama written as config.json + model.safetensors (F32
// and BF16) + tokenizer.json, and a GGUF of the same weights with Q/K rows permuted the
// way llama.cpp's convert_hf_to_gguf.py does. Both go through open_model -> Model::build ->
// SequenceRunner::feed and must give the same logits: HF's NeoX RoPE path and GGUF's
// interleaved path are the same model. Also Qwen2 (q/k/v biases) against its GGUF, tied
// embeddings, and config.json errors.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/fp16.h"
#include "runtime/model/architectures.h"
#include "runtime/format/gguf.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/runtime/safetensors_writer.h"

using namespace troupe;
using nlohmann::json;

namespace {

struct Spec {
  std::string model_type = "llama";
  int32_t layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 48, ctx = 128;
  bool tied = false;
  bool bias = false;  // q/k/v biases (Qwen2)
  uint64_t seed = 5;
  // Mixture of experts (model_type mixtral or qwen2_moe): per-expert HF tensors, stacked in the GGUF.
  int32_t experts = 0, experts_used = 0, shared_ffn = 0;
  bool norm_topk = true;
  int32_t head_dim() const { return hidden / heads; }
};

// HF name -> row-major tensor ([rows, cols] for matrices, [n] for vectors).
struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> v;
};
using HfWeights = std::map<std::string, HfTensor>;

// Random weights, every value rounded to bf16 so the F32 and BF16 files hold the same model.
HfWeights make_weights(const Spec& s) {
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  HfWeights w;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float scale) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> nd(mean, scale);
    HfTensor t{std::move(shape), std::vector<float>(static_cast<size_t>(n))};
    for (auto& x : t.v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
    w[name] = std::move(t);
  };
  const int64_t H = s.hidden, q = int64_t{s.heads} * s.head_dim(), kv = int64_t{s.kv_heads} * s.head_dim();
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  add("model.embed_tokens.weight", {s.vocab, H}, 0, 1.0f);
  add("model.norm.weight", {H}, 1.0f, 0.1f);
  if (!s.tied) add("lm_head.weight", {s.vocab, H}, 0, ws);
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 1.0f, 0.1f);
    add(p + "post_attention_layernorm.weight", {H}, 1.0f, 0.1f);
    // Q and K a little larger than usual so attention is far from uniform and RoPE matters.
    add(p + "self_attn.q_proj.weight", {q, H}, 0, 3 * ws);
    add(p + "self_attn.k_proj.weight", {kv, H}, 0, 3 * ws);
    add(p + "self_attn.v_proj.weight", {kv, H}, 0, ws);
    add(p + "self_attn.o_proj.weight", {H, q}, 0, ws);
    const float wd = 1.0f / std::sqrt(static_cast<float>(s.ffn));
    if (s.experts == 0) {
      add(p + "mlp.gate_proj.weight", {s.ffn, H}, 0, ws);
      add(p + "mlp.up_proj.weight", {s.ffn, H}, 0, ws);
      add(p + "mlp.down_proj.weight", {H, s.ffn}, 0, wd);
    } else if (s.model_type == "mixtral") {
      add(p + "block_sparse_moe.gate.weight", {s.experts, H}, 0, 4 * ws);
      for (int32_t e = 0; e < s.experts; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        add(x + "w1.weight", {s.ffn, H}, 0, ws);
        add(x + "w3.weight", {s.ffn, H}, 0, ws);
        add(x + "w2.weight", {H, s.ffn}, 0, wd);
      }
    } else {  // qwen2_moe
      add(p + "mlp.gate.weight", {s.experts, H}, 0, 4 * ws);
      for (int32_t e = 0; e < s.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {s.ffn, H}, 0, ws);
        add(x + "up_proj.weight", {s.ffn, H}, 0, ws);
        add(x + "down_proj.weight", {H, s.ffn}, 0, wd);
      }
      add(p + "mlp.shared_expert.gate_proj.weight", {s.shared_ffn, H}, 0, ws);
      add(p + "mlp.shared_expert.up_proj.weight", {s.shared_ffn, H}, 0, ws);
      add(p + "mlp.shared_expert.down_proj.weight", {H, s.shared_ffn}, 0,
          1.0f / std::sqrt(static_cast<float>(s.shared_ffn)));
      add(p + "mlp.shared_expert_gate.weight", {1, H}, 0, ws);
    }
    if (s.bias) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.5f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.5f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.5f);
    }
  }
  return w;
}

std::vector<uint8_t> to_bytes(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> b;
  if (t == DType::F32) {
    b.resize(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
  } else {
    b.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

void write_safetensors(const std::filesystem::path& path, const HfWeights& w, DType t) {
  test::SafetensorsWriter st;
  for (const auto& [name, tensor] : w) {
    const auto b = to_bytes(tensor.v, t);
    st.add(name, t == DType::F32 ? "F32" : "BF16", tensor.shape, b.data(), b.size());
  }
  st.write(path);
}

// Specials, "▁", a..z, then "▁a", "▁b", ... up to `vocab` tokens.
std::vector<std::string> vocab_tokens(int32_t vocab) {
  std::vector<std::string> t = {"<unk>", "<s>", "</s>", "\xE2\x96\x81"};
  for (char c = 'a'; c <= 'z'; ++c) t.push_back(std::string(1, c));
  for (char c = 'a'; static_cast<int32_t>(t.size()) < vocab; ++c) t.push_back("\xE2\x96\x81" + std::string(1, c));
  t.resize(static_cast<size_t>(vocab));
  return t;
}

const char* kChatTemplate = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}";

json hf_config(const Spec& s) {
  const char* cls = s.model_type == "qwen2"       ? "Qwen2ForCausalLM"
                    : s.model_type == "mixtral"   ? "MixtralForCausalLM"
                    : s.model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                                                  : "LlamaForCausalLM";
  json j = {{"architectures", {cls}},
            {"model_type", s.model_type},
            {"hidden_size", s.hidden},
            {"intermediate_size", s.ffn},
            {"num_attention_heads", s.heads},
            {"num_hidden_layers", s.layers},
            {"num_key_value_heads", s.kv_heads},
            {"vocab_size", s.vocab},
            {"max_position_embeddings", s.ctx},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", s.tied},
            {"torch_dtype", "bfloat16"}};
  if (s.model_type == "mixtral") {
    j["num_local_experts"] = s.experts;
    j["num_experts_per_tok"] = s.experts_used;
  } else if (s.model_type == "qwen2_moe") {
    j["num_experts"] = s.experts;
    j["num_experts_per_tok"] = s.experts_used;
    j["moe_intermediate_size"] = s.ffn;
    j["shared_expert_intermediate_size"] = s.shared_ffn;
    j["norm_topk_prob"] = s.norm_topk;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = json::array();
    j["intermediate_size"] = 4 * s.ffn;  // (the dense layers' width, unused: every layer is MoE)
  }
  return j;
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("troupe_hf_" + std::to_string(::getpid()) + "_" + tag + "_" + std::to_string(++counter));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string str() const { return path.string(); }
};

void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
void write_hf_dir(const TempDir& d, const Spec& s, const HfWeights& w, DType t, const json& config) {
  write_text(d.path / "config.json", config.dump(2));
  write_safetensors(d.path / "model.safetensors", w, t);
  json vocab = json::object();
  const auto toks = vocab_tokens(s.vocab);
  for (size_t i = 0; i < toks.size(); ++i) vocab[toks[i]] = i;
  json tj = {{"added_tokens",
              {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
               {{"id", 1}, {"content", "<s>"}, {"special", true}},
               {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
             {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"unk_token", "<unk>"}}}};
  write_text(d.path / "tokenizer.json", tj.dump());
  write_text(
      d.path / "tokenizer_config.json",
      json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}, {"chat_template", kChatTemplate}}
          .dump());
}

// convert_hf_to_gguf.py (LlamaModel.permute):
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
// so GGUF row h*hd + 2i + j is HF row h*hd + j*hd/2 + i: NeoX pairs (i, i + hd/2) become
// interleaved pairs (2i, 2i + 1).
std::vector<float> permute_rows(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head) {
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t dst = h * hd + 2 * i + j, src = h * hd + j * half + i;
        std::memcpy(out.data() + dst * cols, w.data() + src * cols, static_cast<size_t>(cols) * 4);
      }
  return out;
}

// The same weights as a GGUF file (F32), with the tensor names written out here rather
// than taken from the loader, and Q/K permuted when `permute_qk`.
void write_gguf(const std::string& path, const Spec& s, const HfWeights& w, bool permute_qk,
                const std::vector<int32_t>& expert_order = {}) {
  gguf::Writer g;
  // llama.cpp writes Mixtral as llama; qwen2_moe is qwen2moe.
  const std::string a = s.model_type == "mixtral" ? "llama" : s.model_type == "qwen2_moe" ? "qwen2moe" : s.model_type;
  g.add_string("general.architecture", a);
  g.add_string("general.name", "hf-twin");
  g.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  g.add_u32(a + ".context_length", static_cast<uint32_t>(s.ctx));
  g.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden));
  g.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.ffn));
  g.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  g.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  g.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  g.add_f32(a + ".rope.freq_base", 10000.0f);
  if (s.experts > 0) {
    g.add_u32(a + ".expert_count", static_cast<uint32_t>(s.experts));
    g.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.experts_used));
  }
  if (a == "qwen2moe") {
    g.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.ffn));
    g.add_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(s.shared_ffn));
  }
  const auto toks = vocab_tokens(s.vocab);
  std::vector<int32_t> types(toks.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  std::vector<float> scores(toks.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -static_cast<float>(i);
  g.add_string("tokenizer.ggml.model", "llama");
  g.add_string_array("tokenizer.ggml.tokens", toks);
  g.add_f32_array("tokenizer.ggml.scores", scores);
  g.add_i32_array("tokenizer.ggml.token_type", types);
  g.add_u32("tokenizer.ggml.bos_token_id", 1);
  g.add_u32("tokenizer.ggml.eos_token_id", 2);

  auto put = [&](const std::string& gguf_name, const std::string& hf_name, int64_t permute_heads = 0) {
    const HfTensor& t = w.at(hf_name);
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    const auto v = permute_heads ? permute_rows(t.v, t.shape[0], t.shape[1], permute_heads) : t.v;
    g.add_tensor(gguf_name, DType::F32, std::move(ne), to_bytes(v, DType::F32));
  };
  put("token_embd.weight", "model.embed_tokens.weight");
  put("output_norm.weight", "model.norm.weight");
  if (!s.tied) put("output.weight", "lm_head.weight");
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    put(p + "attn_norm.weight", h + "input_layernorm.weight");
    put(p + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    put(p + "attn_q.weight", h + "self_attn.q_proj.weight", permute_qk ? s.heads : 0);
    put(p + "attn_k.weight", h + "self_attn.k_proj.weight", permute_qk ? s.kv_heads : 0);
    put(p + "attn_v.weight", h + "self_attn.v_proj.weight");
    put(p + "attn_output.weight", h + "self_attn.o_proj.weight");
    // Experts stacked [cols, rows, experts] in `expert_order` (default: 0, 1, ...).
    auto stack = [&](const std::string& gguf_name, const std::string& prefix, const std::string& part) {
      std::vector<float> all;
      std::vector<int64_t> shape;
      for (int32_t i = 0; i < s.experts; ++i) {
        const int32_t e = expert_order.empty() ? i : expert_order[i];
        const HfTensor& t = w.at(prefix + std::to_string(e) + "." + part);
        all.insert(all.end(), t.v.begin(), t.v.end());
        shape = t.shape;
      }
      g.add_tensor(gguf_name, DType::F32,
                   {static_cast<uint64_t>(shape[1]), static_cast<uint64_t>(shape[0]), static_cast<uint64_t>(s.experts)},
                   to_bytes(all, DType::F32));
    };
    if (s.experts == 0) {
      put(p + "ffn_gate.weight", h + "mlp.gate_proj.weight");
      put(p + "ffn_up.weight", h + "mlp.up_proj.weight");
      put(p + "ffn_down.weight", h + "mlp.down_proj.weight");
    } else if (s.model_type == "mixtral") {
      put(p + "ffn_gate_inp.weight", h + "block_sparse_moe.gate.weight");
      stack(p + "ffn_gate_exps.weight", h + "block_sparse_moe.experts.", "w1.weight");
      stack(p + "ffn_up_exps.weight", h + "block_sparse_moe.experts.", "w3.weight");
      stack(p + "ffn_down_exps.weight", h + "block_sparse_moe.experts.", "w2.weight");
    } else {
      put(p + "ffn_gate_inp.weight", h + "mlp.gate.weight");
      stack(p + "ffn_gate_exps.weight", h + "mlp.experts.", "gate_proj.weight");
      stack(p + "ffn_up_exps.weight", h + "mlp.experts.", "up_proj.weight");
      stack(p + "ffn_down_exps.weight", h + "mlp.experts.", "down_proj.weight");
      put(p + "ffn_gate_shexp.weight", h + "mlp.shared_expert.gate_proj.weight");
      put(p + "ffn_up_shexp.weight", h + "mlp.shared_expert.up_proj.weight");
      put(p + "ffn_down_shexp.weight", h + "mlp.shared_expert.down_proj.weight");
      // GGUF keeps the shared expert's gate as a vector [hidden].
      const HfTensor& sg = w.at(h + "mlp.shared_expert_gate.weight");
      g.add_tensor(p + "ffn_gate_inp_shexp.weight", DType::F32, {static_cast<uint64_t>(s.hidden)},
                   to_bytes(sg.v, DType::F32));
    }
    if (s.bias) {
      put(p + "attn_q.bias", h + "self_attn.q_proj.bias");
      put(p + "attn_k.bias", h + "self_attn.k_proj.bias");
      put(p + "attn_v.bias", h + "self_attn.v_proj.bias");
    }
  }
  REQUIRE(g.write(path).ok());
}

const std::vector<std::vector<int32_t>> kFeeds = {{1, 7, 30, 12, 44, 3, 19, 19, 25, 40, 8}, {33}, {5}};

// Logits after each feed (prompt in chunks of 4, then two decode steps), concatenated.
std::vector<float> run(const ModelFiles& m) {
  auto backend = make_cpu_backend({1});
  auto model = Model::build(m.config, *m.weights, *backend, 4);
  if (!model) FAIL(m.path << ": " << model.error().message);
  auto runner = SequenceRunner::create(**model, *backend, 32);
  REQUIRE(runner.ok());
  std::vector<float> out;
  for (const auto& f : kFeeds) {
    auto l = (*runner)->feed(f);
    if (!l) FAIL(l.error().message);
    out.insert(out.end(), *l, *l + m.config.vocab);
  }
  for (float x : out) REQUIRE(std::isfinite(x));
  return out;
}

std::vector<float> open_and_run(const std::string& path) {
  auto m = open_model(path);
  if (!m) FAIL(path << ": " << m.error().message);
  return run(*m);
}

// max |a - b| / max |b|.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double err = 0, range = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    range = std::max(range, static_cast<double>(std::fabs(b[i])));
  }
  REQUIRE(range > 0);
  return err / range;
}

}  // namespace

TEST_CASE("an HF Llama directory and its permuted GGUF give the same logits", "[model][hf]") {
  const Spec s;
  const HfWeights w = make_weights(s);
  TempDir f32("f32"), bf16("bf16"), gg("gguf");
  write_hf_dir(f32, s, w, DType::F32, hf_config(s));
  write_hf_dir(bf16, s, w, DType::BF16, hf_config(s));
  const std::string gguf_path = (gg.path / "twin.gguf").string(), plain_path = (gg.path / "unpermuted.gguf").string();
  write_gguf(gguf_path, s, w, /*permute_qk=*/true);
  write_gguf(plain_path, s, w, /*permute_qk=*/false);

  auto hf = open_model(f32.str());
  if (!hf) FAIL(hf.error().message);
  CHECK(hf->format == "safetensors");
  CHECK(hf->config.arch == "llama");
  CHECK(hf->config.rope_kind == RopeKind::Neox);
  CHECK(hf->config.num_kv_heads == 2);
  CHECK(hf->config.head_dim == 16);
  CHECK_FALSE(hf->config.tied_embeddings);
  CHECK(hf->chat_template == kChatTemplate);
  REQUIRE(hf->tokenizer.has_value());
  CHECK(hf->tokenizer->vocab_size() == s.vocab);
  CHECK(hf->tokenizer->bos_id() == 1);
  CHECK(hf->tokenizer->eos_id() == 2);
  CHECK(hf->weights->find("blk.1.attn_q.weight"));
  CHECK(hf->weights->find("blk.1.attn_q.weight")->shape == std::vector<int64_t>{s.hidden, s.heads * s.head_dim()});

  auto gm = open_model(gguf_path);
  if (!gm) FAIL(gm.error().message);
  CHECK(gm->config.rope_kind == RopeKind::Interleaved);

  const auto ref = run(*gm);
  const auto from_f32 = run(*hf);
  const auto from_bf16 = open_and_run(bf16.str());
  CHECK(rel_error(from_f32, ref) < 1e-3);
  CHECK(rel_error(from_bf16, ref) < 1e-3);
  CHECK(rel_error(from_bf16, from_f32) < 1e-4);
  // The comparison has power: without the permutation, interleaved RoPE pairs the wrong
  // dimensions and the logits move by a lot more than the tolerance.
  const double wrong = rel_error(open_and_run(plain_path), ref);
  INFO("unpermuted GGUF relative error " << wrong);
  CHECK(wrong > 2e-2);
}

TEST_CASE("an HF Qwen2 directory with q/k/v biases matches its GGUF", "[model][hf]") {
  Spec s;
  s.model_type = "qwen2";
  s.bias = true;
  s.seed = 9;
  const HfWeights w = make_weights(s);
  TempDir d("qwen2"), gg("qwen2_gguf");
  write_hf_dir(d, s, w, DType::BF16, hf_config(s));
  // llama.cpp does not permute Qwen2 (NeoX RoPE in both formats).
  const std::string gguf_path = (gg.path / "qwen2.gguf").string();
  write_gguf(gguf_path, s, w, /*permute_qk=*/false);
  auto m = open_model(d.str());
  if (!m) FAIL(m.error().message);
  CHECK(m->config.arch == "qwen2");
  CHECK(m->config.qkv_bias);
  CHECK(m->weights->find("blk.0.attn_k.bias"));
  const auto hf = run(*m);
  CHECK(rel_error(hf, open_and_run(gguf_path)) < 1e-3);

  // The biases are used: the same weights without them give other logits.
  HfWeights no_bias = w;
  for (auto& [name, t] : no_bias)
    if (name.find("_proj.bias") != std::string::npos) std::fill(t.v.begin(), t.v.end(), 0.0f);
  TempDir z("qwen2_zero_bias");
  write_hf_dir(z, s, no_bias, DType::BF16, hf_config(s));
  CHECK(rel_error(open_and_run(z.str()), hf) > 1e-2);
}

TEST_CASE("HF mixture-of-experts directories (per-expert tensors) match their GGUF (stacked)", "[model][hf][moe]") {
  Spec s;
  s.model_type = GENERATE(as<std::string>{}, "mixtral", "qwen2_moe");
  INFO("model_type " << s.model_type);
  const bool qwen = s.model_type == "qwen2_moe";
  s.experts = qwen ? 6 : 4;
  s.experts_used = 2;
  s.ffn = 32;
  s.shared_ffn = qwen ? 48 : 0;
  s.bias = qwen;
  s.norm_topk = !qwen;
  s.seed = qwen ? 13 : 12;
  const HfWeights w = make_weights(s);
  TempDir d("moe"), gg("moe_gguf");
  write_hf_dir(d, s, w, DType::F32, hf_config(s));
  const std::string gguf_path = (gg.path / "moe.gguf").string(), shuffled = (gg.path / "shuffled.gguf").string();
  write_gguf(gguf_path, s, w, /*permute_qk=*/!qwen);
  std::vector<int32_t> order(static_cast<size_t>(s.experts));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[0], order[1]);
  write_gguf(shuffled, s, w, /*permute_qk=*/!qwen, order);

  auto m = open_model(d.str());
  if (!m) FAIL(m.error().message);
  CHECK(m->config.moe.num_experts == s.experts);
  CHECK(m->config.moe.experts_per_tok == 2);
  CHECK(m->config.moe.expert_ffn == s.ffn);
  CHECK(m->config.moe.shared_ffn == s.shared_ffn);
  CHECK(m->config.moe.norm_topk_prob == s.norm_topk);
  CHECK(m->weights->find("blk.1.ffn_down.3.weight"));
  CHECK(m->weights->find("blk.0.ffn_gate_inp.weight"));
  auto gm = open_model(gguf_path);
  if (!gm) FAIL(gm.error().message);
  CHECK(gm->config.moe.num_experts == s.experts);
  CHECK(gm->config.moe.norm_topk_prob == s.norm_topk);
  const auto hf = run(*m);
  CHECK(rel_error(hf, run(*gm)) < 1e-3);
  // Power: the stacked order is the expert id; swapping two experts' slices moves the logits.
  const double wrong = rel_error(open_and_run(shuffled), hf);
  INFO("experts 0 and 1 swapped: relative error " << wrong);
  CHECK(wrong > 1e-2);
}

TEST_CASE("tied embeddings: no lm_head, the embedding table is the output", "[model][hf]") {
  Spec s;
  s.tied = true;
  const HfWeights w = make_weights(s);
  REQUIRE(w.count("lm_head.weight") == 0);
  TempDir tied("tied");
  write_hf_dir(tied, s, w, DType::F32, hf_config(s));
  auto m = open_model(tied.str());
  if (!m) FAIL(m.error().message);
  CHECK(m->config.tied_embeddings);
  const auto logits = run(*m);

  // The same model with lm_head = embed_tokens written out.
  HfWeights untied = w;
  untied["lm_head.weight"] = w.at("model.embed_tokens.weight");
  Spec us = s;
  us.tied = false;
  TempDir explicit_head("explicit_head");
  write_hf_dir(explicit_head, us, untied, DType::F32, hf_config(us));
  CHECK(rel_error(open_and_run(explicit_head.str()), logits) < 1e-5);

  // Untied config without lm_head: a clear error naming the tensor.
  TempDir missing("missing_head");
  write_hf_dir(missing, us, w, DType::F32, hf_config(us));
  auto mm = open_model(missing.str());
  REQUIRE(mm.ok());
  auto backend = make_cpu_backend({1});
  auto model = Model::build(mm->config, *mm->weights, *backend, 4);
  REQUIRE_FALSE(model.ok());
  CHECK_THAT(model.error().message, Catch::Contains("output.weight"));
}

TEST_CASE("config.json errors name the problem", "[model][hf][badinput]") {
  const Spec s;
  const HfWeights w = make_weights(s);
  auto error_for = [&](const json& config) {
    TempDir d("cfg");
    write_hf_dir(d, s, w, DType::F32, config);
    auto m = open_model(d.str());
    REQUIRE_FALSE(m.ok());
    REQUIRE(m.error().message.find('\n') == std::string::npos);
    return m.error().message;
  };
  for (const char* field :
       {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"}) {
    json c = hf_config(s);
    c.erase(field);
    INFO("without " << field);
    const std::string e = error_for(c);
    CHECK_THAT(e, Catch::Contains(field) && Catch::Contains("config.json"));
  }
  {
    json c = hf_config(s);
    c["model_type"] = "gpt_neox";
    const std::string e = error_for(c);
    CHECK_THAT(e, Catch::Contains("unsupported model_type 'gpt_neox'"));
    CHECK_THAT(e, Catch::Contains("llama"));  // lists what is supported
  }
  {
    json c = hf_config(s);
    c["model_type"] = 7;  // not a string: an error, not an exception
    CHECK_THAT(error_for(c), Catch::Contains("model_type"));
  }
  {
    json c = hf_config(s);
    c["hidden_size"] = "64";
    CHECK_THAT(error_for(c), Catch::Contains("hidden_size"));
    c["hidden_size"] = 4294967360ull;  // 2^32 + 64 must not truncate to 64
    CHECK_THAT(error_for(c), Catch::Contains("hidden_size"));
    c["hidden_size"] = 64.5;
    CHECK_THAT(error_for(c), Catch::Contains("hidden_size"));
  }
  {
    json c = hf_config(s);
    c["num_attention_heads"] = 0;
    CHECK_THAT(error_for(c), Catch::Contains("num_heads"));
    c = hf_config(s);
    c["num_key_value_heads"] = 3;
    CHECK_THAT(error_for(c), Catch::Contains("num_kv_heads"));
    c = hf_config(s);
    c["rms_norm_eps"] = "small";
    CHECK_THAT(error_for(c), Catch::Contains("rms_norm_eps"));
    c = hf_config(s);
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    CHECK_THAT(error_for(c), Catch::Contains("rope_scaling") && Catch::Contains("yarn"));
    c = hf_config(s);
    c["vocab_size"] = s.vocab - 1;  // the tokenizer has more tokens than the model
    CHECK_THAT(error_for(c), Catch::Contains("tokenizer"));
  }
  {
    TempDir d("notjson");
    write_hf_dir(d, s, w, DType::F32, hf_config(s));
    write_text(d.path / "config.json", "{\"hidden_size\": ");
    auto m = open_model(d.str());
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("config.json") && Catch::Contains("not JSON"));
    std::filesystem::remove(d.path / "config.json");
    m = open_model(d.str());
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message, Catch::Contains("config.json"));
  }
  {
    // A tokenizer_config.json with odd chat_template entries is ignored, not fatal.
    TempDir d("odd_template");
    write_hf_dir(d, s, w, DType::F32, hf_config(s));
    write_text(
        d.path / "tokenizer_config.json",
        json{{"chat_template", {{{"name", 5}, {"template", "x"}}, {{"name", "default"}, {"template", "T"}}}}}.dump());
    auto m = open_model(d.str());
    if (!m) FAIL(m.error().message);
    CHECK(m->chat_template == "T");
  }
}

TEST_CASE("config.json: Llama 3.1 rope_scaling, null and optional fields", "[model][hf]") {
  const Architecture* llama = find_architecture("llama");
  REQUIRE(llama);
  json c = hf_config(Spec{});
  c["rope_scaling"] = {{"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192},
                       {"rope_type", "llama3"}};
  c["head_dim"] = nullptr;             // some configs write null for "derive it"
  c["num_key_value_heads"] = nullptr;  // null: as many as the query heads
  c["_name_or_path"] = "meta-llama/Llama-3.1-8B";
  auto cfg = llama->from_hf(c);
  if (!cfg) FAIL(cfg.error().message);
  CHECK(cfg->name == "meta-llama/Llama-3.1-8B");
  CHECK(cfg->rope_scaling.type == "llama3");
  CHECK(cfg->rope_scaling.factor == 8.0f);
  CHECK(cfg->rope_scaling.original_max_position == 8192);
  CHECK(cfg->head_dim == 16);
  CHECK(cfg->num_kv_heads == 4);
  c.erase("max_position_embeddings");
  c.erase("rms_norm_eps");
  c.erase("rope_theta");
  c["head_dim"] = 32;  // explicit head_dim wins over hidden / heads
  cfg = llama->from_hf(c);
  if (!cfg) FAIL(cfg.error().message);
  CHECK(cfg->max_context == 4096);
  CHECK(cfg->rms_eps == 1e-5f);
  CHECK(cfg->rope_theta == 10000.0f);
  CHECK(cfg->head_dim == 32);
  c["rope_scaling"] = "llama3";
  auto bad = llama->from_hf(c);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message, Catch::Contains("rope_scaling"));
}
