// libFuzzer target: Tokenizer::encode / decode on arbitrary text.
//
// LLVMFuzzerInitialize builds the tokenizers once:
//  - the default model's vocabulary (byte-level BPE, SmolLM2's "smollm" pre-tokenizer) from
//    $TROUPE_MODEL_PATH, else $TROUPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf
//    (TROUPE_HOME defaults to ~/.cache/troupe); a warning is printed when it is missing,
//  - two small synthetic byte-level BPE vocabularies (llama3 and qwen2 pre-tokenizers) and a
//    small SentencePiece vocabulary with byte fallback, written with gguf::Writer, so the
//    target covers every code path even without the model file.
// Each input is encoded with parse_special true and false; every id must be in range, and
// decoding must give the text back (invalid UTF-8 as U+FFFD) for byte-level vocabularies
// when special tokens are not parsed and the vocabulary has a token for every byte of the
// text (SmolLM2 lacks a few control bytes, which encode drops as HF and llama.cpp do);
// incremental decoding must yield valid UTF-8.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/format/gguf.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

struct Entry {
  std::string name;
  Tokenizer tok;
  bool byte_level;                  // byte-level BPE: decode inverts encode for bytes the vocabulary spells
  std::array<bool, 256> missing{};  // bytes whose GPT-2 character is not a token (encode drops them)
};
std::vector<Entry>* g_toks = nullptr;
volatile size_t g_sink;

// GPT-2's bytes-to-unicode alphabet: the spelling of byte b inside byte-level BPE tokens.
std::string byte_char(int b) {
  uint32_t cp;
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
    cp = static_cast<uint32_t>(b);
  } else {
    int n = 0;
    for (int c = 0; c < b; ++c)
      if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++n;
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

Tokenizer must_load(const gguf::Writer& w, std::vector<uint8_t>& keep, const char* what) {
  keep = w.bytes();
  auto f = gguf::File::parse(keep.data(), keep.size());
  if (!f) {
    std::fprintf(stderr, "tokenizer_fuzz: synthetic %s GGUF does not parse: %s\n", what, f.error().message.c_str());
    std::abort();
  }
  auto t = Tokenizer::from_gguf(*f);
  if (!t) {
    std::fprintf(stderr, "tokenizer_fuzz: synthetic %s tokenizer does not load: %s\n", what, t.error().message.c_str());
    std::abort();
  }
  return *t;
}

Tokenizer byte_level(const std::string& pre, std::vector<uint8_t>& keep) {
  gguf::Writer w;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_char(b));
    types.push_back(1);
  }
  const std::string G = byte_char(' ');  // "Ġ"
  std::vector<std::string> merges = {G + " t", "h e", G + "t he", "i n", G + " a", "1 2", "e r"};
  for (const auto& m : merges) {
    auto sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(s);
    types.push_back(3);  // CONTROL
  }
  tokens.push_back("<tool>");
  types.push_back(4);  // USER_DEFINED
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 263);
  w.add_u32("tokenizer.ggml.eos_token_id", 265);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  return must_load(w, keep, pre.c_str());
}

Tokenizer sentencepiece(std::vector<uint8_t>& keep) {
  gguf::Writer w;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);  // BYTE
    scores.push_back(0);
  }
  for (const char* p : {"\xE2\x96\x81", "a", "b",
                        "\xE2\x96\x81"
                        "a",
                        "ab",
                        "\xE2\x96\x81"
                        "the",
                        "th", "e", "t", "h", "\xC3\xA9", "<|user|>"}) {
    tokens.push_back(p);
    types.push_back(std::string(p) == "<|user|>" ? 4 : 1);
    scores.push_back(-static_cast<float>(tokens.size()));
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_eos_token", true);
  return must_load(w, keep, "sentencepiece");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static std::vector<uint8_t> keep[3];
  g_toks = new std::vector<Entry>();
  const std::string path = troupe::test::default_model_path();
  auto f = gguf::File::open(path);
  if (f) {
    auto t = Tokenizer::from_gguf(*f);
    if (!t) {
      std::fprintf(stderr, "tokenizer_fuzz: %s: %s\n", path.c_str(), t.error().message.c_str());
      std::abort();
    }
    g_toks->push_back({"smollm2", *t, true, {}});
    std::fprintf(stderr, "tokenizer_fuzz: loaded %d-token vocabulary from %s\n", t->vocab_size(), path.c_str());
  } else {
    std::fprintf(stderr,
                 "tokenizer_fuzz: WARNING: default model not found (%s); fuzzing the synthetic "
                 "vocabularies only -- run scripts/fetch-model or set TROUPE_MODEL_PATH / TROUPE_HOME\n",
                 f.error().message.c_str());
  }
  g_toks->push_back({"bpe-llama3", byte_level("llama3", keep[0]), true, {}});
  g_toks->push_back({"bpe-qwen2", byte_level("qwen2", keep[1]), true, {}});
  g_toks->push_back({"spm", sentencepiece(keep[2]), false, {}});
  for (Entry& e : *g_toks) {
    if (!e.byte_level) continue;
    int n_missing = 0;
    for (int b = 0; b < 256; ++b) {
      e.missing[b] = e.tok.find_token(byte_char(b)) < 0;
      n_missing += e.missing[b];
    }
    if (n_missing > 0)
      std::fprintf(
          stderr,
          "tokenizer_fuzz: %s has no token for %d of the 256 bytes (texts with them skip the round-trip check)\n",
          e.name.c_str(), n_missing);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool add_special = size % 2 == 1;
  size_t acc = 0;
  for (const Entry& e : *g_toks) {
    const int32_t n = e.tok.vocab_size();
    for (bool parse_special : {true, false}) {
      std::vector<int32_t> ids = e.tok.encode(text, add_special, parse_special);
      for (int32_t id : ids) {
        if (id < 0 || id >= n) {
          std::fprintf(stderr, "tokenizer_fuzz: %s encoded an out-of-range id %d\n", e.name.c_str(), id);
          std::abort();
        }
      }
      std::string back = e.tok.decode(ids, false);
      acc += back.size() + e.tok.decode(ids, true).size();
      // With parse_special false, control-token spellings are plain text, so byte-level
      // vocabularies must give back exactly the (UTF-8-sanitized) input.
      if (e.byte_level && !add_special && !parse_special) {
        const std::string want = sanitize_utf8(text);
        bool spellable = true;
        for (unsigned char c : want) spellable = spellable && !e.missing[c];
        if (spellable && back != want) {
          std::fprintf(stderr, "tokenizer_fuzz: %s: decode(encode(text)) != text (%zu vs %zu bytes)\n", e.name.c_str(),
                       back.size(), want.size());
          std::abort();
        }
      }
      IncrementalDecoder inc(e.tok, parse_special);
      std::string streamed;
      for (int32_t id : ids) streamed += inc.push(id);
      streamed += inc.flush();
      if (!is_valid_utf8(streamed)) {
        std::fprintf(stderr, "tokenizer_fuzz: %s: incremental decode produced invalid UTF-8\n", e.name.c_str());
        std::abort();
      }
      acc += streamed.size();
    }
    // Out-of-range ids are skipped, never read.
    acc += e.tok.decode({-1, n, INT32_MAX, INT32_MIN, 0}, false).size();
    acc += e.tok.token_text(n).size() + e.tok.token_text(-5).size();
  }
  g_sink = acc;
  return 0;
}
