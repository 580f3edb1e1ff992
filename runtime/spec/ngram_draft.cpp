#include "runtime/spec/ngram_draft.h"

#include <algorithm>

namespace troupe {

std::vector<int32_t> propose_lookup_drafts(const std::vector<int32_t>& history, int max_ngram, int min_ngram,
                                           int max_drafts) {
  const int64_t len = static_cast<int64_t>(history.size());
  if (max_drafts <= 0 || min_ngram < 1) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, len - 1); n >= min_ngram; --n) {
    const int32_t* key = history.data() + (len - n);
    // The latest earlier occurrence: it starts at j and ends before the key itself.
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (!std::equal(key, key + n, history.data() + j)) continue;
      const int64_t from = j + n, to = std::min(len, from + max_drafts);
      return std::vector<int32_t>(history.begin() + from, history.begin() + to);
    }
  }
  return {};
}

}  // namespace troupe
