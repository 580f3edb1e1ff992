#include "runtime/engine/sequence_runner.h"

#include <algorithm>
#include <numeric>

namespace troupe {

Result<std::unique_ptr<SequenceRunner>> SequenceRunner::create(Model& model, Backend& backend, int32_t context,
                                                               int32_t block_size) {
  const ModelConfig& c = model.config();
  if (context <= 0 || context > c.max_context)
    return make_error("context " + std::to_string(context) + " is out of range (1.." + std::to_string(c.max_context) +
                      ")");
  if (block_size <= 0 || block_size > 1024)
    return make_error("block size " + std::to_string(block_size) + " is out of range");
  auto r = std::unique_ptr<SequenceRunner>(new SequenceRunner());
  r->model_ = &model;
  r->context_ = context;
  r->block_size_ = block_size;
  KvCacheShape s;
  s.num_layers = c.num_layers;
  s.num_blocks = (context + block_size - 1) / block_size;
  s.block_size = block_size;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  auto cache = backend.make_kv_cache(s);
  if (!cache) return cache.error();
  r->cache_ = std::move(*cache);
  r->block_table_.resize(static_cast<size_t>(s.num_blocks));
  std::iota(r->block_table_.begin(), r->block_table_.end(), 0);
  r->logits_.resize(static_cast<size_t>(c.vocab));
  return r;
}

Result<const float*> SequenceRunner::feed(const std::vector<int32_t>& tokens) {
  TROUPE_TRY(feed_tokens(tokens, nullptr));
  return static_cast<const float*>(logits_.data());
}

Result<SampleResult> SequenceRunner::feed_and_sample(const std::vector<int32_t>& tokens, Sampler& sampler) {
  if (!model_->samples_on_device() || !sampler.device_eligible()) {
    auto l = feed(tokens);
    if (!l) return l.error();
    return sampler.sample(*l);
  }
  const DeviceSampleParams p = sampler.device_params();
  int32_t token = -1;
  float logprob = 0;
  DeviceSampling ds{&p, &token, &logprob};
  TROUPE_TRY(feed_tokens(tokens, &ds));
  return sampler.device_draw(token, logprob);
}

Status SequenceRunner::feed_rows(const std::vector<int32_t>& tokens, float* rows) {
  if (tokens.size() > static_cast<size_t>(model_->max_batch_tokens()))
    return make_error("feed_rows: " + std::to_string(tokens.size()) + " tokens exceed the model's step of " +
                      std::to_string(model_->max_batch_tokens()));
  return feed_tokens(tokens, nullptr, rows);
}

Status SequenceRunner::feed_tokens(const std::vector<int32_t>& tokens, const DeviceSampling* sampling,
                                   float* all_rows) {
  if (tokens.empty()) return make_error("no tokens to feed");
  if (static_cast<int64_t>(length_) + static_cast<int64_t>(tokens.size()) > context_)
    return make_error("sequence of " + std::to_string(length_ + tokens.size()) + " tokens exceeds the context of " +
                      std::to_string(context_));
  const int32_t chunk = model_->max_batch_tokens();
  std::vector<int32_t> pos, slots;
  for (size_t off = 0; off < tokens.size(); off += static_cast<size_t>(chunk)) {
    const int32_t n = static_cast<int32_t>(std::min<size_t>(static_cast<size_t>(chunk), tokens.size() - off));
    pos.resize(static_cast<size_t>(n));
    slots.resize(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      pos[i] = length_ + i;
      slots[i] = block_table_[pos[i] / block_size_] * block_size_ + pos[i] % block_size_;
    }
    const int32_t qs[2] = {0, n};
    const int32_t ctx = length_ + n;
    StepInputs st;
    st.num_tokens = n;
    st.num_seqs = 1;
    st.token_ids = tokens.data() + off;
    st.positions = pos.data();
    st.query_start = qs;
    st.context_lens = &ctx;
    st.slot_mapping = slots.data();
    st.block_tables = block_table_.data();
    st.max_blocks_per_seq = static_cast<int32_t>(block_table_.size());
    const bool last = off + static_cast<size_t>(n) == tokens.size();
    if (all_rows) {  // (one step: feed_rows checks the size)
      std::vector<int32_t> rows(static_cast<size_t>(n));
      std::iota(rows.begin(), rows.end(), 0);
      TROUPE_TRY(model_->forward(st, *cache_, rows.data(), n, all_rows, nullptr));
      length_ += n;
      continue;
    }
    const int32_t row = n - 1;
    TROUPE_TRY(model_->forward(st, *cache_, &row, last ? 1 : 0, logits_.data(), last ? sampling : nullptr));
    length_ += n;
  }
  return {};
}

}  // namespace troupe
