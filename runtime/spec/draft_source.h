// Where speculative drafts come from (issue 35): one interface for every method, so the
// scheduler core plans drafts the same way whatever proposes them. A source is asked, for
// one decoding sequence, for at most `max` tokens likely to follow `tokens` (the prompt and
// what was generated so far); it may return fewer, or none (nothing worth feeding: the
// sequence then decodes one token as usual). Proposals are guesses only: the target model
// verifies every one in the same packed step (runtime/sample/speculative.h), so a source
// can never change the output, only how many steps it takes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace troupe {

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // The method's name as `troupe serve --speculative` spells it ("ngram", "self:8", ...).
  virtual std::string name() const = 0;
  virtual std::vector<int32_t> propose(int64_t seq, const std::vector<int32_t>& tokens, int32_t max) = 0;
  // The sequence is gone (finished, cancelled, preempted): state kept for it can go.
  virtual void release(int64_t /*seq*/) {}
};

// The source `--speculative METHOD` names: "ngram" (prompt lookup). An unknown method is
// an error that lists the known ones.
Result<std::unique_ptr<DraftSource>> make_draft_source(const std::string& method);

}  // namespace troupe
