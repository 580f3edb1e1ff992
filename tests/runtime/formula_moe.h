// Tiny MoE GGUFs whose every weight is a formula of (tensor name, element index), so that
// tests/golden/moe/make_golden.py (numpy + gguf-py) and this header (gguf::Writer) write the
// same model without sharing a file: value = scale * u, u = splitmix64(fnv1a64(name) + i)
// mapped to [-1, 1) through its top 53 bits; norms are 1 + 0.1 u. F32 tensors hold the same
// bits in both files; the quantized variants quantize the matmul weights with each side's
// reference quantizer (ggml's algorithm both), which may round a value differently. Keep
// the two in step: the script's docstring lists the shapes.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/quant_ref.h"
#include "runtime/format/gguf.h"

namespace troupe::test {

inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::vector<float> formula_values(const std::string& name, size_t n, double scale, double offset) {
  std::vector<float> v(n);
  const uint64_t base = fnv1a64(name);
  for (size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(base + i) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    v[i] = static_cast<float>(offset + scale * u);
  }
  return v;
}

struct FormulaMoeSpec {
  std::string arch = "llama";  // llama (Mixtral) or qwen2moe
  int32_t layers = 2, hidden = 128, heads = 4, kv_heads = 2, experts = 4, experts_used = 2, expert_ffn = 64,
          shared_ffn = 0, ctx = 128;
  DType matmul_type = DType::F32;  // attention, experts, shared expert, output
};

inline FormulaMoeSpec formula_spec(const std::string& which) {
  FormulaMoeSpec s;
  if (which == "mixtral_q8_0") s.matmul_type = DType::Q8_0;
  if (which == "qwen3moe" || which == "olmoe") {
    s.arch = which;
    s.experts = 8;
    s.experts_used = which == "olmoe" ? 4 : 2;
    if (which == "olmoe") s.kv_heads = 4;  // (llama.cpp's olmoe has no GQA)
    s.expert_ffn = 32;
  }
  if (which == "qwen2moe" || which == "qwen2moe_q4_1") {
    if (which == "qwen2moe_q4_1") s.matmul_type = DType::Q4_1;
    s.arch = "qwen2moe";
    s.experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 32;
    s.shared_ffn = 96;
  }
  return s;
}

// Specials <unk> <s> </s>, the 256 byte tokens, then "▁", "a", "b", "▁a", "ab" (264 tokens).
inline std::vector<std::string> formula_vocab() {
  std::vector<std::string> t = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    t.push_back(buf);
  }
  for (const char* p : {"\xE2\x96\x81", "a", "b",
                        "\xE2\x96\x81"
                        "a",
                        "ab"})
    t.push_back(p);
  return t;
}

