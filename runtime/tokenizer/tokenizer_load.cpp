// Loading a Tokenizer from GGUF metadata or from a Hugging Face tokenizer.json directory.
// Both fill a VocabSpec; build_vocab (tokenizer.cpp) validates it and builds the tables.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/tokenizer_internal.h"

namespace troupe {

using tokenizer_detail::Kind;
using tokenizer_detail::TokenType;
using tokenizer_detail::VocabSpec;

namespace {

constexpr int64_t kMaxVocab = 1 << 24;

// "a b" -> {"a", "b"}; the split is at the first space after the first byte (llama.cpp's rule).
Result<std::pair<std::string, std::string>> split_merge(const std::string& m, size_t index) {
  size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
  if (pos == std::string::npos || pos + 1 >= m.size()) {
    return make_error("tokenizer: merge " + std::to_string(index) + " ('" + m +
                      "') is not two tokens separated by a space");
  }
  return std::make_pair(m.substr(0, pos), m.substr(pos + 1));
}

bool is_llama3_pre(const std::string& pre) {
  return pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "dbrx" || pre == "smaug-bpe" ||
         pre == "falcon3" || pre == "pixtral";
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  VocabSpec spec;
  auto model = f.opt_string("tokenizer.ggml.model");
  if (!model) return make_error("tokenizer: missing metadata 'tokenizer.ggml.model'");
  const bool is_spm = *model == "llama";
  if (*model == "gpt2") {
    spec.kind = Kind::byte_level_bpe;
  } else if (is_spm) {
    spec.kind = Kind::sentencepiece_bpe;
  } else {
    return make_error("tokenizer: unsupported tokenizer.ggml.model '" + *model + "' (supported: gpt2, llama)");
  }

  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf::ValueType::ARRAY || tokens->elem_type != gguf::ValueType::STRING) {
    return make_error("tokenizer: missing or malformed 'tokenizer.ggml.tokens' (want an array of strings)");
  }
  const size_t n = tokens->array.size();
  if (n == 0 || n > static_cast<size_t>(kMaxVocab)) {
    return make_error("tokenizer: 'tokenizer.ggml.tokens' has " + std::to_string(n) + " entries");
  }
  spec.tokens.reserve(n);
  for (const auto& t : tokens->array) spec.tokens.push_back(t.s);

  if (const gguf::Value* scores = f.find("tokenizer.ggml.scores")) {
    if (scores->type != gguf::ValueType::ARRAY || scores->array.size() != n) {
      return make_error("tokenizer: 'tokenizer.ggml.scores' must be an array of " + std::to_string(n) + " numbers");
    }
    spec.scores.reserve(n);
    for (const auto& s : scores->array) {
      auto x = s.as_number();
      if (!x) return make_error("tokenizer: 'tokenizer.ggml.scores' holds a non-number");
      spec.scores.push_back(static_cast<float>(*x));
    }
  }
  if (const gguf::Value* types = f.find("tokenizer.ggml.token_type")) {
    if (types->type != gguf::ValueType::ARRAY || types->array.size() != n) {
      return make_error("tokenizer: 'tokenizer.ggml.token_type' must be an array of " + std::to_string(n) +
                        " integers");
    }
    spec.types.reserve(n);
    for (const auto& t : types->array) {
      auto x = t.as_int();
      if (!x) return make_error("tokenizer: 'tokenizer.ggml.token_type' holds a non-integer");
      spec.types.push_back(*x >= 0 && *x <= 6 ? static_cast<TokenType>(*x) : TokenType::undefined);
    }
  }
  if (const gguf::Value* merges = f.find("tokenizer.ggml.merges")) {
    if (merges->type != gguf::ValueType::ARRAY || merges->elem_type != gguf::ValueType::STRING) {
      return make_error("tokenizer: 'tokenizer.ggml.merges' must be an array of strings");
    }
    spec.merges.reserve(merges->array.size());
    for (size_t i = 0; i < merges->array.size(); ++i) {
      auto m = split_merge(merges->array[i].s, i);
      if (!m) return m.error();
      spec.merges.push_back(std::move(*m));
    }
  } else if (!is_spm) {
    return make_error("tokenizer: missing 'tokenizer.ggml.merges' for a gpt2 (byte-level BPE) vocabulary");
  }

