// The n-gram / prompt-lookup draft source (vLLM's "ngram" method, llama.cpp's lookup
// decoding): when the last n tokens of a sequence appeared earlier in it, the tokens that
// followed them then are the drafts. Needs no model, so it costs nothing when it finds no
// match; it lands on copy-heavy work (summaries, edits, code that repeats its input).
// `troupe run`'s LookupDecoder and `troupe serve --speculative ngram` share this code.
#pragma once
#include "runtime/spec/draft_source.h"

namespace troupe {

// Drafts for `history`: for n from max_ngram down to min_ngram, the tokens (at most
// max_drafts) that followed the latest earlier occurrence of its last n tokens; empty when
// none occurs. O(history x max_ngram).
std::vector<int32_t> propose_lookup_drafts(const std::vector<int32_t>& history, int max_ngram, int min_ngram,
                                           int max_drafts);

class NgramDraft : public DraftSource {
 public:
  static constexpr int kMaxNgram = 4, kMinNgram = 3;
  explicit NgramDraft(int max_ngram = kMaxNgram, int min_ngram = kMinNgram)
      : max_ngram_(max_ngram), min_ngram_(min_ngram) {}
  std::string name() const override { return "ngram"; }
  std::vector<int32_t> propose(int64_t, const std::vector<int32_t>& tokens, int32_t max) override {
    return propose_lookup_drafts(tokens, max_ngram_, min_ngram_, max);
  }

 private:
  int max_ngram_, min_ngram_;
};

}  // namespace troupe
