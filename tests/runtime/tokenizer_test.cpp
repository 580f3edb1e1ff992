// Tokenizer tests: golden ids from a Hugging Face reference (tests/golden/tokenizer/make_golden.py),
// a hand-computed SentencePiece vocabulary, the incremental decoder, and hostile input.
#include "runtime/tokenizer/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/format/gguf.h"
#include "runtime/tokenizer/tokenizer_internal.h"
#include "tests/test_util.h"

namespace {

using troupe::IncrementalDecoder;
using troupe::Tokenizer;
using troupe::gguf::File;
using troupe::gguf::Writer;

std::string show_ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// Escapes control and non-ASCII bytes so a failing case prints readably.
std::string show_text(const std::string& t) {
  std::string s = "\"";
  for (unsigned char c : t) {
    if (c == '\n') {
      s += "\\n";
    } else if (c < 0x20 || c >= 0x7F || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  return s + "\"";
}

// Loads the default model's tokenizer once; FAILs (not skips) when the model is missing.
const Tokenizer& smollm2() {
  static const Tokenizer* tok = [] {
    const std::string path = troupe::test::default_model_path();
    if (!troupe::test::file_exists(path)) FAIL(troupe::test::model_missing_message(path));
    auto file = File::open(path);
    if (!file) FAIL("cannot open " << path << ": " << file.error().message);
    auto t = Tokenizer::from_gguf(*file);
    if (!t) FAIL("cannot load the tokenizer from " << path << ": " << t.error().message);
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

struct GoldenCase {
  std::string text;
  std::vector<int32_t> ids, ids_plain;
  std::string decoded;  // HF's decode of ids: == text unless the vocabulary lacks some byte
  bool roundtrip = true;
};

std::vector<GoldenCase> golden_cases() {
  const std::string path = troupe::test::source_dir() + "/tests/golden/tokenizer/smollm2_cases.json";
  std::ifstream in(path);
  if (!in) FAIL("cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  std::vector<GoldenCase> cases;
  for (const auto& c : j.at("cases")) {
    cases.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>(),
                     c.at("ids_plain").get<std::vector<int32_t>>(), c.at("decoded").get<std::string>(),
                     c.at("roundtrip").get<bool>()});
  }
  return cases;
}

// Writes tokenizer.json (+ tokenizer_config.json) into a fresh temp dir and loads it.
troupe::Result<Tokenizer> load_hf(const nlohmann::json& tj, const nlohmann::json& cfg) {
  static int counter = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe_tok_" + std::to_string(::getpid()) + "_" + std::to_string(++counter));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  if (!cfg.is_null()) std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  auto tok = Tokenizer::from_hf_dir(dir.string());
  std::filesystem::remove_all(dir);
  return tok;
}

}  // namespace

TEST_CASE("SmolLM2 tokenizer matches the Hugging Face reference ids", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  const auto cases = golden_cases();
  REQUIRE(cases.size() >= 200);
  CHECK(std::count_if(cases.begin(), cases.end(), [](const GoldenCase& c) { return c.roundtrip; }) >=
        static_cast<long>(cases.size()) - 5);

  size_t num_failed = 0;
  std::string report;
  for (const auto& c : cases) {
    auto ids = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/true);
    auto plain = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    std::string problem;
    if (ids != c.ids) problem += "\n  parse_special: got " + show_ids(ids) + " want " + show_ids(c.ids);
    if (plain != c.ids_plain) problem += "\n  plain: got " + show_ids(plain) + " want " + show_ids(c.ids_plain);
    if (tok.decode(c.ids) != c.decoded) problem += "\n  decode(ids) = " + show_text(tok.decode(c.ids));
    if (tok.decode(c.ids_plain) != c.decoded)
      problem += "\n  decode(ids_plain) = " + show_text(tok.decode(c.ids_plain));
    if (c.roundtrip && c.decoded != c.text) problem += "\n  golden file: decoded != text";
    for (int32_t id : plain) {
      if (tok.is_special(id)) problem += "\n  parse_special=false produced special id " + std::to_string(id);
    }
    if (!problem.empty()) {
      if (++num_failed <= 10) report += "\ncase " + show_text(c.text) + problem;
    }
  }
  INFO(cases.size() - num_failed << " of " << cases.size() << " golden cases pass" << report);
  CHECK(num_failed == 0);
}

TEST_CASE("SmolLM2 tokenizer metadata and special tokens", "[tokenizer]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK_FALSE(tok.add_bos());
  CHECK(tok.is_eog(2));  // <|im_end|>
  CHECK(tok.is_eog(0));  // <|endoftext|>
  CHECK_FALSE(tok.is_eog(1));
  CHECK(tok.is_special(1));
  CHECK_FALSE(tok.is_special(tok.find_token("Hello")));
  CHECK(tok.token_text(1) == "<|im_start|>");
  CHECK(tok.token_text(tok.find_token("\xC4\xA0world")) == " world");  // "Ġworld"

  auto ids = tok.encode("<|im_start|>user\nHi<|im_end|>", /*add_special=*/true, /*parse_special=*/true);
  REQUIRE(ids.size() >= 2);
  CHECK(ids.front() == 1);  // no BOS added: add_bos_token is false
  CHECK(ids.back() == 2);
  CHECK(tok.decode(ids, /*skip_special=*/true) == "user\nHi");
  CHECK(tok.decode(ids) == "<|im_start|>user\nHi<|im_end|>");
  CHECK(tok.encode("", true, true).empty());
}

TEST_CASE("from_hf_dir reads a tokenizer.json equivalent to the GGUF one", "[tokenizer]") {
  // Writes the SmolLM2 vocabulary as a tokenizer.json (Digits + ByteLevel, like the one the model
  // ships) and checks it encodes the golden corpus exactly like the GGUF loader.
  const std::string path = troupe::test::default_model_path();
  if (!troupe::test::file_exists(path)) FAIL(troupe::test::model_missing_message(path));
  auto file = File::open(path);
  REQUIRE(file.ok());
  const auto* tokens = file->find("tokenizer.ggml.tokens");
  const auto* merges = file->find("tokenizer.ggml.merges");
  const auto* types = file->find("tokenizer.ggml.token_type");
  REQUIRE((tokens && merges && types));
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < tokens->array.size(); ++i) {
    vocab[tokens->array[i].s] = i;
    if (types->array[i].as_int() == 3) added.push_back({{"id", i}, {"content", tokens->array[i].s}, {"special", true}});
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& m : merges->array) merge_list.push_back(m.s);
  nlohmann::json tj = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
  };
  nlohmann::json cfg = {{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}, {"add_bos_token", false}};
  auto hf = load_hf(tj, cfg);
  if (!hf) FAIL(hf.error().message);
  CHECK(hf->vocab_size() == 49152);
  CHECK(hf->bos_id() == 1);
  CHECK(hf->eos_id() == 2);
  CHECK(hf->is_eog(2));
  size_t num_failed = 0;
  std::string report;
  for (const auto& c : golden_cases()) {
    auto ids = hf->encode(c.text, false, true);
    if (ids != c.ids && ++num_failed <= 5) report += "\ncase " + show_text(c.text) + " got " + show_ids(ids);
  }
  INFO(report);
  CHECK(num_failed == 0);
}