  const std::string pre = f.opt_string("tokenizer.ggml.pre").value_or("default");
  if (!is_spm) {
    auto patterns = tokenizer_detail::pre_tokenizer_patterns(pre);
    if (!patterns) return patterns.error();
    spec.pre_patterns = std::move(*patterns);
    spec.ignore_merges = is_llama3_pre(pre);
  }
  // Defaults when the keys are absent follow llama.cpp: SentencePiece vocabularies use
  // <unk>=0, <s>=1, </s>=2, add BOS and a space prefix.
  spec.bos = f.opt_int("tokenizer.ggml.bos_token_id").value_or(is_spm ? 1 : -1);
  spec.eos = f.opt_int("tokenizer.ggml.eos_token_id").value_or(is_spm ? 2 : -1);
  spec.unk = f.opt_int("tokenizer.ggml.unknown_token_id").value_or(is_spm ? 0 : -1);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (auto id = f.opt_int(key)) spec.extra_eog.push_back(*id);
  }
  spec.add_bos = f.opt_bool("tokenizer.ggml.add_bos_token").value_or(is_spm);
  spec.add_eos = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  spec.add_space_prefix = f.opt_bool("tokenizer.ggml.add_space_prefix").value_or(is_spm);

  auto vocab = tokenizer_detail::build_vocab(std::move(spec));
  if (!vocab) return vocab.error();
  return Tokenizer(std::move(*vocab));
}

// ---- tokenizer.json ----

