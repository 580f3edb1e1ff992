// Decoding one sequence with prompt-lookup drafts (n-gram speculation, as vLLM's "ngram"
// method and llama.cpp's lookup decoding): when the last tokens of the sequence appeared
// before in it, the tokens that followed them then are fed as drafts in the same step as
// the token just sampled, and every row's logits come back. The next token is sampled from
// the first row as always; while it equals the draft the step fed after it, the next
// row's logits are already the right ones and the token after is sampled from them without
// another step. The first token that differs ends the run of drafts, and the cache forgets
// the drafts after it. A step feeds one draft at first, twice as many after a step whose
// drafts were all accepted, and one more than were accepted after one that missed: on a CPU
// a step of k + 1 tokens costs several times one token's, so drafts go where they land.
//
// Every token is sampled with the same sampler, in the same order, from logits that are
// bit for bit those of feeding one token at a time (a forward step's rows do not depend on
// how the sequence is cut into steps: tests/runtime/model_test.cpp), so the tokens are the
// ones decoding without drafts gives, for greedy and seeded sampling alike: drafts only
// change how many steps it takes (tests/runtime/lookup_decoder_test.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/sample/sampler.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/spec/ngram_draft.h"  // propose_lookup_drafts

namespace troupe {

struct LookupStats {
  int64_t steps = 0;     // forward steps taken after the prompt
  int64_t drafted = 0;   // draft tokens fed
  int64_t accepted = 0;  // drafts whose row gave the next token
};

class LookupDecoder {
 public:
  // max_drafts 0: one token a step, as SequenceRunner::feed_and_sample. `fed` (optional)
  // gets every token whose KV the cache keeps, in order (a chat's record of the cache);
  // `history` is what the sequence held before (for the lookup).
  LookupDecoder(SequenceRunner& runner, Sampler& sampler, int max_drafts, std::vector<int32_t> history = {},
                std::vector<int32_t>* fed = nullptr);
  // Feeds the prompt and samples the token after it.
  Result<SampleResult> prefill(const std::vector<int32_t>& tokens);
  // `s`, the token returned last, was accepted into the sampler: returns the token after
  // it. `wanted`: how many more tokens the caller may still take after that one (drafts
  // beyond it would be wasted).
  Result<SampleResult> next(const SampleResult& s, int wanted);
  // Leaves the cache holding only the tokens fed and accepted (call when stopping).
  void finish();
  const LookupStats& stats() const { return stats_; }
  // The tokens in the cache that stay there: the runner's length less the drafts fed and
  // not (yet) accepted.
  int32_t kept_length() const { return verifying_ ? base_ + static_cast<int32_t>(row_) + 1 : runner_.length(); }
  static constexpr int kMaxNgram = NgramDraft::kMaxNgram, kMinNgram = NgramDraft::kMinNgram;

 private:
  SequenceRunner& runner_;
  Sampler& sampler_;
  int max_drafts_;
  std::vector<int32_t> history_;
  std::vector<int32_t>* fed_;
  LookupStats stats_;
  // A step with drafts being verified: its rows' logits, its drafts, the row the last
  // token came from, and the cache length that row's token leaves valid.
  std::vector<float> rows_;
  std::vector<int32_t> drafts_;
  size_t row_ = 0;
  int32_t base_ = 0;  // cache length before the step
  bool verifying_ = false;
  int run_ = 1;  // drafts the next step may feed (grows while they are accepted)
};

}  // namespace troupe
