// Sampler tests: each filter and penalty against a hand-computed expectation, seeded
// determinism, the temperature distribution against softmax (chi-square over many draws
// with a fixed seed), logprobs, and validate() on hostile parameters.
#include "kernels/philox.h"
#include "runtime/sample/sampler.h"
#include "tests/runtime/sampler_reference.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using namespace troupe;

namespace {

// Samples `n` tokens, accepting each (so penalties build up as in generation).
std::vector<int32_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n, bool accept = false) {
  Sampler s(p, static_cast<int32_t>(logits.size()));
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const auto r = s.sample(logits.data());
    out.push_back(r.token);
    if (accept) s.accept(r.token);
  }
  return out;
}

std::vector<int> histogram(const SamplingParams& p, const std::vector<float>& logits, int n) {
  std::vector<int> h(logits.size(), 0);
  for (int32_t t : draw(p, logits, n)) {
    REQUIRE(t >= 0);
    REQUIRE(t < static_cast<int32_t>(logits.size()));
    ++h[t];
  }
  return h;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double mx = -1e300;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - mx) / temperature);
  for (auto& x : p) x /= z;
  return p;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.2f, 3.1f, 0.0f, -0.3f, 2.9f};  // argmax 4, then 7, 1, 3

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

int32_t greedy_pick(SamplingParams p, const std::vector<float>& logits, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& generated) {
  p.temperature = 0;
  Sampler s(p, static_cast<int32_t>(logits.size()));
  s.add_prompt(prompt);
  for (int32_t t : generated) s.accept(t);
  return s.sample(logits.data()).token;
}

}  // namespace

TEST_CASE("without report_logprob the same token is drawn and no log-probability is formed", "[sampler]") {
  for (float temp : {0.0f, 0.8f}) {
    SamplingParams with = greedy(), without = greedy();
    with.temperature = without.temperature = temp;
    with.seed = without.seed = 42;
    without.report_logprob = false;
    Sampler a(with, static_cast<int32_t>(kLogits.size())), b(without, static_cast<int32_t>(kLogits.size()));
    for (int i = 0; i < 20; ++i) {
      const SampleResult ra = a.sample(kLogits.data()), rb = b.sample(kLogits.data());
      REQUIRE(ra.token == rb.token);
      a.accept(ra.token);
      b.accept(rb.token);
      CHECK(ra.logprob < 0);
      CHECK(rb.logprob == 0);
    }
    without.logprobs = 2;  // alternatives asked for: the log-softmax is formed anyway
    Sampler c(without, static_cast<int32_t>(kLogits.size()));
    const SampleResult rc = c.sample(kLogits.data());
    CHECK(rc.logprob < 0);
    CHECK(rc.top.size() == 2);
  }
}

TEST_CASE("greedy picks the argmax, lowest id on ties", "[sampler]") {
  CHECK(draw(greedy(), kLogits, 5) == std::vector<int32_t>(5, 4));
  CHECK(draw(greedy(), {1.0f, 3.0f, 3.0f, 2.0f}, 1)[0] == 1);
  CHECK(draw(greedy(), {-5.0f, -7.0f, -4.5f}, 1)[0] == 2);
}

TEST_CASE("the same seed gives the same samples, another seed differs", "[sampler]") {
  const std::vector<float> flat(64, 0.0f);  // uniform: 64^40 possible sequences
  SamplingParams p;
  p.seed = 1234;
  const auto a = draw(p, flat, 40), b = draw(p, flat, 40);
  CHECK(a == b);
  p.seed = 1235;
  const auto c = draw(p, flat, 40);
  CHECK(a != c);
  // Not stuck on one token: a seeded stream still varies.
  CHECK(std::count(a.begin(), a.end(), a[0]) < 10);
}

TEST_CASE("top_k=1 equals greedy at any temperature", "[sampler]") {
  SamplingParams p;
  p.top_k = 1;
  p.temperature = 5.0f;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    p.seed = seed;
    CHECK(draw(p, kLogits, 50) == std::vector<int32_t>(50, 4));
  }
}

