// The default model as a Hugging Face directory: its GGUF tensors dequantized (reference
// dequantizers), Q/K rows put back in HF's order (the inverse of convert_hf_to_gguf.py's
// permute), stored as BF16 in model.safetensors with a config.json and a placeholder
// tokenizer (the tests feed token ids). Real weights in the layout a bf16 checkpoint has,
// without downloading one.
#pragma once
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/quant_ref.h"
#include "kernels/fp16.h"
#include "runtime/model/model_files.h"
#include "tests/runtime/safetensors_writer.h"

namespace troupe::test {

struct BfDir {
  std::filesystem::path path;
  BfDir() {
    path = std::filesystem::temp_directory_path() / ("troupe_bf16_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~BfDir() { std::filesystem::remove_all(path); }
  BfDir(const BfDir&) = delete;
  BfDir& operator=(const BfDir&) = delete;
};

// HF row order from GGUF's: GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i.
inline std::vector<float> unpermute_rows(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head) {
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(out.data() + (h * hd + j * half + i) * cols, w.data() + (h * hd + 2 * i + j) * cols,
                    static_cast<size_t>(cols) * 4);
  return out;
}

// Writes the directory; the error text is empty on success.
inline std::string write_bf16_hf_dir(const ModelFiles& gguf, const std::filesystem::path& dir) {
  using nlohmann::json;
  const ModelConfig& c = gguf.config;
  if (c.arch != "llama") return "only llama GGUFs are converted here (got " + c.arch + ")";
  auto hf_name = [](const std::string& g) -> std::string {
    if (g == "token_embd.weight") return "model.embed_tokens.weight";
    if (g == "output_norm.weight") return "model.norm.weight";
    if (g == "output.weight") return "lm_head.weight";
    if (g.rfind("blk.", 0) != 0) return "";
    const size_t dot = g.find('.', 4);
    const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
    const std::string p = "model.layers." + layer + ".";
    static const std::pair<const char*, const char*> map[] = {
        {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    for (const auto& [from, to] : map)
      if (rest == from) return p + to;
    return "";
  };
  SafetensorsWriter st;
  std::vector<uint8_t> bf;
  for (const auto& [name, t] : gguf.weights->tensors()) {
    const std::string hf = hf_name(name);
    if (hf.empty()) return "no Hugging Face name for GGUF tensor " + name;
    const int64_t cols = t.shape[0], rows = t.rows();
    std::vector<float> v(static_cast<size_t>(rows * cols));
    const auto row_bytes = troupe::row_bytes(t.type, static_cast<uint64_t>(cols));
    if (!row_bytes) return "tensor " + name + ": bad row size";
    for (int64_t r = 0; r < rows; ++r)
      if (!cpu::dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + *row_bytes * r, v.data() + r * cols,
                                   cols))
        return "tensor " + name + ": no reference dequantizer";
    if (name.find("attn_q.weight") != std::string::npos) v = unpermute_rows(v, rows, cols, c.num_heads);
    if (name.find("attn_k.weight") != std::string::npos) v = unpermute_rows(v, rows, cols, c.num_kv_heads);
    bf.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t b = f32_to_bf16(v[i]);
      std::memcpy(bf.data() + 2 * i, &b, 2);
    }
    st.add(hf, "BF16", t.shape.size() == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols}, bf.data(),
           bf.size());
  }
  if (!st.write(dir / "model.safetensors")) return "could not write " + (dir / "model.safetensors").string();
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"hidden_size", c.hidden},
                       {"intermediate_size", c.ffn},
                       {"num_attention_heads", c.num_heads},
                       {"num_hidden_layers", c.num_layers},
                       {"num_key_value_heads", c.num_kv_heads},
                       {"vocab_size", c.vocab},
                       {"max_position_embeddings", c.max_context},
                       {"rms_norm_eps", c.rms_eps},
                       {"rope_theta", c.rope_theta},
                       {"rope_scaling", nullptr},
                       {"tie_word_embeddings", !gguf.weights->find("output.weight")},
                       {"torch_dtype", "bfloat16"}};
  std::ofstream(dir / "config.json") << config.dump(2);
  // A placeholder BPE vocabulary of the model's size (the tests never tokenize text).
  json vocab = json::object();
  vocab["<unk>"] = 0;
  for (int32_t i = 1; i < c.vocab; ++i) vocab["t" + std::to_string(i)] = i;
  const json tok = {{"added_tokens", {{{"id", 0}, {"content", "<unk>"}, {"special", true}}}},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"unk_token", "<unk>"}}}};
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  return {};
}

}  // namespace troupe::test
