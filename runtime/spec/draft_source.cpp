#include "runtime/spec/draft_source.h"

#include "runtime/spec/ngram_draft.h"

namespace troupe {

Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& method) {
  if (method == "ngram") return std::unique_ptr<DraftSource>(new NgramDraft());
  return make_error("unknown speculative method '" + method + "' (known: ngram)");
}

}  // namespace troupe