TEST_CASE("top_k keeps exactly the k best tokens", "[sampler]") {
  SamplingParams p;
  p.top_k = 3;
  p.temperature = 3.0f;  // flatten so every kept token shows up
  const auto h = histogram(p, kLogits, 3000);
  for (int t : {4, 7, 1}) CHECK(h[t] > 0);
  for (int t : {0, 2, 3, 5, 6}) CHECK(h[t] == 0);
}

TEST_CASE("a tiny top_p keeps only the top token", "[sampler]") {
  SamplingParams p;
  p.top_p = 1e-6f;
  p.temperature = 2.0f;
  CHECK(draw(p, kLogits, 200) == std::vector<int32_t>(200, 4));
  // top_p = 0.6 on probabilities (0.5, 0.3, 0.2): keeps the first two (0.5 < 0.6 <= 0.8).
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  p.top_p = 0.6f;
  p.temperature = 1.0f;
  const auto h = histogram(p, l, 4000);
  CHECK(h[2] == 0);
  // Renormalized: 0.5/0.8 = 0.625 for token 0.
  CHECK(h[0] / 4000.0 == Approx(0.625).margin(0.03));
}

TEST_CASE("min_p drops tokens below min_p times the top probability", "[sampler]") {
  // Probabilities 0.4, 0.3, 0.15, 0.1, 0.05; min_p 0.3 -> cut at 0.12: keep 0, 1, 2.
  const std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.15f), std::log(0.1f), std::log(0.05f)};
  SamplingParams p;
  p.min_p = 0.3f;
  const auto h = histogram(p, l, 6000);
  CHECK(h[0] > 0);
  CHECK(h[1] > 0);
  CHECK(h[2] > 0);
  CHECK(h[3] == 0);
  CHECK(h[4] == 0);
  CHECK(h[2] / 6000.0 == Approx(0.15 / 0.85).margin(0.03));
  p.min_p = 1.0f;  // only tokens as likely as the best
  CHECK(draw(p, l, 100) == std::vector<int32_t>(100, 0));
}

TEST_CASE("temperature sampling follows softmax(logits / T)", "[sampler]") {
  const int n = 40000;
  // 7 degrees of freedom: chi-square above 24.3 has probability 0.001 under the null.
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 99;
    const auto h = histogram(p, kLogits, n);
    const double chi = chi_square(h, softmax(kLogits, t), n);
    INFO("temperature " << t << " chi-square " << chi);
    CHECK(chi < 24.3);
    // The test has power: the same draws are far from the distribution of another T.
    const double wrong = chi_square(h, softmax(kLogits, t * 1.3), n);
    INFO("against T*1.3: " << wrong);
    CHECK(wrong > 200);
  }
}

TEST_CASE("repetition penalty divides positive and multiplies negative logits of seen tokens", "[sampler][penalty]") {
  // Token 0 at 2.0 vs token 1 at 1.5: 2/1.5 = 1.33 < 1.5 flips the choice, 2/1.2 = 1.67 does not.
  const std::vector<float> l = {2.0f, 1.5f, -1.0f};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  CHECK(greedy_pick(p, l, {0}, {}) == 1);  // prompt tokens count
  CHECK(greedy_pick(p, l, {}, {0}) == 1);  // generated tokens count
  CHECK(greedy_pick(p, l, {2}, {}) == 0);  // an unseen token is untouched
  p.repetition_penalty = 1.2f;
  CHECK(greedy_pick(p, l, {0}, {}) == 0);
  // Negative logits: -0.5 * 3 = -1.5 < -1.0, so the unseen -1.0 wins; unpenalized -0.5 would.
  const std::vector<float> neg = {-0.5f, -1.0f};
  p.repetition_penalty = 3.0f;
  CHECK(greedy_pick(p, neg, {}, {}) == 0);
  CHECK(greedy_pick(p, neg, {0}, {}) == 1);
  // A penalty below 1 rewards repetition: 1.5 / 0.5 = 3 > 2.
  p.repetition_penalty = 0.5f;
  CHECK(greedy_pick(p, l, {1}, {}) == 1);
}

