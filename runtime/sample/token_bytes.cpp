// token_bytes() of runtime/sample/json_constraint.h: kept apart so that the constraint itself
// needs no tokenizer (the sampler links it alone, as in the request-parsing fuzz target).
#include "runtime/sample/json_constraint.h"
#include "runtime/tokenizer/tokenizer.h"

namespace troupe {

std::shared_ptr<const TokenBytes> token_bytes(const Tokenizer& tok) {
  auto out = std::make_shared<TokenBytes>();
  const int32_t n = tok.vocab_size();
  out->bytes.resize(static_cast<size_t>(n));
  out->eog.assign(static_cast<size_t>(n), 0);
  // Decoded after an anchor token, so that a tokenizer that strips the first space of a
  // text keeps this token's.
  const auto anchor = tok.encode("a", false, false);
  const std::string anchor_text = anchor.size() == 1 ? tok.decode(anchor, true) : std::string();
  for (int32_t t = 0; t < n; ++t) {
    if (tok.is_eog(t)) {
      out->eog[static_cast<size_t>(t)] = 1;
      continue;
    }
    if (tok.is_special(t)) continue;
    std::string b;
    if (!anchor_text.empty()) {
      b = tok.decode({anchor[0], t}, true);
      b = b.size() >= anchor_text.size() && b.compare(0, anchor_text.size(), anchor_text) == 0
              ? b.substr(anchor_text.size())
              : tok.decode({t}, true);
    } else {
      b = tok.decode({t}, true);
    }
    out->bytes[static_cast<size_t>(t)] = std::move(b);
  }
  out->finish();
  return out;
}

}  // namespace troupe