TEST_CASE("Pre-tokenizer regexes split like Hugging Face tokenizers", "[tokenizer]") {
  // Golden piece boundaries from HF's regex engine for gpt2, llama3, qwen2 and smollm
  // (make_golden.py), against our PCRE2 patterns for the same tokenizer.ggml.pre names.
  const std::string path = troupe::test::source_dir() + "/tests/golden/tokenizer/pretokenizer_cases.json";
  std::ifstream in(path);
  if (!in) FAIL("cannot open " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  const auto texts = j.at("texts").get<std::vector<std::string>>();
  REQUIRE(texts.size() >= 200);
  size_t num_checked = 0;
  for (const auto& [pre_name, all_ends] : j.at("ends").items()) {
    auto patterns = troupe::tokenizer_detail::pre_tokenizer_patterns(pre_name);
    REQUIRE(patterns.ok());
    auto pre = troupe::tokenizer_detail::compile_pre_tokenizer(*patterns);
    REQUIRE(pre.ok());
    size_t num_failed = 0;
    std::string report;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto want = all_ends.at(i).get<std::vector<size_t>>();
      std::vector<size_t> got;
      for (std::string_view w : pre->split(texts[i]))
        got.push_back(static_cast<size_t>(w.data() - texts[i].data()) + w.size());
      if (got != want && ++num_failed <= 5) {
        report += "\ncase " + show_text(texts[i]) + " got " + std::to_string(got.size()) + " pieces, want " +
                  std::to_string(want.size());
      }
      ++num_checked;
    }
    INFO("pre-tokenizer " << pre_name << ": " << texts.size() - num_failed << " of " << texts.size() << " match"
                          << report);
    CHECK(num_failed == 0);
  }
  CHECK(num_checked == 4 * texts.size());
}