TEST_CASE("presence and frequency penalties subtract from generated tokens only", "[sampler][penalty]") {
  const std::vector<float> l = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  p.presence_penalty = 0.6f;  // 2.0 - 0.6 = 1.4 < 1.5
  CHECK(greedy_pick(p, l, {}, {0}) == 1);
  CHECK(greedy_pick(p, l, {0}, {}) == 0);  // prompt tokens do not count
  p.presence_penalty = 0.4f;               // 1.6 > 1.5, and presence does not grow with the count
  CHECK(greedy_pick(p, l, {}, {0, 0, 0}) == 0);
  p.presence_penalty = 0;
  p.frequency_penalty = 0.3f;  // once: 1.7 > 1.5; twice: 1.4 < 1.5
  CHECK(greedy_pick(p, l, {}, {0}) == 0);
  CHECK(greedy_pick(p, l, {}, {0, 0}) == 1);
  CHECK(greedy_pick(p, l, {0, 0, 0}, {}) == 0);
  // Both: 2.0 - 0.2 - 0.2 * 2 = 1.4 < 1.5; a negative presence penalty rewards: 1.5 + 0.6 > 2.
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.2f;
  CHECK(greedy_pick(p, l, {}, {0, 0}) == 1);
  p.presence_penalty = -0.6f;
  p.frequency_penalty = 0;
  CHECK(greedy_pick(p, l, {}, {1}) == 1);
  // Penalties accumulate through accept() during sampling: with a strong frequency
  // penalty greedy decoding cannot repeat the same token forever.
  SamplingParams f = greedy();
  f.frequency_penalty = 2.0f;
  const auto seq = draw(f, {1.0f, 0.9f, 0.8f}, 6, /*accept=*/true);
  CHECK(seq[0] == 0);
  CHECK(seq[1] == 1);
  CHECK(seq[2] == 2);
}

TEST_CASE("a logit_bias of +100 forces a token, -100 bans one", "[sampler]") {
  SamplingParams p;
  p.logit_bias[5] = 100.0f;  // kLogits[5] is 0.0, one of the least likely
  p.temperature = 1.5f;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    p.seed = seed;
    CHECK(draw(p, kLogits, 100) == std::vector<int32_t>(100, 5));
  }
  SamplingParams g = greedy();
  g.logit_bias[5] = 100.0f;
  CHECK(draw(g, kLogits, 1)[0] == 5);
  g.logit_bias.clear();
  g.logit_bias[4] = -100.0f;
  CHECK(draw(g, kLogits, 1)[0] == 7);
}

TEST_CASE("logprobs are the log-softmax of the raw logits, top-N sorted", "[sampler][logprobs]") {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  const double log_z = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0));  // 3.4401897
  SamplingParams p = greedy();
  p.logprobs = 3;
  Sampler s(p, 4);
  auto r = s.sample(l.data());
  CHECK(r.token == 1);
  CHECK(r.logprob == Approx(3.0 - log_z).margin(1e-5));
  CHECK(r.logprob == Approx(-0.4401897).margin(1e-5));
  REQUIRE(r.top.size() == 3);
  CHECK(r.top[0].token == 1);
  CHECK(r.top[1].token == 2);
  CHECK(r.top[2].token == 0);
  CHECK(r.top[1].logprob == Approx(2.0 - log_z).margin(1e-5));
  CHECK(r.top[2].logprob == Approx(1.0 - log_z).margin(1e-5));
  for (size_t i = 1; i < r.top.size(); ++i) CHECK(r.top[i - 1].logprob >= r.top[i].logprob);

  // The chosen token's logprob ignores the bias and penalties that chose it.
  SamplingParams b = greedy();
  b.logit_bias[3] = 100.0f;
  Sampler sb(b, 4);
  auto rb = sb.sample(l.data());
  CHECK(rb.token == 3);
  CHECK(rb.logprob == Approx(0.0 - log_z).margin(1e-5));
  CHECK(rb.top.empty());  // logprobs = 0: chosen token only

  // More alternatives than the vocabulary: all of them, still sorted.
  SamplingParams all = greedy();
  all.logprobs = 20;
  Sampler sa(all, 4);
  auto ra = sa.sample(l.data());
  REQUIRE(ra.top.size() == 4);
  double total = 0;
  for (const auto& t : ra.top) total += std::exp(t.logprob);
  CHECK(total == Approx(1.0).margin(1e-5));
}

