#include "runtime/sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/philox.h"

namespace troupe {

Sampler::Sampler(SamplingParams params, int32_t vocab_size)
    : p_(std::move(params)), vocab_(vocab_size), seen_(static_cast<size_t>(vocab_size), 0) {}

void Sampler::add_prompt(const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens)
    if (t >= 0 && t < vocab_) seen_[t] = 1;
}

void Sampler::set_token_bytes(std::shared_ptr<const TokenBytes> tokens) {
  if (p_.json_object && tokens && static_cast<int32_t>(tokens->bytes.size()) == vocab_)
    json_.emplace(std::move(tokens));
}

void Sampler::set_grammar(std::shared_ptr<GrammarTable> table) {
  if (!p_.grammar.empty() && table && static_cast<int32_t>(table->tokens().bytes.size()) == vocab_)
    grammar_.emplace(std::move(table));
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= vocab_) return;
  if (json_) json_->accept(token);
  if (grammar_) grammar_->accept(token);
  seen_[token] = 1;
  ++generated_counts_[token];
}

SampleResult Sampler::sample(const float* logits) {
  SampleResult res;
  const int32_t n = vocab_;
  // A NaN logit would break the sorts' strict weak ordering (undefined behaviour, possibly
  // reads outside idx_) and poison the log-softmax; it is never a sensible choice, so it
  // counts as -inf everywhere.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto raw = [&](int32_t i) { return std::isnan(logits[i]) ? neg_inf : logits[i]; };
  // Log-softmax of the raw logits for reporting (only when asked for: a pass over the vocabulary).
  float log_z = 0;
  if (p_.report_logprob || p_.logprobs > 0) {
    float mx = neg_inf;
    for (int32_t i = 0; i < n; ++i) mx = std::max(mx, raw(i));
    double z = 0;
    for (int32_t i = 0; i < n; ++i) z += std::exp(raw(i) - mx);  // float exp, double sum: ample for a log-probability
    log_z = mx + static_cast<float>(std::log(z));
  }

  work_.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) work_[i] = raw(i);
  if (p_.repetition_penalty != 1.0f)
    for (int32_t i = 0; i < n; ++i)
      if (seen_[i]) work_[i] = work_[i] > 0 ? work_[i] / p_.repetition_penalty : work_[i] * p_.repetition_penalty;
  for (const auto& [tok, cnt] : generated_counts_)
    work_[tok] -= p_.presence_penalty + p_.frequency_penalty * static_cast<float>(cnt);
  // validate() refuses out-of-vocabulary keys; this `if` keeps a caller that skipped it
  // from writing outside work_.
  for (const auto& [tok, b] : p_.logit_bias)
    if (tok >= 0 && tok < n) work_[tok] += b;
  if (json_) json_->mask(work_.data(), n);  // after the bias: a bias cannot bring back a banned token
  if (grammar_) grammar_->mask(work_.data(), n);

  int32_t chosen = 0;
  if (p_.temperature == 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    // Candidates in logit order (ties by id, so the order is fully deterministic): the
    // top-k, else the whole vocabulary. Only the head of that order is ever walked (top-p,
    // min-p and the draw stop early), so it is sorted in stages: the best 64 first, more
    // only when the walk runs past them. Sorting all 49k candidates for every token would
    // cost more than a small model's whole decode step.
    auto better = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
    const int32_t k0 = p_.top_k > 0 && p_.top_k < n ? p_.top_k : n;
    idx_.resize(static_cast<size_t>(n));
    std::iota(idx_.begin(), idx_.end(), 0);
    const float top = *std::max_element(work_.begin(), work_.end());
    const double inv_t = 1.0 / p_.temperature;
    auto weight = [&](int32_t i) {
      return static_cast<double>(std::exp(static_cast<float>((work_[i] - top) * inv_t)));
    };
    // The normaliser over the candidates: all of them, or (top-k) the k best.
    double sum = 0;
    bool small_topk = false;
    if (k0 == n) {
      for (int32_t i = 0; i < n; ++i) sum += weight(i);
    } else if (k0 <= 256) {  // a small top-k: sort it whole at once
      std::partial_sort(idx_.begin(), idx_.begin() + k0, idx_.end(), better);
      for (int32_t i = 0; i < k0; ++i) sum += weight(idx_[i]);
      small_topk = true;
    } else {
      std::nth_element(idx_.begin(), idx_.begin() + (k0 - 1), idx_.end(), better);
      for (int32_t i = 0; i < k0; ++i) sum += weight(idx_[i]);
    }
    const double u01 = philox_uniform(p_.seed, draws_);  // 53 random bits
    std::vector<double> probs;
    int32_t sorted = 0;
    // Sorts positions [sorted, m) of the candidates into order.
    auto sort_to = [&](int32_t m) {
      if (m <= sorted) return;
      const auto last = idx_.begin() + k0;
      std::partial_sort(idx_.begin() + sorted, idx_.begin() + m, last, better);
      for (int32_t i = sorted; i < m; ++i) probs.push_back(weight(idx_[i]) / sum);
      sorted = m;
    };
    auto grow = [&] { sort_to(std::min(k0, std::max<int32_t>(64, sorted * 4))); };
    if (small_topk) {  // already in order
      for (int32_t i = 0; i < k0; ++i) probs.push_back(weight(idx_[i]) / sum);
      sorted = k0;
    }
    grow();
    int32_t k = k0;
    if (p_.min_p > 0) {
      const double cut = probs[0] * p_.min_p;
      int32_t keep = 1;
      while (true) {
        while (keep < sorted && probs[keep] >= cut) ++keep;
        if (keep < sorted || sorted == k0) break;
        grow();
      }
      k = keep;
    }
    if (p_.top_p < 1.0f) {
      double c = 0;
      int32_t keep = 0;
      while (keep < k) {
        if (keep == sorted) grow();
        c += probs[keep++];
        if (c >= p_.top_p) break;
      }
      k = std::max(1, keep);
    }
    // The draw over the kept mass: when nothing was cut it is 1 (up to rounding), so walk
    // the order until the draw falls in a token's share, sorting further only if needed.
    double total = 0;
    if (k == k0) {
      total = 1.0;  // sum / sum
    } else {
      for (int32_t i = 0; i < k; ++i) total += probs[i];
    }
    const double u = u01 * total;
    double acc = 0;
    chosen = -1;
    for (int32_t i = 0; i < k; ++i) {
      if (i == sorted) grow();
      acc += probs[i];
      if (u < acc) {
        chosen = idx_[i];
        break;
      }
    }
    if (chosen < 0) {  // rounding left u past the last share: the last token with any weight
      sort_to(k);
      int32_t i = k - 1;
      while (i > 0 && !(probs[i] > 0)) --i;
      chosen = idx_[i];
    }
  }
  ++draws_;
  res.token = chosen;
  res.logprob = p_.report_logprob || p_.logprobs > 0 ? raw(chosen) - log_z : 0.0f;
  if (p_.logprobs > 0) {
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const int32_t k = std::min(p_.logprobs, n);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return raw(a) > raw(b) || (raw(a) == raw(b) && a < b); });
    for (int32_t i = 0; i < k; ++i) res.top.push_back({order[i], raw(order[i]) - log_z});
  }
  return res;
}

bool Sampler::device_eligible() const {
  return p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f &&
         p_.logit_bias.empty() && p_.logprobs == 0 && !p_.json_object && p_.grammar.empty();
}

DeviceSampleParams Sampler::device_params() const {
  DeviceSampleParams d;
  d.temperature = p_.temperature;
  d.top_k = p_.top_k;
  d.top_p = p_.top_p;
  d.min_p = p_.min_p;
  d.seed = p_.seed;
  d.counter = draws_;
  d.want_logprob = p_.report_logprob ? 1 : 0;
  d.on_device = device_eligible() ? 1 : 0;
  return d;
}

Result<SampleResult> Sampler::device_draw(int32_t token, float logprob) {
  if (token < 0 || token >= vocab_)
    return make_error("the backend sampled token " + std::to_string(token) + ", outside the vocabulary");
  ++draws_;
  SampleResult r;
  r.token = token;
  r.logprob = logprob;
  return r;
}

}  // namespace troupe
