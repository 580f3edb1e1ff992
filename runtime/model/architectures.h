// The architecture families Troupe runs. Each family lives in one file under
// runtime/models/ and says how file metadata becomes a ModelConfig; the forward pass is
// shared (runtime/model/model.cpp). Adding a family: see docs/adding-an-architecture.md.
#pragma once
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/format/gguf.h"
#include "runtime/model/model_config.h"

namespace troupe {

struct Architecture {
  std::string_view name;  // GGUF general.architecture and HF model_type
  Result<ModelConfig> (*from_gguf)(const gguf::File& f);
  Result<ModelConfig> (*from_hf)(const nlohmann::json& config);
};

// nullptr when unsupported.
const Architecture* find_architecture(std::string_view name);
std::string supported_architectures();

// Shared helpers for Llama-like families.
Result<ModelConfig> llama_like_from_gguf(const gguf::File& f, std::string_view arch);
Result<ModelConfig> llama_like_from_hf(const nlohmann::json& c);

}  // namespace troupe