TEST_CASE("a sampler never reads or writes outside the vocabulary", "[sampler][badinput]") {
  // validate() refuses these; a caller that skips it must still not corrupt memory.
  SamplingParams p = greedy();
  p.logit_bias[4] = 100.0f;
  p.logit_bias[-1] = 100.0f;
  p.logit_bias[1 << 30] = 100.0f;
  Sampler s(p, 8);
  s.add_prompt({-3, 9, 1 << 30});
  s.accept(-1);
  s.accept(100);
  CHECK(s.sample(kLogits.data()).token == 4);
}

TEST_CASE("NaN logits do not break sampling", "[sampler][badinput]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> l(300, 0.0f);
  for (size_t i = 0; i < l.size(); i += 3) l[i] = nan;
  l[7] = 5.0f;
  SamplingParams p;
  p.temperature = 0.7f;
  for (int32_t t : draw(p, l, 50)) {
    CHECK(t >= 0);
    CHECK(t < 300);
    CHECK(t % 3 != 0);  // a NaN logit is never chosen
  }
  CHECK(draw(greedy(), l, 1)[0] == 7);  // l[0] is NaN: greedy must not return it
  // Logprobs skip NaN entries (as -inf) and stay finite for the others.
  SamplingParams lp = greedy();
  lp.logprobs = 20;
  Sampler s(lp, 300);
  const auto r = s.sample(l.data());
  CHECK(std::isfinite(r.logprob));
  REQUIRE(r.top.size() == 20);
  CHECK(r.top[0].token == 7);
  for (const auto& t : r.top) {
    CHECK(t.token % 3 != 0);
    CHECK(std::isfinite(t.logprob));
  }
}

