// A tiny Llama-shaped model written with the project's own GGUF writer: random weights of
// several types (so fused and unfused projections, every matmul kind and untied output
// are exercised) and a small SentencePiece-style vocabulary. With `experts`, a mixture of
// experts in llama.cpp's layout: a Mixtral (arch llama) or a Qwen2-MoE (arch qwen2moe, with
// q/k/v biases and a gated shared expert), stacked *_exps tensors.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "runtime/format/gguf.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::test {

struct TinyModelSpec {
  int32_t layers = 2, hidden = 256, heads = 4, kv_heads = 2, ffn = 512, ctx = 256;
  std::string arch = "llama";
  uint64_t seed = 11;
  int32_t experts = 0, experts_used = 0, expert_ffn = 128, shared_ffn = 0;
  float router_scale = 4.0f;  // large router logits: top-k choices far from ties
  // Hostile variants: the expert count written in the metadata (-1: `experts`), a NaN router weight.
  int32_t expert_count_meta = -1, expert_ffn_meta = -1;
  bool nan_router = false;
};

inline int32_t tiny_vocab_size() { return 3 + 256 + 5; }

inline gguf::Writer tiny_model_writer(const TinyModelSpec& s = {}) {
  gguf::Writer w;
  const std::string a = s.arch;
  w.add_string("general.architecture", a);
  w.add_string("general.name", "tiny-test");
  w.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  w.add_u32(a + ".context_length", static_cast<uint32_t>(s.ctx));
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden));
  // (Mixtral's experts are llama's feed_forward_length wide)
  const int32_t expert_ffn_meta = s.expert_ffn_meta >= 0 ? s.expert_ffn_meta : s.expert_ffn;
  w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.experts > 0 && a == "llama" ? expert_ffn_meta : s.ffn));
  w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f32(a + ".rope.freq_base", 10000.0f);
  if (s.experts > 0) {
    w.add_u32(a + ".expert_count", static_cast<uint32_t>(s.expert_count_meta >= 0 ? s.expert_count_meta : s.experts));
    w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.experts_used));
    if (a != "llama") w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(expert_ffn_meta));
    if (s.shared_ffn > 0) w.add_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(s.shared_ffn));
  }
  // SentencePiece-style vocabulary: specials, 256 byte tokens, a few pieces.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  for (const char* p : {"\xE2\x96\x81", "a", "b",
                        "\xE2\x96\x81"
                        "a",
                        "ab"}) {
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(-static_cast<float>(tokens.size()));
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);

  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  const int64_t H = s.hidden, hd = s.hidden / s.heads, V = static_cast<int64_t>(tokens.size());
  auto mat = [&](const std::string& name, DType t, int64_t cols, int64_t rows, float scale) {
    std::vector<uint8_t> data = random_weight(t, rows, cols, rng, false, scale);
    w.add_tensor(name, t, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, std::move(data));
  };
  auto vec = [&](const std::string& name, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    std::normal_distribution<float> nd(1.0f, 0.1f);
    for (auto& x : v) x = nd(rng);
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    w.add_tensor(name, DType::F32, {static_cast<uint64_t>(n)}, std::move(b));
  };
  mat("token_embd.weight", DType::Q8_0, H, V, 1.0f);
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", H);
    vec(p + "ffn_norm.weight", H);
    mat(p + "attn_q.weight", DType::Q4_1, H, s.heads * hd, ws);
    mat(p + "attn_k.weight", DType::Q4_1, H, s.kv_heads * hd, ws);
    // Layer 0 fuses Q/K/V (same type); layer 1 cannot (V is Q6_K).
    mat(p + "attn_v.weight", l == 0 ? DType::Q4_1 : DType::Q6_K, H, s.kv_heads * hd, ws);
    mat(p + "attn_output.weight", DType::Q4_0, s.heads * hd, H, ws);
    if (a == "qwen2" || a == "qwen2moe") {
      vec(p + "attn_q.bias", s.heads * hd);
      vec(p + "attn_k.bias", s.kv_heads * hd);
      vec(p + "attn_v.bias", s.kv_heads * hd);
    }
    if (s.experts == 0) {
      mat(p + "ffn_gate.weight", DType::Q5_0, H, s.ffn, ws);
      mat(p + "ffn_up.weight", l == 0 ? DType::Q5_0 : DType::F16, H, s.ffn, ws);
      mat(p + "ffn_down.weight", l == 0 ? DType::Q4_K : DType::Q8_0, s.ffn, H,
          1.0f / std::sqrt(static_cast<float>(s.ffn)));
      continue;
    }
    // Stacked experts [cols, rows, experts]; layer 0 fuses gate and up (same type), layer 1 cannot.
    const int64_t F = s.expert_ffn, E = s.experts;
    auto stacked = [&](const std::string& name, DType t, int64_t cols, int64_t rows, float scale) {
      std::vector<uint8_t> data;
      for (int64_t e = 0; e < E; ++e) {
        auto one = random_weight(t, rows, cols, rng, false, scale);
        data.insert(data.end(), one.begin(), one.end());
      }
      w.add_tensor(name, t, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), static_cast<uint64_t>(E)},
                   std::move(data));
    };
    {
      std::vector<uint8_t> r = random_weight(DType::F32, E, H, rng, false, s.router_scale * ws);
      if (s.nan_router) {
        const float nan = std::nanf("");
        std::memcpy(r.data() + 4 * (H + 3), &nan, 4);
      }
      w.add_tensor(p + "ffn_gate_inp.weight", DType::F32, {static_cast<uint64_t>(H), static_cast<uint64_t>(E)},
                   std::move(r));
    }
    stacked(p + "ffn_gate_exps.weight", l == 0 ? DType::Q8_0 : DType::Q4_K, H, F, ws);
    stacked(p + "ffn_up_exps.weight", l == 0 ? DType::Q8_0 : DType::Q5_0, H, F, ws);
    stacked(p + "ffn_down_exps.weight", l == 0 ? DType::Q8_0 : DType::Q4_1, F, H,
            1.0f / std::sqrt(static_cast<float>(F)));
    if (s.shared_ffn > 0) {
      const int64_t S = s.shared_ffn;
      mat(p + "ffn_gate_shexp.weight", DType::Q8_0, H, S, ws);
      mat(p + "ffn_up_shexp.weight", DType::Q8_0, H, S, ws);
      mat(p + "ffn_down_shexp.weight", DType::Q8_0, S, H, 1.0f / std::sqrt(static_cast<float>(S)));
      std::vector<float> g(static_cast<size_t>(H));
      std::normal_distribution<float> nd(0.0f, ws);
      for (auto& x : g) x = nd(rng);
      std::vector<uint8_t> b(g.size() * 4);
      std::memcpy(b.data(), g.data(), b.size());
      w.add_tensor(p + "ffn_gate_inp_shexp.weight", DType::F32, {static_cast<uint64_t>(H)}, std::move(b));
    }
  }
  vec("output_norm.weight", H);
  mat("output.weight", DType::Q5_1, H, V, ws);
  return w;
}

}  // namespace troupe::test