// ---- a hand-made SentencePiece vocabulary ----

namespace {

// ids: 0 <unk>, 1 <s>, 2 </s>, 3 <tool> (user-defined), 4..259 <0x00>..<0xFF>, then pieces.
struct TinySpm {
  std::vector<uint8_t> bytes;
  std::vector<std::string> pieces;
  int32_t id(const std::string& piece) const {
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i] == piece) return static_cast<int32_t>(i);
    }
    FAIL("no piece " << piece);
    return -1;
  }
};

const char* const kSp = "\xE2\x96\x81";  // ▁

TinySpm make_tiny_spm(bool with_tokens = true, std::vector<std::string> extra_merges = {}) {
  TinySpm t;
  std::vector<float> scores;
  std::vector<int32_t> types;
  auto add = [&](std::string piece, float score, int32_t type) {
    t.pieces.push_back(std::move(piece));
    scores.push_back(score);
    types.push_back(type);
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  add("<tool>", 0, 4);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0, 6);
  }
  const std::string sp = kSp;
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d"}) add(c, -2, 1);
  add(sp, -1, 1);
  add("he", -3, 1);
  add("ll", -4, 1);
  add("hell", -5, 1);
  add("hello", -6, 1);
  add(sp + "hello", -7, 1);
  add("or", -8, 1);
  add(sp + "w", -9, 1);
  add(sp + "wor", -10, 1);
  add("ld", -11, 1);

  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "llama");
  if (with_tokens) w.add_string_array("tokenizer.ggml.tokens", t.pieces);
  w.add_f32_array("tokenizer.ggml.scores", scores);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  if (!extra_merges.empty()) w.add_string_array("tokenizer.ggml.merges", extra_merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_bool("tokenizer.ggml.add_space_prefix", true);
  t.bytes = w.bytes();
  return t;
}

Tokenizer load_tiny(const TinySpm& t) {
  auto f = File::parse(t.bytes.data(), t.bytes.size());
  REQUIRE(f.ok());
  auto tok = Tokenizer::from_gguf(*f);
  if (!tok) FAIL(tok.error().message);
  return std::move(*tok);
}

}  // namespace