TEST_CASE("validate rejects out-of-range, NaN and infinite parameters, naming them", "[sampler][badinput]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int32_t vocab = 100;
  CHECK(SamplingParams{}.validate(vocab).ok());
  SamplingParams ok;
  ok.temperature = 0;
  ok.top_k = 5;
  ok.top_p = 0.9f;
  ok.min_p = 0.05f;
  ok.repetition_penalty = 1.1f;
  ok.presence_penalty = -2.0f;
  ok.frequency_penalty = 2.0f;
  ok.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  ok.logprobs = 20;
  CHECK(ok.validate(vocab).ok());

  struct Case {
    const char* name;
    void (*set)(SamplingParams&, float nan, float inf);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p, float n, float) { p.temperature = n; }},
      {"temperature", [](SamplingParams& p, float, float i) { p.temperature = i; }},
      {"temperature", [](SamplingParams& p, float, float) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p, float, float) { p.temperature = 1000.0f; }},
      {"top_k", [](SamplingParams& p, float, float) { p.top_k = -1; }},
      {"top_p", [](SamplingParams& p, float n, float) { p.top_p = n; }},
      {"top_p", [](SamplingParams& p, float, float i) { p.top_p = i; }},
      {"top_p", [](SamplingParams& p, float, float) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p, float, float) { p.top_p = 1.5f; }},
      {"min_p", [](SamplingParams& p, float n, float) { p.min_p = n; }},
      {"min_p", [](SamplingParams& p, float, float) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p, float, float) { p.min_p = 1.1f; }},
      {"repetition_penalty", [](SamplingParams& p, float n, float) { p.repetition_penalty = n; }},
      {"repetition_penalty", [](SamplingParams& p, float, float i) { p.repetition_penalty = i; }},
      {"repetition_penalty", [](SamplingParams& p, float, float) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p, float, float) { p.repetition_penalty = -1.0f; }},
      {"presence_penalty", [](SamplingParams& p, float n, float) { p.presence_penalty = n; }},
      {"presence_penalty", [](SamplingParams& p, float, float i) { p.presence_penalty = -i; }},
      {"presence_penalty", [](SamplingParams& p, float, float) { p.presence_penalty = 2.5f; }},
      {"frequency_penalty", [](SamplingParams& p, float n, float) { p.frequency_penalty = n; }},
      {"frequency_penalty", [](SamplingParams& p, float, float i) { p.frequency_penalty = i; }},
      {"frequency_penalty", [](SamplingParams& p, float, float) { p.frequency_penalty = -3.0f; }},
      {"logprobs", [](SamplingParams& p, float, float) { p.logprobs = 21; }},
      {"logprobs", [](SamplingParams& p, float, float) { p.logprobs = -1; }},
      {"logit_bias", [](SamplingParams& p, float, float) { p.logit_bias[100] = 1.0f; }},
      {"logit_bias", [](SamplingParams& p, float, float) { p.logit_bias[-1] = 1.0f; }},
      {"logit_bias", [](SamplingParams& p, float n, float) { p.logit_bias[3] = n; }},
      {"logit_bias", [](SamplingParams& p, float, float i) { p.logit_bias[3] = i; }},
      {"logit_bias", [](SamplingParams& p, float, float) { p.logit_bias[3] = 101.0f; }},
      {"logit_bias",
       [](SamplingParams& p, float, float) {
         for (int32_t t = 0; t < 2000; ++t) p.logit_bias[t] = 1.0f;  // more than 1024 keys
       }},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.set(p, nan, inf);
    const Status st = p.validate(c.name == std::string("logit_bias") && p.logit_bias.size() > 1024 ? 100000 : vocab);
    INFO("case " << c.name);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.error().message, Catch::Contains(c.name));
  }
}

// The sampler sorts only the head of the candidate order it walks; a full sort (the
// straightforward algorithm, tests/runtime/sampler_reference.h) must pick the same token
// for the same draw.
TEST_CASE("staged sorting samples what a full sort would", "[sampler]") {
  std::mt19937 g(3);
  int checked = 0, differ = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = 1000 + static_cast<int32_t>(g() % 4000);
    std::normal_distribution<float> d(0, 1.0f + (g() % 40) / 10.0f);
    std::vector<float> logits(static_cast<size_t>(n));
    for (auto& x : logits) x = d(g);
    for (int i = 0; i < 10; ++i) logits[g() % n] += static_cast<float>(g() % 15);
    if (trial % 7 == 0)
      for (int i = 0; i < 50; ++i) logits[g() % n] = 1.5f;  // ties
    SamplingParams p;
    p.temperature = 0.2f + (g() % 30) / 10.0f;
    p.top_p = trial % 3 == 0 ? 1.0f : 0.5f + (g() % 50) / 100.0f;
    p.min_p = trial % 4 == 0 ? (g() % 20) / 100.0f : 0.0f;
    p.top_k = trial % 5 == 0 ? 1 + static_cast<int32_t>(g() % 600) : 0;
    p.seed = g();
    Sampler s(p, n);
    for (int draw = 0; draw < 4; ++draw) {
      const double u01 = philox_uniform(p.seed, static_cast<uint64_t>(draw));  // the sampler's own draw
      const int32_t want = test::full_sort_reference(logits, p, u01);
      const int32_t got = s.sample(logits.data()).token;
      ++checked;
      // Both sum the same terms in a different order or precision, so a draw within
      // rounding of a boundary may land on the neighbour; anything else is a bug.
      if (got != want) ++differ;
    }
  }
  INFO(differ << " of " << checked << " draws differ");
  CHECK(differ <= checked / 200);
}

