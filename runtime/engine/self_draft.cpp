#include "runtime/engine/self_draft.h"

#include <algorithm>

namespace troupe {

DraftTarget draft_target(const ModelConfig& c) {
  DraftTarget t;
  t.num_layers = c.num_layers;
  auto d = [](int32_t v) { return static_cast<double>(v); };
  const double q = d(c.num_heads) * c.head_dim, kv = d(c.num_kv_heads) * c.head_dim;
  const double ffn = c.moe.num_experts > 0 ? d(c.moe.expert_ffn) * c.moe.experts_per_tok + c.moe.shared_ffn : d(c.ffn);
  const double layer = c.hidden * (2 * q + 2 * kv + 3 * ffn);  // (the weights one token's pass reads)
  t.head_layers = layer > 0 ? d(c.vocab) * c.hidden / layer : 0;
  return t;
}

bool SelfDrafter::wants_drafts(const StepInputs& s) {
  return std::find(s.token_ids, s.token_ids + s.num_tokens, kWorkerDraft) != s.token_ids + s.num_tokens;
}

Status SelfDrafter::fill(Model& model, KvCache& cache, int32_t layers, const StepInputs& s, int32_t* tokens) {
  rounds_ = 0;
  seqs_.clear();
  for (int32_t i = 0; i < s.num_seqs; ++i) {
    const int32_t b = s.query_start[i], e = s.query_start[i + 1];
    if (b < 0 || e < b || e > s.num_tokens) return make_error("step sequence offsets are inconsistent");
    int32_t j0 = e;
    while (j0 > b && tokens[j0 - 1] == kWorkerDraft) --j0;
    if (std::find(tokens + b, tokens + j0, kWorkerDraft) != tokens + j0)
      return make_error("step sequence " + std::to_string(i) + ": a draft placeholder before a known token");
    if (j0 == e) continue;
    if (j0 == b) return make_error("step sequence " + std::to_string(i) + ": drafts with no known token before them");
    seqs_.push_back({i, b, j0, e - j0});
    rounds_ = std::max(rounds_, e - j0);
  }
  const int32_t vocab = model.config().vocab, mb = s.max_blocks_per_seq;
  for (int32_t r = 0; r < rounds_; ++r) {
    ids_.clear(), pos_.clear(), slots_.clear(), ctx_.clear(), tables_.clear(), rows_.clear();
    qs_.assign(1, 0);
    for (const Seq& q : seqs_) {
      if (q.drafts <= r) continue;
      // round 0: the step's known tokens of the sequence; then the draft before this one
      const int32_t from = r == 0 ? q.begin : q.first_draft + r - 1, to = q.first_draft + r;
      for (int32_t j = from; j < to; ++j) {
        ids_.push_back(tokens[j]);
        pos_.push_back(s.positions[j]);
        slots_.push_back(s.slot_mapping[j]);
      }
      qs_.push_back(static_cast<int32_t>(ids_.size()));
      ctx_.push_back(s.positions[to - 1] + 1);
      tables_.insert(tables_.end(), s.block_tables + int64_t{q.index} * mb, s.block_tables + int64_t{q.index + 1} * mb);
      rows_.push_back(qs_.back() - 1);
    }
    StepInputs d;
    d.num_tokens = static_cast<int32_t>(ids_.size());
    d.num_seqs = static_cast<int32_t>(ctx_.size());
    d.token_ids = ids_.data();
    d.positions = pos_.data();
    d.query_start = qs_.data();
    d.context_lens = ctx_.data();
    d.slot_mapping = slots_.data();
    d.block_tables = tables_.data();
    d.max_blocks_per_seq = mb;
    logits_.resize(rows_.size() * static_cast<size_t>(vocab));
    TROUPE_TRY(model.forward_draft(d, cache, layers, rows_.data(), static_cast<int32_t>(rows_.size()), logits_.data()));
    size_t row = 0;
    for (const Seq& q : seqs_) {
      if (q.drafts <= r) continue;
      const float* l = logits_.data() + row++ * vocab;
      tokens[q.first_draft + r] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);  // (ties: the lowest id)
    }
  }
  return {};
}

}  // namespace troupe
