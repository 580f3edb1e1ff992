// Runs one sequence through a Model: owns its KV cache and block table, feeds prompt
// tokens in chunks of the model's max batch and returns the last position's logits.
// Used by `troupe run`, `troupe bench` and the tests; the server batches many sequences
// through the scheduler instead.
#pragma once
#include <memory>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/sample/sampler.h"

namespace troupe {

class SequenceRunner {
 public:
  static Result<std::unique_ptr<SequenceRunner>> create(Model& model, Backend& backend, int32_t context,
                                                        int32_t block_size = 16);
  // Appends tokens to the sequence; returns the logits [vocab] after the last one.
  Result<const float*> feed(const std::vector<int32_t>& tokens);
  // Appends tokens and draws the next token with `sampler` (not yet accept()ed): on the
  // device when the backend samples and the sampler allows it (only the token comes back),
  // else from the logits as sampler.sample() would.
  Result<SampleResult> feed_and_sample(const std::vector<int32_t>& tokens, Sampler& sampler);
  // Appends tokens (at most max_batch() of them, one forward step) and writes the logits
  // after each one to rows [tokens.size(), vocab()]: row i is what feeding the tokens up to
  // i alone would return, bit for bit.
  Status feed_rows(const std::vector<int32_t>& tokens, float* rows);
  int32_t max_batch() const { return model_->max_batch_tokens(); }
  int32_t vocab() const { return model_->config().vocab; }
  int32_t length() const { return length_; }
  int32_t context() const { return context_; }
  void reset() { length_ = 0; }
  // Forgets every token after the first n (their cache slots are overwritten later).
  void truncate(int32_t n) {
    if (n >= 0 && n < length_) length_ = n;
  }

 private:
  Model* model_ = nullptr;
  Status feed_tokens(const std::vector<int32_t>& tokens, const DeviceSampling* sampling, float* all_rows = nullptr);

  std::unique_ptr<KvCache> cache_;
  int32_t context_ = 0, block_size_ = 16, length_ = 0;
  std::vector<int32_t> block_table_;
  std::vector<float> logits_;
};

}  // namespace troupe