TEST_CASE("Philox4x32-10 gives Random123's known answers, a draw depends on (seed, counter) only", "[sampler]") {
  // Random123's kat_vectors for philox4x32_10.
  const Philox4 zero = philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  const Philox4 ones =
      philox4x32_10(Philox4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  const Philox4 pi =
      philox4x32_10(Philox4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);

  // Uniform draws: in [0, 1), mean near 1/2, distinct per counter and per seed.
  double sum = 0;
  for (uint64_t c = 0; c < 20000; ++c) {
    const double u = philox_uniform(7, c);
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(std::fabs(sum / 20000 - 0.5) < 0.01);
  CHECK(philox_uniform(7, 1) != philox_uniform(7, 2));
  CHECK(philox_uniform(7, 1) != philox_uniform(8, 1));
  CHECK(philox_uniform(1ull << 32, 1) != philox_uniform(0, 1));  // both seed words count

  // A sampler's n-th draw is philox_uniform(seed, n): skipping draws (made on a device)
  // leaves the next one where sampling them here would have.
  std::vector<float> logits(500);
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0, 2);
  for (auto& x : logits) x = nd(g);
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 99;
  Sampler a(p, 500), b(p, 500);
  for (int i = 0; i < 5; ++i) a.sample(logits.data());
  for (int i = 0; i < 5; ++i) b.skip_draw();
  CHECK(a.draws() == 5);
  CHECK(b.device_params().counter == 5);
  for (int i = 0; i < 20; ++i) CHECK(a.sample(logits.data()).token == b.sample(logits.data()).token);
  CHECK(test::full_sort_reference(logits, p, philox_uniform(99, 25)) == a.sample(logits.data()).token);
}

TEST_CASE("only requests without penalties, bias or top-logprob lists may sample on a device", "[sampler]") {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 3;
  p.report_logprob = true;
  CHECK(Sampler(p, 100).device_eligible());
  const DeviceSampleParams d = Sampler(p, 100).device_params();
  CHECK(d.temperature == 0.7f);
  CHECK(d.top_k == 40);
  CHECK(d.top_p == 0.9f);
  CHECK(d.min_p == 0.05f);
  CHECK(d.seed == 3);
  CHECK(d.counter == 0);
  CHECK(d.want_logprob == 1);
  CHECK(d.on_device == 1);
  // A backend's draw: counted, and refused outside the vocabulary.
  Sampler taker(p, 100);
  auto drawn = taker.device_draw(42, -0.5f);
  REQUIRE(drawn.ok());
  CHECK(drawn->token == 42);
  CHECK(drawn->logprob == -0.5f);
  CHECK(taker.draws() == 1);
  CHECK_FALSE(taker.device_draw(100, 0.0f).ok());
  CHECK_FALSE(taker.device_draw(-1, 0.0f).ok());
  CHECK(taker.draws() == 1);
  auto with = [&](auto change) {
    SamplingParams q = p;
    change(q);
    return Sampler(q, 100).device_eligible();
  };
  CHECK_FALSE(with([](SamplingParams& q) { q.repetition_penalty = 1.1f; }));
  CHECK_FALSE(with([](SamplingParams& q) { q.presence_penalty = 0.5f; }));
  CHECK_FALSE(with([](SamplingParams& q) { q.frequency_penalty = -0.5f; }));
  CHECK_FALSE(with([](SamplingParams& q) { q.logit_bias[5] = 2.0f; }));
  CHECK_FALSE(with([](SamplingParams& q) { q.logprobs = 3; }));
  SamplingParams pen = p;
  pen.repetition_penalty = 1.2f;
  CHECK(Sampler(pen, 100).device_params().on_device == 0);
}
