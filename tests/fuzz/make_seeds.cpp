// Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/):
// small valid GGUF files made with the project's gguf::Writer plus hand-assembled ones for
// what the Writer cannot express, truncated and hostile GGUF files, safetensors files with
// valid and invalid headers, tokenizer texts, and the golden chat templates plus a few
// hostile ones. Deterministic: rerunning rewrites the same bytes.
//
//   cmake --build build/fuzz/cmake --target make_seeds && build/fuzz/cmake/bin/make_seeds .
//   (build/fuzz/cmake: the fuzz build that tests/fuzz/run.sh configures)
//
// Inputs that once crashed a target are kept in the corpus under names starting with
// "regress-"; this program does not touch them.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/format/gguf.h"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;
fs::path g_root;

void write_file(const std::string& dir, const std::string& name, const void* data, size_t n) {
  fs::create_directories(g_root / dir);
  std::ofstream f(g_root / dir / name, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) {
    std::fprintf(stderr, "make_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}
void write_bytes(const std::string& dir, const std::string& name, const Bytes& b) {
  write_file(dir, name, b.data(), b.size());
}
void write_text(const std::string& dir, const std::string& name, const std::string& s) {
  write_file(dir, name, s.data(), s.size());
}

// Raw GGUF assembly for what gguf::Writer cannot say (every value type, nesting, v2,
// hostile fields).
struct Raw {
  Bytes b;
  template <typename T>
  Raw& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3, uint32_t magic = 0x46554747u) {
    return put<uint32_t>(magic).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Raw& key(const std::string& k, uint32_t type) { return str(k).put<uint32_t>(type); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (auto n : ne) put<uint64_t>(n);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Raw& pad(size_t align) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
  Raw& fill(size_t n, uint8_t v = 0x5A) {
    b.insert(b.end(), n, v);
    return *this;
  }
};

Bytes data_of(size_t n, uint8_t seed) {
  Bytes d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(seed + i * 7);
  return d;
}

// ---- GGUF ----

Bytes gguf_tensors(uint32_t alignment) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "fuzz-seed");
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.embedding_length", 32);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_tensor("f32", DType::F32, {4}, data_of(16, 1));
  w.add_tensor("f16", DType::F16, {8, 2}, data_of(32, 2));
  w.add_tensor("bf16.4d", DType::BF16, {2, 1, 1, 2}, data_of(8, 3));
  w.add_tensor("q4_0", DType::Q4_0, {32, 2}, data_of(2 * 18, 4));
  w.add_tensor("q4_1", DType::Q4_1, {32}, data_of(20, 5));
  w.add_tensor("q8_0", DType::Q8_0, {32}, data_of(34, 6));
  w.add_tensor("q4_k", DType::Q4_K, {256}, data_of(144, 7));
  w.add_tensor("q6_k", DType::Q6_K, {256}, data_of(210, 8));
  return w.bytes(alignment);
}

// Mixture of experts: llama (Mixtral) and qwen2moe metadata with stacked expert tensors
// ([cols, rows, experts]); `used` above `experts` or a huge count make the hostile ones.
Bytes gguf_moe(const std::string& arch, uint32_t experts, uint32_t used, bool shared) {
  gguf::Writer w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".block_count", 1);
  w.add_u32(arch + ".context_length", 64);
  w.add_u32(arch + ".embedding_length", 32);
  w.add_u32(arch + ".feed_forward_length", 16);
  w.add_u32(arch + ".attention.head_count", 1);
  w.add_u32(arch + ".vocab_size", 64);
  w.add_u32(arch + ".expert_count", experts);
  w.add_u32(arch + ".expert_used_count", used);
  if (arch != "llama") {
    w.add_u32(arch + ".expert_feed_forward_length", 16);
    if (shared) w.add_u32(arch + ".expert_shared_feed_forward_length", 32);
  }
  const uint64_t e = std::clamp<uint64_t>(experts, 1, 4);
  w.add_tensor("blk.0.ffn_gate_inp.weight", DType::F32, {32, e}, data_of(32 * 4 * e, 11));
  w.add_tensor("blk.0.ffn_gate_exps.weight", DType::Q8_0, {32, 16, e}, data_of(34 * 16 * e, 12));
  w.add_tensor("blk.0.ffn_down_exps.weight", DType::F16, {16, 32, e}, data_of(2 * 16 * 32 * e, 13));
  if (shared) w.add_tensor("blk.0.ffn_gate_inp_shexp.weight", DType::F32, {32}, data_of(128, 14));
  return w.bytes(32);
}

std::string gpt2_byte_char(int b) {
  auto direct = [](int c) { return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  uint32_t cp = static_cast<uint32_t>(b);
  if (!direct(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !direct(c);
    cp = 256 + static_cast<uint32_t>(n);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

Bytes gguf_tokenizer_gpt2() {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(gpt2_byte_char(b));
    types.push_back(1);
  }
  const std::string G = gpt2_byte_char(' ');
  std::vector<std::string> merges = {G + " t", "h e", G + "t he", "i n", "e r"};
  for (const auto& m : merges) {
    auto sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(s);
    types.push_back(3);
  }
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "smollm");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 261);
  w.add_u32("tokenizer.ggml.eos_token_id", 263);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  return w.bytes();
}

Bytes gguf_tokenizer_spm() {
  gguf::Writer w;
  std::vector<std::string> tokens = {"<unk>",
                                     "<s>",
                                     "</s>",
                                     "<0x41>",
                                     "<0xE2>",
                                     "<0x96>",
                                     "<0x81>",
                                     "\xE2\x96\x81",
                                     "a",
                                     "b",
                                     "\xE2\x96\x81"
                                     "a",
                                     "ab"};
  std::vector<int32_t> types = {2, 3, 3, 6, 6, 6, 6, 1, 1, 1, 1, 1};
  std::vector<float> scores;
  for (size_t i = 0; i < tokens.size(); ++i) scores.push_back(-static_cast<float>(i));
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);
  return w.bytes();
}

// Every value type, nested arrays, empty strings and arrays; GGUF v2 header.
Bytes gguf_all_types(uint32_t version) {
  Raw r;
  r.header(1, 17, version);
  r.key("u8", 0).put<uint8_t>(200);
  r.key("i8", 1).put<int8_t>(-5);
  r.key("u16", 2).put<uint16_t>(60000);
  r.key("i16", 3).put<int16_t>(-300);
  r.key("u32", 4).put<uint32_t>(4000000000u);
  r.key("i32", 5).put<int32_t>(-70000);
  r.key("f32", 6).put<float>(0.5f);
  r.key("bool", 7).put<uint8_t>(1);
  r.key("string", 8).str("hello \xC3\xA9");
  r.key("empty.string", 8).str("");
  r.key("u64", 10).put<uint64_t>(~0ull);
  r.key("i64", 11).put<int64_t>(INT64_MIN);
  r.key("f64", 12).put<double>(-1e300);
  r.key("array.u16", 9).put<uint32_t>(2).put<uint64_t>(3).put<uint16_t>(1).put<uint16_t>(2).put<uint16_t>(3);
  r.key("array.empty", 9).put<uint32_t>(12).put<uint64_t>(0);
  r.key("array.nested", 9).put<uint32_t>(9).put<uint64_t>(2);
  r.put<uint32_t>(0).put<uint64_t>(2).put<uint8_t>(1).put<uint8_t>(2);  // [u8; 2]
  r.put<uint32_t>(8).put<uint64_t>(1).str("x");                         // [string; 1]
  r.key("general.alignment", 4).put<uint32_t>(16);
  r.tensor("t", {16}, 0, 0).pad(16).fill(64);
  return r.b;
}

void make_gguf() {
  const std::string d = "gguf";
  const Bytes tensors = gguf_tensors(32);
  write_bytes(d, "valid-tensors.gguf", tensors);
  write_bytes(d, "valid-tensors-align64.gguf", gguf_tensors(64));
  write_bytes(d, "valid-tokenizer-gpt2.gguf", gguf_tokenizer_gpt2());
  write_bytes(d, "valid-tokenizer-spm.gguf", gguf_tokenizer_spm());
  write_bytes(d, "valid-all-types-v3.gguf", gguf_all_types(3));
  write_bytes(d, "valid-all-types-v2.gguf", gguf_all_types(2));
  write_bytes(d, "valid-empty.gguf", Raw().header(0, 0).b);
  write_bytes(d, "valid-moe-mixtral.gguf", gguf_moe("llama", 4, 2, false));
  write_bytes(d, "valid-moe-qwen2moe.gguf", gguf_moe("qwen2moe", 4, 2, true));
  write_bytes(d, "moe-topk-over-experts.gguf", gguf_moe("llama", 4, 5, false));
  write_bytes(d, "moe-expert-count-huge.gguf", gguf_moe("qwen2moe", 1u << 30, 8, true));
  write_bytes(d, "moe-expert-count-0.gguf", gguf_moe("qwen2moe", 0, 0, false));

  // Truncations of a valid file: in the header, the metadata, the tensor infos, the data.
  for (size_t cut : {size_t{3}, size_t{20}, size_t{60}, tensors.size() / 3, tensors.size() / 2, tensors.size() - 1}) {
    write_bytes(d, "trunc-" + std::to_string(cut) + ".gguf",
                Bytes(tensors.begin(), tensors.begin() + static_cast<long>(cut)));
  }

  write_bytes(d, "bad-magic.gguf", Raw().header(0, 0, 3, 0x46554746u).b);
  write_bytes(d, "bad-version1.gguf", Raw().header(0, 0, 1).b);
  write_bytes(d, "bad-version4.gguf", Raw().header(0, 0, 4).b);
  write_bytes(d, "huge-tensor-count.gguf", Raw().header(~0ull, 0).fill(64).b);
  write_bytes(d, "huge-kv-count.gguf", Raw().header(0, 1ull << 62).fill(64).b);
  write_bytes(d, "huge-key-length.gguf", Raw().header(0, 1).put<uint64_t>(~0ull).fill(32).b);
  write_bytes(d, "huge-string-length.gguf", Raw().header(0, 1).key("s", 8).put<uint64_t>(1ull << 40).fill(16).b);
  write_bytes(d, "huge-array-count.gguf",
              Raw().header(0, 1).key("a", 9).put<uint32_t>(12).put<uint64_t>(1ull << 61).fill(32).b);
  write_bytes(d, "array-of-strings-overflow.gguf",
              Raw().header(0, 1).key("a", 9).put<uint32_t>(8).put<uint64_t>(3).str("a").put<uint64_t>(~0ull).b);
  {
    Raw r;
    r.header(0, 1).key("deep", 9);
    for (int i = 0; i < 6; ++i) r.put<uint32_t>(9).put<uint64_t>(1);
    r.put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(7);
    write_bytes(d, "nested-too-deep.gguf", r.b);
  }
  write_bytes(d, "unknown-value-type.gguf", Raw().header(0, 1).key("x", 13).fill(8).b);
  write_bytes(d, "unknown-array-type.gguf",
              Raw().header(0, 1).key("x", 9).put<uint32_t>(77).put<uint64_t>(1).fill(8).b);
  write_bytes(d, "bool-2.gguf", Raw().header(0, 1).key("b", 7).put<uint8_t>(2).b);
  write_bytes(d, "empty-key.gguf", Raw().header(0, 1).key("", 4).put<uint32_t>(1).b);
  write_bytes(d, "duplicate-key.gguf", Raw().header(0, 2).key("k", 4).put<uint32_t>(1).key("k", 4).put<uint32_t>(2).b);
  write_bytes(
      d, "alignment-0.gguf",
      Raw().header(1, 1).key("general.alignment", 4).put<uint32_t>(0).tensor("t", {4}, 0, 0).pad(32).fill(16).b);
  write_bytes(
      d, "alignment-3.gguf",
      Raw().header(1, 1).key("general.alignment", 4).put<uint32_t>(3).tensor("t", {4}, 0, 0).pad(32).fill(16).b);
  write_bytes(d, "alignment-string.gguf", Raw().header(0, 1).key("general.alignment", 8).str("32").b);
  write_bytes(d, "tensor-0-dims.gguf", Raw().header(1, 0).tensor("t", {}, 0, 0).pad(32).fill(32).b);
  write_bytes(d, "tensor-5-dims.gguf", Raw().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad(32).fill(32).b);
  write_bytes(d, "tensor-zero-dim.gguf", Raw().header(1, 0).tensor("t", {4, 0}, 0, 0).pad(32).fill(32).b);
  write_bytes(d, "tensor-dim-overflow.gguf",
              Raw().header(1, 0).tensor("t", {1ull << 32, 1ull << 32, 1ull << 32}, 0, 0).pad(32).fill(32).b);
  write_bytes(d, "tensor-unknown-type.gguf", Raw().header(1, 0).tensor("t", {4}, 99, 0).pad(32).fill(32).b);
  write_bytes(d, "tensor-q8_1.gguf", Raw().header(1, 0).tensor("t", {32}, 9, 0).pad(32).fill(64).b);
  write_bytes(d, "tensor-partial-block.gguf", Raw().header(1, 0).tensor("t", {33}, 2, 0).pad(32).fill(64).b);
  write_bytes(d, "tensor-offset-past-end.gguf", Raw().header(1, 0).tensor("t", {4}, 0, 32).pad(32).fill(32).b);
  write_bytes(d, "tensor-offset-overflow.gguf", Raw().header(1, 0).tensor("t", {8}, 0, ~0ull - 31).pad(32).fill(32).b);
  write_bytes(d, "tensor-misaligned.gguf", Raw().header(1, 0).tensor("t", {4}, 0, 4).pad(32).fill(64).b);
  write_bytes(d, "tensor-overlap.gguf",
              Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad(32).fill(96).b);
  write_bytes(d, "tensor-duplicate-name.gguf",
              Raw().header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).pad(32).fill(64).b);
  write_bytes(d, "tensor-no-data.gguf", Raw().header(1, 0).tensor("t", {4}, 0, 0).b);
  for (int variant = 0; variant < 2; ++variant) {
    // Tokenizers whose special ids point outside the vocabulary, or whose merges are malformed.
    gguf::Writer w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|x|>"});
    w.add_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3});
    if (variant == 0) {
      w.add_string_array("tokenizer.ggml.merges", {"a b"});
      w.add_u32("tokenizer.ggml.bos_token_id", 1000);
      w.add_i32("tokenizer.ggml.eos_token_id", -7);
    } else {
      w.add_string_array("tokenizer.ggml.merges", {"a b", "ab", "x y"});
    }
    write_bytes(d, variant == 0 ? "tokenizer-bad-ids.gguf" : "tokenizer-bad-merges.gguf", w.bytes());
  }
}