TEST_CASE("SentencePiece BPE: hand-computed merges, byte fallback, specials", "[tokenizer]") {
  const TinySpm t = make_tiny_spm();
  const Tokenizer tok = load_tiny(t);
  const std::string sp = kSp;
  const int32_t hello = t.id(sp + "hello"), wor = t.id(sp + "wor"), ld = t.id("ld");

  // "▁hello▁world": he, ll, hell, hello, ▁hello, or, ▁w, ▁wor, ld (best score first).
  CHECK(tok.encode("hello world", false, false) == std::vector<int32_t>{hello, wor, ld});
  CHECK(tok.encode("hello world", true, false) == std::vector<int32_t>{1, hello, wor, ld});
  CHECK(tok.decode({1, hello, wor, ld}, /*skip_special=*/true) == "hello world");
  CHECK(tok.decode({hello, wor, ld}) == "hello world");  // the prefix space is dropped again
  CHECK(tok.token_text(hello) == " hello");

  // "é" is not a piece: its two UTF-8 bytes fall back to <0xC3> <0xA9> (ids 4 + byte).
  const std::vector<int32_t> he_acute{t.id(sp), t.id("h"), 4 + 0xC3, 4 + 0xA9};
  CHECK(tok.encode("h\xC3\xA9", false, false) == he_acute);
  CHECK(tok.decode(he_acute) == "h\xC3\xA9");
  // A character with no piece and no byte token would become <unk>; here all bytes exist.
  CHECK(tok.encode("\xF0\x9F\x98\x80", false, false) ==
        std::vector<int32_t>{t.id(sp), 4 + 0xF0, 4 + 0x9F, 4 + 0x98, 4 + 0x80});

  // CONTROL tokens only with parse_special; USER_DEFINED tokens always; "▁" again after a special.
  CHECK(tok.encode("hello</s>hello", false, true) == std::vector<int32_t>{hello, 2, hello});
  auto plain = tok.encode("hello</s>", false, false);
  CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
  CHECK(tok.encode("hello<tool>", false, false) == std::vector<int32_t>{hello, 3});
  CHECK(tok.is_special(2));
  CHECK_FALSE(tok.is_special(3));
  CHECK(tok.is_eog(2));
  CHECK(tok.add_bos());
}

TEST_CASE("from_hf_dir: Llama-2-style tokenizer.json (merges by rank, byte fallback)", "[tokenizer]") {
  const std::string sp = kSp;
  nlohmann::json vocab = nlohmann::json::object();
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<tool>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    pieces.push_back(buf);
  }
  for (std::string p : std::vector<std::string>{"h", "e", "l", "o", "w", "r", "d", sp, "he", "ll", "hell", "hello",
                                                sp + "hello", "or", sp + "w", sp + "wor", "ld"}) {
    pieces.push_back(p);
  }
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = i;
  auto id = [&](const std::string& p) {
    return static_cast<int32_t>(std::find(pieces.begin(), pieces.end(), p) - pieces.begin());
  };
  // The same order as the scores of the GGUF test above: the result must be the same.
  nlohmann::json merges = {"h e", "l l", "he ll", "hell o", sp + " hello", "o r", sp + " w", sp + "w or", "l d"};
  nlohmann::json tj = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}},
        {{"id", 3}, {"content", "<tool>"}, {"special", false}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", sp}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
      {"pre_tokenizer", nullptr},
      {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", true}, {"unk_token", "<unk>"}}},
  };
  auto tok = load_hf(tj, {{"bos_token", {{"content", "<s>"}}}, {"eos_token", "</s>"}, {"add_bos_token", true}});
  if (!tok) FAIL(tok.error().message);
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  CHECK(tok->add_bos());
  CHECK(tok->encode("hello world", true, false) == std::vector<int32_t>{1, id(sp + "hello"), id(sp + "wor"), id("ld")});
  CHECK(tok->encode("h\xC3\xA9", false, false) == std::vector<int32_t>{id(sp), id("h"), 4 + 0xC3, 4 + 0xA9});
  CHECK(tok->encode("hello</s><tool>", false, true) == std::vector<int32_t>{id(sp + "hello"), 2, 3});
  CHECK(tok->decode(tok->encode("hello world", true, false), true) == "hello world");
}