inline gguf::Writer formula_moe_writer(const FormulaMoeSpec& s) {
  gguf::Writer w;
  const std::string a = s.arch;
  const int64_t H = s.hidden, hd = s.hidden / s.heads, E = s.experts, F = s.expert_ffn, S = s.shared_ffn;
  const auto vocab = formula_vocab();
  const int64_t V = static_cast<int64_t>(vocab.size());
  w.add_string("general.architecture", a);
  w.add_string("general.name", "formula-moe");
  w.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  w.add_u32(a + ".context_length", static_cast<uint32_t>(s.ctx));
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(H));
  w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(a == "llama" || a == "olmoe" ? F : 4 * F));
  w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f32(a + ".rope.freq_base", 10000.0f);
  w.add_u32(a + ".expert_count", static_cast<uint32_t>(E));
  w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.experts_used));
  if (a == "qwen2moe" || a == "qwen3moe") w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(F));
  if (a == "qwen2moe") w.add_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(S));
  std::vector<int32_t> types(vocab.size(), 1);
  std::vector<float> scores(vocab.size(), 0.0f);
  types[0] = 2;
  types[1] = types[2] = 3;
  for (size_t i = 3; i < 259; ++i) types[i] = 6;
  for (size_t i = 259; i < vocab.size(); ++i) scores[i] = -static_cast<float>(i);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", vocab);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  // ne as GGUF writes it (ne[0] the row length); values [prod(ne)] row-major.
  auto put = [&](const std::string& name, std::vector<uint64_t> ne, double scale, double offset = 0,
                 bool quant = false) {
    size_t n = 1;
    for (uint64_t d : ne) n *= d;
    const auto v = formula_values(name, n, scale, offset);
    if (quant && s.matmul_type != DType::F32) {
      const int64_t cols = static_cast<int64_t>(ne[0]);
      const size_t rb = *row_bytes(s.matmul_type, ne[0]), rows = n / ne[0];
      std::vector<uint8_t> b(rb * rows);
      for (size_t r = 0; r < rows; ++r)
        cpu::quantize_row_ref(s.matmul_type, v.data() + r * cols, b.data() + r * rb, cols);
      w.add_tensor(name, s.matmul_type, std::move(ne), std::move(b));
      return;
    }
    std::vector<uint8_t> b(n * 4);
    std::memcpy(b.data(), v.data(), b.size());
    w.add_tensor(name, DType::F32, std::move(ne), std::move(b));
  };
  auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const double ws = 1.0 / std::sqrt(static_cast<double>(H));
  put("token_embd.weight", {u(H), u(V)}, 1.0);
  put("output_norm.weight", {u(H)}, 0.1, 1.0);
  put("output.weight", {u(H), u(V)}, ws, 0, true);
  for (int32_t l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    put(p + "attn_norm.weight", {u(H)}, 0.1, 1.0);
    put(p + "ffn_norm.weight", {u(H)}, 0.1, 1.0);
    put(p + "attn_q.weight", {u(H), u(s.heads * hd)}, 3 * ws, 0, true);
    put(p + "attn_k.weight", {u(H), u(s.kv_heads * hd)}, 3 * ws, 0, true);
    put(p + "attn_v.weight", {u(H), u(s.kv_heads * hd)}, ws, 0, true);
    put(p + "attn_output.weight", {u(s.heads * hd), u(H)}, ws, 0, true);
    if (a == "qwen3moe") {  // per-head Q/K norms
      put(p + "attn_q_norm.weight", {u(hd)}, 0.1, 1.0);
      put(p + "attn_k_norm.weight", {u(hd)}, 0.1, 1.0);
    }
    if (a == "olmoe") {  // Q/K norms over the whole projection
      put(p + "attn_q_norm.weight", {u(s.heads * hd)}, 0.1, 1.0);
      put(p + "attn_k_norm.weight", {u(s.kv_heads * hd)}, 0.1, 1.0);
    }
    if (a == "qwen2moe") {
      put(p + "attn_q.bias", {u(s.heads * hd)}, 0.5);
      put(p + "attn_k.bias", {u(s.kv_heads * hd)}, 0.5);
      put(p + "attn_v.bias", {u(s.kv_heads * hd)}, 0.5);
    }
    put(p + "ffn_gate_inp.weight", {u(H), u(E)}, 4 * ws);
    put(p + "ffn_gate_exps.weight", {u(H), u(F), u(E)}, ws, 0, true);
    put(p + "ffn_up_exps.weight", {u(H), u(F), u(E)}, ws, 0, true);
    put(p + "ffn_down_exps.weight", {u(F), u(H), u(E)}, 1.0 / std::sqrt(static_cast<double>(F)), 0, true);
    if (S > 0) {
      put(p + "ffn_gate_inp_shexp.weight", {u(H)}, ws);
      put(p + "ffn_gate_shexp.weight", {u(H), u(S)}, ws, 0, true);
      put(p + "ffn_up_shexp.weight", {u(H), u(S)}, ws, 0, true);
      put(p + "ffn_down_shexp.weight", {u(S), u(H)}, 1.0 / std::sqrt(static_cast<double>(S)), 0, true);
    }
  }
  return w;
}

// tests/golden/moe: moe.json and the logits it indexes; `ok` false when a file is missing.
struct MoeGolden {
  bool ok = false;
  nlohmann::json meta;
  std::vector<float> logits;  // per model (in kFormulaMoeModels order), prompt, position: [V]
};
inline const char* const kFormulaMoeModels[] = {"mixtral",       "qwen2moe", "mixtral_q8_0",
                                                "qwen2moe_q4_1", "qwen3moe", "olmoe"};
inline MoeGolden load_moe_golden(const std::string& dir) {
  MoeGolden g;
  std::ifstream jf(dir + "/moe.json");
  std::ifstream bf(dir + "/moe_logits.f32", std::ios::binary);
  if (!jf || !bf) return g;
  g.meta = nlohmann::json::parse(jf);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(bf)), std::istreambuf_iterator<char>());
  g.logits.resize(bytes.size() / 4);
  std::memcpy(g.logits.data(), bytes.data(), g.logits.size() * 4);
  g.ok = true;
  return g;
}

}  // namespace troupe::test
