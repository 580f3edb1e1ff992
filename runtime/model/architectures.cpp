#include "runtime/model/architectures.h"

namespace troupe {

extern const Architecture kLlamaArchitecture;
extern const Architecture kMistralArchitecture;
extern const Architecture kQwen2Architecture;
extern const Architecture kQwen2MoeArchitecture;
extern const Architecture kQwen2MoeHfArchitecture;
extern const Architecture kMixtralArchitecture;
extern const Architecture kQwen3Architecture;
extern const Architecture kQwen3MoeArchitecture;
extern const Architecture kQwen3MoeHfArchitecture;
extern const Architecture kOlmoeArchitecture;

namespace {
const Architecture* const kAll[] = {&kLlamaArchitecture,    &kMistralArchitecture,    &kQwen2Architecture,
                                    &kQwen2MoeArchitecture, &kQwen2MoeHfArchitecture, &kMixtralArchitecture,
                                    &kQwen3Architecture,    &kQwen3MoeArchitecture,   &kQwen3MoeHfArchitecture,
                                    &kOlmoeArchitecture};
}

const Architecture* find_architecture(std::string_view name) {
  for (const auto* a : kAll)
    if (a->name == name) return a;
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const auto* a : kAll) s += (s.empty() ? "" : ", ") + std::string(a->name);
  return s;
}

}  // namespace troupe
