#include "runtime/spec/draft_source.h"

#include "runtime/spec/ngram_draft.h"

namespace troupe {

Status SelfDraft::bind(const DraftTarget& t) {
  // (L = all the layers is allowed: every greedy draft then lands, a check of the draft
  // rounds, never faster)
  if (layers_ < 1 || layers_ > t.num_layers)
    return make_error("self:" + std::to_string(layers_) + ": the draft's layers must be 1.." +
                      std::to_string(t.num_layers) + " (the model has " + std::to_string(t.num_layers) + " layers)");
  const double head = t.head_layers > 0 ? t.head_layers : 0;
  round_cost_ = (layers_ + head) / (t.num_layers + head);
  return {};
}

Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& method) {
  if (method == "ngram") return std::unique_ptr<DraftSource>(new NgramDraft());
  if (method.rfind("self:", 0) == 0) {
    const std::string n = method.substr(5);
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1)
      return make_error("'" + method + "': self:L takes a layer count L >= 1 (the target's first L layers draft)");
    return std::unique_ptr<DraftSource>(new SelfDraft(std::stoi(n)));
  }
  return make_error("unknown speculative method '" + method + "' (known: ngram, self:L)");
}

}  // namespace troupe