namespace {
using nlohmann::json;

Result<json> read_json(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (required) return make_error("tokenizer: cannot open " + path);
    return json();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error("tokenizer: " + path + " is not valid JSON");
  return j;
}

// Collects every pre-tokenizer / normalizer / decoder node, flattening "Sequence"s.
void flatten(const json& node, const char* list_key, std::vector<const json*>& out) {
  if (!node.is_object()) return;
  if (node.value("type", "") == "Sequence" && node.contains(list_key) && node[list_key].is_array()) {
    for (const auto& child : node[list_key]) flatten(child, list_key, out);
  } else {
    out.push_back(&node);
  }
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return {};
  const json& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return {};
}

Result<Tokenizer> from_hf_json(const json& tj, const json& cfg, const json& gen_cfg,
                               Result<Tokenizer> (*build)(VocabSpec)) {
  VocabSpec spec;
  const json& model = tj.at("model");
  if (model.value("type", "BPE") != "BPE") {
    return make_error("tokenizer: tokenizer.json model type '" + model.value("type", "") +
                      "' is not supported (only BPE)");
  }
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) return make_error("tokenizer: tokenizer.json model.vocab is not an object");
  int64_t max_id = -1;
  auto check_id = [&](const json& id, const std::string& what) -> Result<int64_t> {
    if (!id.is_number_integer()) return make_error("tokenizer: id of '" + what + "' is not an integer");
    int64_t v = id.get<int64_t>();
    if (v < 0 || v >= kMaxVocab)
      return make_error("tokenizer: id " + std::to_string(v) + " of '" + what + "' is out of range");
    max_id = std::max(max_id, v);
    return v;
  };
  std::vector<std::pair<int64_t, std::string>> entries;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    auto id = check_id(it.value(), it.key());
    if (!id) return id.error();
    entries.emplace_back(*id, it.key());
  }
  std::vector<std::tuple<int64_t, std::string, bool>> added;
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      std::string content = a.value("content", "");
      auto id = check_id(a.at("id"), content);
      if (!id) return id.error();
      added.emplace_back(*id, content, a.value("special", false));
    }
  }
  if (max_id < 0) return make_error("tokenizer: tokenizer.json has an empty vocabulary");
  const size_t n = static_cast<size_t>(max_id) + 1;
  spec.tokens.assign(n, std::string());
  spec.types.assign(n, TokenType::unused);  // ids that nothing names stay unused
  for (auto& [id, text] : entries) {
    spec.tokens[id] = std::move(text);
    spec.types[id] = TokenType::normal;
  }
  for (auto& [id, text, special] : added) {
    spec.tokens[id] = text;
    spec.types[id] = special ? TokenType::control : TokenType::user_defined;
  }

  if (model.contains("merges") && model["merges"].is_array()) {
    const json& merges = model["merges"];
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      if (m.is_string()) {
        auto p = split_merge(m.get<std::string>(), i);
        if (!p) return p.error();
        spec.merges.push_back(std::move(*p));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return make_error("tokenizer: merge " + std::to_string(i) + " in tokenizer.json is malformed");
      }
    }
  }
  spec.ignore_merges = model.value("ignore_merges", false);

  std::vector<const json*> pres, norms, decs;
  if (tj.contains("pre_tokenizer")) flatten(tj["pre_tokenizer"], "pretokenizers", pres);
  if (tj.contains("normalizer")) flatten(tj["normalizer"], "normalizers", norms);
  if (tj.contains("decoder")) flatten(tj["decoder"], "decoders", decs);
  bool byte_level = false;
  for (const json* d : decs) byte_level |= d->value("type", "") == "ByteLevel";
  for (const json* p : pres) byte_level |= p->value("type", "") == "ByteLevel";
  spec.kind = byte_level ? Kind::byte_level_bpe : Kind::sentencepiece_bpe;

  if (byte_level) {
    for (const json* p : pres) {
      const std::string type = p->value("type", "");
      if (type == "Split") {
        if (p->value("behavior", "Isolated") != "Isolated" || p->value("invert", false)) {
          return make_error("tokenizer: tokenizer.json Split pre-tokenizer: only behavior Isolated is supported");
        }
        const json& pat = p->at("pattern");
        if (pat.contains("Regex")) {
          spec.pre_patterns.push_back(pat["Regex"].get<std::string>());
        } else if (pat.contains("String")) {
          std::string lit = pat["String"].get<std::string>();
          spec.pre_patterns.push_back("\\Q" + lit + "\\E");
        }
      } else if (type == "Digits") {
        spec.pre_patterns.push_back(p->value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
      } else if (type == "ByteLevel") {
        if (p->value("use_regex", true)) {
          auto gpt2 = tokenizer_detail::pre_tokenizer_patterns("gpt2");
          spec.pre_patterns.push_back(gpt2->front());
        }
        if (p->value("add_prefix_space", false)) {
          return make_error("tokenizer: ByteLevel add_prefix_space=true is not supported");
        }
      } else {
        return make_error("tokenizer: tokenizer.json pre-tokenizer '" + type + "' is not supported");
      }
    }
  } else {
    for (const json* nrm : norms) {
      if (nrm->value("type", "") == "Prepend") spec.add_space_prefix = true;
    }
    for (const json* p : pres) {
      if (p->value("type", "") == "Metaspace") {
        spec.add_space_prefix = p->value("prepend_scheme", "always") != "never" && p->value("add_prefix_space", true);
      }
    }
  }

  auto id_of = [&](const std::string& text) -> int64_t {
    if (text.empty()) return -1;
    for (size_t i = 0; i < n; ++i) {
      if (spec.tokens[i] == text) return static_cast<int64_t>(i);
    }
    return -1;
  };
  spec.bos = id_of(config_token(cfg, "bos_token"));
  spec.eos = id_of(config_token(cfg, "eos_token"));
  if (model.contains("unk_token") && model["unk_token"].is_string())
    spec.unk = id_of(model["unk_token"].get<std::string>());
  if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
    spec.add_bos = cfg["add_bos_token"].get<bool>();
  } else if (tj.contains("post_processor") && tj["post_processor"].is_object()) {
    // TemplateProcessing that starts with a special token (Llama 3's <|begin_of_text|>).
    std::vector<const json*> posts;
    flatten(tj["post_processor"], "processors", posts);
    for (const json* p : posts) {
      if (p->value("type", "") != "TemplateProcessing" || !p->contains("single")) continue;
      const json& single = (*p)["single"];
      if (single.is_array() && !single.empty() && single[0].contains("SpecialToken")) {
        int64_t id = id_of(single[0]["SpecialToken"].value("id", ""));
        if (id >= 0) {
          spec.add_bos = true;
          if (spec.bos < 0) spec.bos = id;
        }
      }
    }
  }
  if (cfg.is_object() && cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
    spec.add_eos = cfg["add_eos_token"].get<bool>();
  }
  if (gen_cfg.is_object() && gen_cfg.contains("eos_token_id")) {
    const json& e = gen_cfg["eos_token_id"];
    if (e.is_number_integer()) spec.extra_eog.push_back(e.get<int64_t>());
    if (e.is_array()) {
      for (const auto& x : e) {
        if (x.is_number_integer()) spec.extra_eog.push_back(x.get<int64_t>());
      }
    }
  }
  return build(std::move(spec));
}

}  // namespace

Result<Tokenizer> Tokenizer::from_hf_dir(const std::string& dir) {
  auto tj = read_json(dir + "/tokenizer.json", true);
  if (!tj) return tj.error();
  auto cfg = read_json(dir + "/tokenizer_config.json", false);
  if (!cfg) return cfg.error();
  auto gen = read_json(dir + "/generation_config.json", false);
  if (!gen) return gen.error();
  try {
    return from_hf_json(*tj, *cfg, *gen, [](VocabSpec spec) -> Result<Tokenizer> {
      auto vocab = tokenizer_detail::build_vocab(std::move(spec));
      if (!vocab) return vocab.error();
      return Tokenizer(std::move(*vocab));
    });
  } catch (const nlohmann::json::exception& e) {
    return make_error("tokenizer: " + dir + "/tokenizer.json: unexpected structure: " + e.what());
  }
}

}  // namespace troupe
