#include "runtime/sample/speculative.h"

#include <algorithm>

namespace troupe {

std::vector<SampleResult> verify_drafts(Sampler& s, const std::vector<int32_t>& drafts,
                                        const std::function<const float*(size_t)>& row) {
  std::vector<SampleResult> out;
  out.reserve(drafts.size() + 1);
  for (size_t i = 0; i <= drafts.size(); ++i) {
    SampleResult r = s.sample(row(i));
    s.accept(r.token);
    const bool matches = i < drafts.size() && r.token == drafts[i];
    out.push_back(std::move(r));
    if (!matches) break;
  }
  return out;
}

size_t sequence_rows(const std::vector<int64_t>& logit_seq, size_t first) {
  size_t n = 1;
  while (first + n < logit_seq.size() && logit_seq[first + n] == logit_seq[first]) ++n;
  return n;
}

bool verifies_drafts(const std::vector<int64_t>& logit_seq, size_t i) {
  return (i > 0 && logit_seq[i - 1] == logit_seq[i]) || (i + 1 < logit_seq.size() && logit_seq[i + 1] == logit_seq[i]);
}

Result<std::vector<int32_t>> drafts_after_rows(const std::vector<int32_t>& logit_rows,
                                               const std::vector<int32_t>& token_ids, size_t first, size_t n) {
  std::vector<int32_t> drafts(n > 0 ? n - 1 : 0);
  for (size_t j = 0; j + 1 < n; ++j) {
    const int32_t next = logit_rows[first + j] + 1;
    if (next < 0 || static_cast<size_t>(next) >= token_ids.size() || logit_rows[first + j + 1] != next)
      return make_error("a step verifies drafts out of order (rows " + std::to_string(first) + ".." +
                        std::to_string(first + n - 1) + ")");
    drafts[j] = token_ids[static_cast<size_t>(next)];
  }
  return drafts;
}

RejectionDraw rejection_sample(const float* p, const float* q, int32_t vocab, int32_t draft, double u_accept,
                               double u_resample) {
  RejectionDraw d;
  if (draft >= 0 && draft < vocab) {
    const double pd = p[draft], qd = q[draft];
    if ((pd >= qd && qd > 0) || u_accept * qd < pd) return {draft, true};  // u < min(1, p/q)
  }
  // The residual max(0, p - q), normalised; drawn by inverting its running sum.
  double total = 0;
  for (int32_t i = 0; i < vocab; ++i) total += std::max(0.0, double(p[i]) - double(q[i]));
  if (total <= 0) {  // p == q everywhere (then the draft is always accepted above); keep p
    for (int32_t i = 0; i < vocab; ++i) total += p[i];
    double acc = 0, target = u_resample * total;
    for (int32_t i = 0; i < vocab; ++i)
      if ((acc += p[i]) > target) return {i, false};
    return {vocab - 1, false};
  }
  double acc = 0, target = u_resample * total;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    const double r = std::max(0.0, double(p[i]) - double(q[i]));
    if (r <= 0) continue;
    last = i;
    if ((acc += r) > target) return {i, false};
  }
  d.token = last;  // (rounding at the top end)
  return d;
}

}  // namespace troupe
