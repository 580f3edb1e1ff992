// Opening a model from what users have: a GGUF file, a Hugging Face directory
// (config.json + *.safetensors + tokenizer.json), or `dummy` weights from a config JSON.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "runtime/format/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/format/weights.h"

namespace troupe {

struct ModelFiles {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;  // keeps the file mappings alive
  std::optional<Tokenizer> tokenizer;     // absent for dummy weights
  std::string chat_template;              // Jinja source, "" when the model has none
  std::string format;                     // "gguf", "safetensors", "dummy"
  std::string path;
};

struct OpenOptions {
  std::string load_format = "auto";  // auto | gguf | safetensors | dummy
  std::string dummy_dtype = "bf16";  // weight type for dummy weights
  uint64_t seed = 0;                 // dummy weights
};

// The default model file under $TROUPE_HOME/models (TROUPE_HOME defaults to ~/.cache/troupe).
std::string troupe_home();
std::string default_model_path();
// "default" or "" resolve to the default model.
Result<ModelFiles> open_model(const std::string& path, const OpenOptions& opts = {});

Result<std::unique_ptr<WeightSource>> gguf_weight_source(std::shared_ptr<gguf::File> f);
Result<ModelFiles> open_gguf(const std::string& path);
Result<ModelFiles> open_hf_dir(const std::string& dir);
Result<ModelFiles> open_dummy(const std::string& config_path, const OpenOptions& opts);
// The ModelConfig of a Hugging Face config.json (no weights), as the loaders read it.
// any_architecture: a model_type the loaders do not support (mixtral, qwen2_moe, ...) is
// read with llama's field names -- for the simulator, which needs only the dimensions.
Result<ModelConfig> read_hf_config(const std::string& config_path, bool any_architecture = false);

}  // namespace troupe
