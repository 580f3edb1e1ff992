// Verifying speculative drafts: lossless by construction, shown by tests.
//
// The general rule (Leviathan et al. 2023, Chen et al. 2023; vLLM's rejection sampler): a
// draft x drawn from the draft's distribution q is accepted with probability
// min(1, p(x) / q(x)), p the target's distribution at that position; on rejection the
// token is drawn from the normalised max(0, p - q) and the run of drafts ends. The emitted
// token is then distributed exactly as p (rejection_sample; tests/runtime/speculative_test.cpp
// checks it over 100k draws with a chi-squared test).
//
// Every draft source Troupe has now proposes tokens, not distributions (the n-gram lookup;
// a draft model decoding greedily): q is a point mass on x. The rule becomes: accept x with
// probability p(x), else draw from p with x taken out, renormalised -- which is exactly
// "draw t from p; accept the draft when t == x, else emit t". verify_drafts does that with
// the request's own sampler, row after row: the same processors (penalties, logit bias,
// top-k/p, min-p, JSON mode) and the same counter-based draw for each position as decoding
// without drafts makes, so a seed gives the same text with speculation on or off, alone or
// batched (tests/runtime/spec_engine_test.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/sample/sampler.h"

namespace troupe {

// Samples rows 0..drafts.size() in order, each through `s` (and accepted into it), and
// stops after the first token that differs from the draft fed after its row; row(i) gives
// row i's logits [vocab]. Returns the tokens to emit: the accepted drafts, then the
// target's own next token (1 to drafts.size() + 1 of them).
std::vector<SampleResult> verify_drafts(Sampler& s, const std::vector<int32_t>& drafts,
                                        const std::function<const float*(size_t)>& row);

// A step's logit rows, as the step planner lays them out: a sequence verifying drafts has
// consecutive rows (its last known token's, then one per draft); the draft fed after row r
// is the step's token r + 1.
// The number of consecutive rows of row `first`'s sequence (1: no drafts).
size_t sequence_rows(const std::vector<int64_t>& logit_seq, size_t first);
// Whether row i belongs to a sequence with several rows (its draws follow each other on the
// host: none of them can be drawn on the device).
bool verifies_drafts(const std::vector<int64_t>& logit_seq, size_t i);
// The drafts fed after rows first .. first + n - 2 (n - 1 of them); an error when the rows
// are not consecutive positions of the step's tokens.
Result<std::vector<int32_t>> drafts_after_rows(const std::vector<int32_t>& logit_rows,
                                               const std::vector<int32_t>& token_ids, size_t first, size_t n);

struct RejectionDraw {
  int32_t token = -1;
  bool accepted = false;  // the draft itself
};

// One position of the general rejection sampler: p and q are the target's and the draft's
// probabilities over the vocabulary (each summing to 1), `draft` was drawn from q, u_accept
// and u_resample are independent uniforms in [0, 1). (A draft q gives probability 0 is
// accepted when p gives it more, min(1, p/0) = 1, and rejected when p does not either.)
RejectionDraw rejection_sample(const float* p, const float* q, int32_t vocab, int32_t draft, double u_accept,
                               double u_resample);

}  // namespace troupe
