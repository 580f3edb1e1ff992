#include "runtime/model/model_files.h"

#include <sys/stat.h>

#include <cstdlib>

#include "runtime/model/architectures.h"

namespace troupe {
namespace {

class GgufSource final : public WeightSource {
 public:
  std::shared_ptr<gguf::File> file;
};

bool is_dir(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string troupe_home() {
  if (const char* h = std::getenv("TROUPE_HOME"); h && *h) return h;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/troupe";
}

std::string default_model_path() { return troupe_home() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

Result<std::unique_ptr<WeightSource>> gguf_weight_source(std::shared_ptr<gguf::File> f) {
  auto src = std::make_unique<GgufSource>();
  src->is_gguf = true;
  for (const auto& t : f->tensors()) {
    TensorRef r;
    r.name = t.name;
    r.type = t.type;
    for (uint32_t d = 0; d < t.n_dims; ++d) r.shape.push_back(static_cast<int64_t>(t.ne[d]));
    r.data = t.data;
    r.nbytes = t.nbytes;
    src->add(std::move(r));
  }
  src->file = std::move(f);
  return std::unique_ptr<WeightSource>(std::move(src));
}

Result<ModelFiles> open_gguf(const std::string& path) {
  auto f = gguf::File::open(path);
  if (!f) return f.error();
  auto file = std::make_shared<gguf::File>(std::move(*f));
  auto arch_name = file->get_string("general.architecture");
  if (!arch_name) return make_error(path + ": " + arch_name.error().message);
  const Architecture* arch = find_architecture(*arch_name);
  if (!arch)
    return make_error(path + ": unsupported architecture '" + *arch_name +
                      "' (supported: " + supported_architectures() + ")");
  auto cfg = arch->from_gguf(*file);
  if (!cfg) return make_error(path + ": " + cfg.error().message);
  ModelFiles m;
  m.config = std::move(*cfg);
  m.format = "gguf";
  m.path = path;
  auto tok = Tokenizer::from_gguf(*file);
  if (!tok) return make_error(path + ": tokenizer: " + tok.error().message);
  if (tok->vocab_size() != m.config.vocab)
    return make_error(path + ": tokenizer has " + std::to_string(tok->vocab_size()) +
                      " tokens but the model's vocabulary is " + std::to_string(m.config.vocab));
  if (const auto* e = file->tensor("token_embd.weight"); e && e->ne[1] != static_cast<uint64_t>(m.config.vocab))
    return make_error(path + ": token_embd.weight has " + std::to_string(e->ne[1]) + " rows but the vocabulary has " +
                      std::to_string(m.config.vocab) + " tokens");
  m.tokenizer = std::move(*tok);
  m.chat_template = file->opt_string("tokenizer.chat_template").value_or("");
  auto src = gguf_weight_source(file);
  if (!src) return src.error();
  m.weights = std::move(*src);
  return m;
}

Result<ModelFiles> open_model(const std::string& path, const OpenOptions& opts) {
  const std::string p = (path.empty() || path == "default") ? default_model_path() : path;
  if (opts.load_format == "dummy") return open_dummy(p, opts);
  if (opts.load_format == "safetensors" || (opts.load_format == "auto" && is_dir(p))) return open_hf_dir(p);
  if (opts.load_format != "auto" && opts.load_format != "gguf")
    return make_error("unknown --load-format '" + opts.load_format + "' (auto, gguf, safetensors, dummy)");
  if (p == default_model_path()) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0)
      return make_error("the default model is not downloaded yet: run scripts/fetch-model (expected " + p + ")");
  }
  return open_gguf(p);
}

}  // namespace troupe