// ---- safetensors ----

std::string st_file(const std::string& header, size_t data_bytes, uint64_t len_override = 0) {
  uint64_t len = len_override ? len_override : header.size();
  std::string s(reinterpret_cast<const char*>(&len), 8);
  s += header;
  for (size_t i = 0; i < data_bytes; ++i) s += static_cast<char>(i * 13);
  return s;
}

void make_safetensors() {
  const std::string d = "safetensors";
  write_text(d, "valid-two.safetensors",
             st_file(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}})",
                     22));
  write_text(d, "valid-f16-4d.safetensors",
             st_file(R"({"w":{"dtype":"F16","shape":[1,2,1,2],"data_offsets":[0,8]}})", 8));
  write_text(
      d, "valid-scalar-and-empty.safetensors",
      st_file(
          R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})",
          4));
  write_text(d, "valid-empty.safetensors", st_file("{}", 0));
  write_text(d, "header-padded.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}    )", 4));
  write_text(d, "short.safetensors", std::string("\x05\x00\x00", 3));
  write_text(d, "header-len-huge.safetensors", st_file("{}", 4, ~0ull));
  write_text(d, "header-len-past-end.safetensors", st_file("{}", 0, 100));
  write_text(d, "header-not-json.safetensors", st_file("{\"a\":", 4));
  write_text(d, "header-array.safetensors", st_file("[1,2,3]", 0));
  write_text(d, "unknown-dtype.safetensors", st_file(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  write_text(d, "shape-mismatch.safetensors", st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  write_text(d, "negative-dim.safetensors", st_file(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4));
  write_text(d, "five-dims.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}})", 4));
  write_text(d, "shape-overflow.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", 4));
  write_text(d, "offsets-past-end.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  write_text(d, "offsets-reversed.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8));
  write_text(
      d, "overlap.safetensors",
      st_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12));
  write_text(
      d, "hole.safetensors",
      st_file(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          12));
  write_text(d, "malformed-entry.safetensors", st_file(R"({"a":{"dtype":5,"shape":"x","data_offsets":[0]}})", 0));
  write_text(d, "float-offsets.safetensors",
             st_file(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0.0,4e0]}})", 4));
  write_text(d, "deep-nesting.safetensors", st_file(std::string(2000, '[') + std::string(2000, ']'), 0));
  write_text(
      d, "unicode-names.safetensors",
      st_file("{\"caf\xC3\xA9\\u0000\\ud83d\\ude00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4));
}

// ---- tokenizer texts ----

void make_tokenizer() {
  const std::string d = "tokenizer";
  write_text(d, "english.txt",
             "The quick brown fox jumps over the lazy dog. It's 12:30, isn't it? I'd've said 'no'.\n");
  write_text(d, "chatml.txt",
             "<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n"
             "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<|endoftext|><|im_end|><|im_start|");
  write_text(d, "specials-mixed.txt", "<s></s><unk><|user|><tool><|endoftext|x<|im_end|><|<|im_start|>|>");
  write_text(d, "code.txt", "def f(x):\n\treturn x**2  # square\n\nfor i in range(10):\n    print(f\"{i:>3}\")\r\n");
  write_text(d, "digits.txt", "1234567890 3.14159 1e-10 -42 0x1F 1,000,000 \xD9\xA3\xD9\xA4 \xEF\xBC\x91\xEF\xBC\x92");
  write_text(d, "unicode.txt",
             "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 "
             "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 "
             "\xF0\x9F\x98\x80\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 e\xCC\x81 \xE2\x96\x81x \xEF\xBB\xBF");
  write_text(d, "whitespace.txt", "   a  \t\t b\n\n\n  \r\n \xC2\xA0\xE2\x80\x83 \x0B\x0C end   ");
  write_text(d, "invalid-utf8.txt", "ok \xFF\xFE \xC3 \xE2\x82 \xF0\x9F\x98 \xED\xA0\x80 \xC0\xAF \xF4\x90\x80\x80 x");
  static const char kControls[] = "a\0b\x01\x02\x1b[31mred\x7f";
  write_text(d, "nul-and-controls.txt", std::string(kControls, sizeof kControls - 1));
  write_text(d, "byte-token-text.txt", "<0x41><0xZZ><0x>\xE2\x96\x81\xE2\x96\x81 \xE2\x96\x81");
  write_text(d, "long-word.txt", std::string(600, 'a') + " " + std::string(300, '9') + std::string(200, '!'));
}

// ---- chat templates ----

void make_chat_template(const fs::path& golden) {
  const std::string d = "chat_template";
  size_t copied = 0;
  if (fs::is_directory(golden)) {
    for (const auto& e : fs::directory_iterator(golden)) {
      if (e.path().extension() != ".jinja") continue;
      fs::create_directories(g_root / d);
      fs::copy_file(e.path(), g_root / d / e.path().filename(), fs::copy_options::overwrite_existing);
      ++copied;
    }
  }
  if (copied == 0) std::fprintf(stderr, "make_seeds: warning: no golden templates in %s\n", golden.c_str());
  write_text(
      d, "loops-and-filters.jinja",
      "{%- set ns = namespace(n=0, s='') -%}{% for m in messages if m.role != 'tool' %}"
      "{% set ns.n = ns.n + loop.index %}{{ loop.index0 }}/{{ loop.length }}{{ loop.first }}{{ loop.last }}"
      "{{ m.content | trim | upper | replace('A', 'b') if m.content is string else m.content | tojson }}"
      "{% if loop.last %}{% break %}{% endif %}{% else %}none{% endfor %}"
      "{{ ns.n }}{{ range(3) | list | join(',') }}{{ [3,1,2] | sort | reverse | first }}"
      "{{ {'a': 1, 'b': [1, 2]} | tojson(indent=2) }}{{ 'x' ~ 7 ~ none }}{{ 'abc'[::-1] }}{{ 7 // 2 }}{{ 2 ** 10 }}");
  write_text(
      d, "tools.jinja",
      "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}"
      "{% elif m.role == 'tool' %}{{ m.name }}={{ m.content }}{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
      "{% if tools is defined %}{{ tools | map(attribute='function') | map(attribute='name') | join }}{% endif %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}");
  write_text(d, "big-loop.jinja",
             "{% for i in range(100000) %}{% for j in range(100000) %}{{ i * j }}{% endfor %}{% endfor %}");
  write_text(d, "big-output.jinja", "{% set s = 'xxxxxxxxxxxxxxxx' %}{{ s * 100000000 }}");
  write_text(d, "deep-expr.jinja", "{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}");
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "{% if true %}";
  deep += "x";
  for (int i = 0; i < 100; ++i) deep += "{% endif %}";
  write_text(d, "deep-blocks.jinja", deep);
  // Values nested as deep as the loop budget allows, then serialized (see docs/fuzzing.md).
  write_text(d, "deep-values.jinja",
             "{% set ns = namespace(x=[], d={}) %}{% for i in range(100000) %}{% set ns.x = [ns.x, i] %}"
             "{% set ns.d = {'a': ns.d} %}{% endfor %}{{ ns.x | tojson }}{{ ns.d }}{{ ns.x == ns.x }}");
  write_text(d, "raise.jinja",
             "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}");
  write_text(d, "unsupported.jinja", "{% macro m(x) %}{{ x }}{% endmacro %}{{ m(1) }}");
  write_text(d, "unterminated.jinja", "{% for m in messages %}{{ m.content ");
  write_text(d, "whitespace-control.jinja",
             "  {%- if true -%}  a  {%+ endif +%}\n{#- comment -#}\n{{- 'b' -}}  {% generation %}c{% endgeneration %}");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s REPO_ROOT\n", argv[0]);
    return 2;
  }
  const fs::path repo = argv[1];
  g_root = repo / "tests/fuzz/corpus";
  make_gguf();
  make_safetensors();
  make_tokenizer();
  make_chat_template(repo / "tests/golden/chat_template/templates");
  std::printf("make_seeds: wrote %s\n", g_root.c_str());
  return 0;
}