TEST_CASE("from_hf_dir: Llama-3-style tokenizer.json (Split regex, ignore_merges, BOS template)", "[tokenizer]") {
  const auto& alphabet = troupe::tokenizer_detail::byte_to_unicode();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet[b]] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;  // no merge builds it: only ignore_merges can produce it
  vocab[alphabet[' '] + "ab"] = 258;
  nlohmann::json tj = {
      {"added_tokens",
       {{{"id", 259}, {"content", "<|begin_of_text|>"}, {"special", true}},
        {{"id", 260}, {"content", "<|eot_id|>"}, {"special", true}}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", troupe::tokenizer_detail::pre_tokenizer_patterns("llama3")->front()}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", alphabet[' '] + " ab"}}, {"ignore_merges", true}}},
  };
  auto tok = load_hf(tj, nullptr);
  if (!tok) FAIL(tok.error().message);
  CHECK(tok->add_bos());
  CHECK(tok->bos_id() == 259);
  CHECK(tok->is_eog(260));
  CHECK(tok->encode("abc", true, false) == std::vector<int32_t>{259, 257});
  CHECK(tok->encode("abd ab", false, false) == std::vector<int32_t>{256, 'd', 258});
  CHECK(tok->encode("<|eot_id|>", false, true) == std::vector<int32_t>{260});
  CHECK(tok->decode({259, 257, 258, 260}, true) == "abc ab");

  tj["model"]["ignore_merges"] = false;
  auto tok2 = load_hf(tj, nullptr);
  REQUIRE(tok2.ok());
  CHECK(tok2->encode("abc", false, false) == std::vector<int32_t>{256, 'c'});

  tj["model"]["merges"] = {"a z"};  // 'z' is in the alphabet but "az" is not a token
  CHECK_FALSE(load_hf(tj, nullptr).ok());
  tj["model"]["merges"] = {"a b"};
  tj["added_tokens"][0]["id"] = -4;
  CHECK_FALSE(load_hf(tj, nullptr).ok());
}

TEST_CASE("IncrementalDecoder never splits a UTF-8 sequence", "[tokenizer]") {
  SECTION("byte tokens of one character arrive one by one") {
    const Tokenizer tok = load_tiny(make_tiny_spm());
    IncrementalDecoder dec(tok);
    CHECK(dec.push(4 + 0xE4) == "");
    CHECK(dec.push(4 + 0xBD) == "");
    CHECK(dec.push(4 + 0xA0) == "\xE4\xBD\xA0");  // 你
    CHECK(dec.push(4 + 0xFF) == "\xEF\xBF\xBD");  // never valid: U+FFFD at once
    CHECK(dec.push(4 + 0xF0) == "");
    CHECK(dec.flush() == "\xEF\xBF\xBD");  // cut short
    CHECK(dec.push(1) == "");              // <s> skipped
  }
  SECTION("golden texts with emoji and CJK, token by token") {
    const Tokenizer& tok = smollm2();
    size_t num_multibyte = 0;
    for (const auto& c : golden_cases()) {
      bool has_multibyte = std::any_of(c.text.begin(), c.text.end(), [](char ch) { return ch & 0x80; });
      if (!has_multibyte) continue;
      ++num_multibyte;
      for (bool skip : {false, true}) {
        IncrementalDecoder dec(tok, skip);
        std::string all;
        for (int32_t id : c.ids) {
          std::string piece = dec.push(id);
          INFO("text " << show_text(c.text) << " piece " << show_text(piece));
          REQUIRE(troupe::is_valid_utf8(piece));
          all += piece;
        }
        all += dec.flush();
        REQUIRE(all == tok.decode(c.ids, skip));
        if (!skip && c.roundtrip) REQUIRE(all == c.text);
      }
    }
    CHECK(num_multibyte >= 50);
  }
}

