#include "runtime/engine/lookup_decoder.h"

#include <algorithm>

namespace troupe {

LookupDecoder::LookupDecoder(SequenceRunner& runner, Sampler& sampler, int max_drafts, std::vector<int32_t> history,
                             std::vector<int32_t>* fed)
    : runner_(runner),
      sampler_(sampler),
      max_drafts_(std::max(0, max_drafts)),
      history_(std::move(history)),
      fed_(fed) {}

Result<SampleResult> LookupDecoder::prefill(const std::vector<int32_t>& tokens) {
  auto r = runner_.feed_and_sample(tokens, sampler_);
  if (!r) return r;
  history_.insert(history_.end(), tokens.begin(), tokens.end());
  if (fed_) fed_->insert(fed_->end(), tokens.begin(), tokens.end());
  return r;
}

Result<SampleResult> LookupDecoder::next(const SampleResult& s, int wanted) {
  history_.push_back(s.token);
  if (verifying_) {
    // s was sampled from row row_, and the step fed drafts_[row_] right after that row's
    // token: if they are the same, row row_ + 1 holds the logits after s.
    if (row_ < drafts_.size() && s.token == drafts_[row_]) {
      ++stats_.accepted;
      if (fed_) fed_->push_back(s.token);
      ++row_;
      return sampler_.sample(rows_.data() + row_ * static_cast<size_t>(runner_.vocab()));
    }
    // How many drafts the next step may feed: twice as many after a step whose drafts were
    // all accepted, else one more than this step's accepted (a CPU step of k + 1 tokens
    // costs far more than one token's, so drafts are spent where they have been landing).
    run_ = row_ == drafts_.size() ? std::min(max_drafts_, 2 * run_) : static_cast<int>(row_) + 1;
    finish();
  }
  int k = std::min({run_, max_drafts_, wanted, runner_.context() - runner_.length() - 1, runner_.max_batch() - 1});
  std::vector<int32_t> drafts;
  if (k > 0) drafts = propose_lookup_drafts(history_, kMaxNgram, kMinNgram, k);
  ++stats_.steps;
  if (drafts.empty()) {
    auto r = runner_.feed_and_sample({s.token}, sampler_);
    if (r && fed_) fed_->push_back(s.token);
    return r;
  }
  std::vector<int32_t> step;
  step.reserve(drafts.size() + 1);
  step.push_back(s.token);
  step.insert(step.end(), drafts.begin(), drafts.end());
  rows_.resize(step.size() * static_cast<size_t>(runner_.vocab()));
  base_ = runner_.length();
  if (auto st = runner_.feed_rows(step, rows_.data()); !st) return st.error();
  stats_.drafted += static_cast<int64_t>(drafts.size());
  if (fed_) fed_->push_back(s.token);
  drafts_ = std::move(drafts);
  row_ = 0;
  verifying_ = true;
  return sampler_.sample(rows_.data());
}

void LookupDecoder::finish() {
  if (!verifying_) return;
  runner_.truncate(base_ + static_cast<int32_t>(row_) + 1);  // s and the drafts accepted after it
  verifying_ = false;
}

}  // namespace troupe