TEST_CASE("UTF-8 validation and repair", "[tokenizer]") {
  CHECK(troupe::is_valid_utf8(""));
  CHECK(troupe::is_valid_utf8("abc \xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80"));
  CHECK_FALSE(troupe::is_valid_utf8("\xC0\xAF"));          // overlong
  CHECK_FALSE(troupe::is_valid_utf8("\xED\xA0\x80"));      // surrogate
  CHECK_FALSE(troupe::is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  CHECK_FALSE(troupe::is_valid_utf8("\xE4\xBD"));          // truncated
  CHECK_FALSE(troupe::is_valid_utf8("\x80"));
  CHECK(troupe::sanitize_utf8("a\xE4\xBDz") == "a\xEF\xBF\xBDz");  // one U+FFFD per maximal subpart
  CHECK(troupe::sanitize_utf8("\xFF\xFE") == "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_CASE("Tokenizer rejects bad files and survives bad ids", "[tokenizer]") {
  SECTION("missing tokens array") {
    TinySpm t = make_tiny_spm(/*with_tokens=*/false);
    auto f = File::parse(t.bytes.data(), t.bytes.size());
    REQUIRE(f.ok());
    auto tok = Tokenizer::from_gguf(*f);
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.error().message.find("tokenizer.ggml.tokens") != std::string::npos);
  }
  SECTION("merges that name unknown tokens") {
    TinySpm t = make_tiny_spm(true, {"h e", "q z"});
    auto f = File::parse(t.bytes.data(), t.bytes.size());
    REQUIRE(f.ok());
    auto tok = Tokenizer::from_gguf(*f);
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.error().message.find("merge 1") != std::string::npos);
  }
  SECTION("out-of-range special ids, unknown pre-tokenizer, missing merges") {
    auto load = [](auto&& customize) {
      Writer w;
      w.add_string("tokenizer.ggml.model", "gpt2");
      w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
      customize(w);
      auto bytes = w.bytes();
      auto f = File::parse(bytes.data(), bytes.size());
      REQUIRE(f.ok());
      return Tokenizer::from_gguf(*f).ok();
    };
    CHECK(load([](Writer& w) { w.add_string_array("tokenizer.ggml.merges", {"a b"}); }));
    CHECK_FALSE(load([](Writer&) {}));
    CHECK_FALSE(load([](Writer& w) {
      w.add_string_array("tokenizer.ggml.merges", {"a b"});
      w.add_u32("tokenizer.ggml.eos_token_id", 3);
    }));
    CHECK_FALSE(load([](Writer& w) {
      w.add_string_array("tokenizer.ggml.merges", {"a b"});
      w.add_string("tokenizer.ggml.pre", "no-such-pre");
    }));
    CHECK_FALSE(load([](Writer& w) { w.add_string_array("tokenizer.ggml.merges", {"ab"}); }));
    CHECK_FALSE(load([](Writer& w) {
      w.add_string_array("tokenizer.ggml.merges", {"a b"});
      w.add_i32_array("tokenizer.ggml.token_type", {1, 1});  // wrong length
    }));
  }
  SECTION("unsupported model and missing directory") {
    Writer w;
    w.add_string("tokenizer.ggml.model", "bert");
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
    auto bytes = w.bytes();
    auto f = File::parse(bytes.data(), bytes.size());
    REQUIRE(f.ok());
    CHECK_FALSE(Tokenizer::from_gguf(*f).ok());
    CHECK_FALSE(Tokenizer::from_hf_dir("/nonexistent/troupe/dir").ok());
  }
  SECTION("bad ids to decode, bad text to encode") {
    const Tokenizer tok = load_tiny(make_tiny_spm());
    const int32_t hello = tok.find_token(std::string(kSp) + "hello");
    CHECK(tok.decode({-1, hello, 1 << 30, -2147483647 - 1, tok.vocab_size()}) == "hello");
    CHECK(tok.token_text(-7).empty());
    CHECK(tok.token_text(tok.vocab_size()).empty());
    CHECK_FALSE(tok.is_eog(-1));
    CHECK_FALSE(tok.is_special(1 << 30));
    IncrementalDecoder dec(tok);
    CHECK(dec.push(-3).empty());
    // Invalid UTF-8 is encoded as U+FFFD (bytes EF BF BD fall back to byte tokens).
    CHECK(tok.encode("\xFF", false, false) == std::vector<int32_t>{tok.find_token(kSp), 4 + 0xEF, 4 + 0xBF, 4 + 0xBD});
  }
}
