// Every schema message type round-trips through the codec, and hostile bytes (empty,
// unaligned, truncated, random, huge pointers) come back as errors, never crashes.
#include <catch2/catch.hpp>
#include <limits>
#include <random>

#include "actors/codec.h"

using namespace troupe;

TEST_CASE("SubmitRequest round-trips", "[codec]") {
  SchedRequest r{42, {1, 2, 3, 49151}, 17, -3};
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.05f;
  sp.repetition_penalty = 1.1f;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = -0.25f;
  sp.seed = 0xfedcba9876543210ull;
  sp.logprobs = 5;
  sp.logit_bias = {{7, 2.5f}, {9, -100.0f}};
  auto d = codec::decode_submit(codec::encode_submit(r, sp));
  REQUIRE(d.ok());
  const auto& [r2, s2] = *d;
  REQUIRE(r2.id == 42);
  REQUIRE(r2.prompt == r.prompt);
  REQUIRE(r2.max_new_tokens == 17);
  REQUIRE(r2.priority == -3);
  REQUIRE(s2.temperature == 0.7f);
  REQUIRE(s2.top_k == 40);
  REQUIRE(s2.top_p == 0.9f);
  REQUIRE(s2.min_p == 0.05f);
  REQUIRE(s2.repetition_penalty == 1.1f);
  REQUIRE(s2.presence_penalty == 0.5f);
  REQUIRE(s2.frequency_penalty == -0.25f);
  REQUIRE(s2.seed == sp.seed);
  REQUIRE(s2.logprobs == 5);
  REQUIRE(s2.logit_bias == sp.logit_bias);
}

TEST_CASE("StepPlan and Cancel round-trip", "[codec]") {
  StepPlan p;
  p.seqs = {{1, 0, 5, true}, {2, 3, 3, false}};
  p.preempted = {9};
  p.copies = {{4, 7}};
  auto d = codec::decode_step_plan(codec::encode_step_plan(p, 123));
  REQUIRE(d.ok());
  REQUIRE(d->second == 123);
  REQUIRE(d->first.seqs.size() == 2);
  REQUIRE(d->first.seqs[1].id == 2);
  REQUIRE(d->first.seqs[1].num_computed == 3);
  REQUIRE(d->first.seqs[1].num_new == 3);
  REQUIRE_FALSE(d->first.seqs[1].samples);
  REQUIRE(d->first.num_tokens == 8);
  REQUIRE(d->first.preempted == std::vector<int64_t>{9});
  REQUIRE(d->first.copies.at(0).dst == 7);
  auto c = codec::decode_cancel(codec::encode_cancel(-5));
  REQUIRE(c.ok());
  REQUIRE(*c == -5);
}

TEST_CASE("a StepPlan whose token counts add up past int32 is an error", "[codec][badinput]") {
  // (codec_fuzz found the sum overflowing: undefined behaviour, then a negative total)
  const int32_t big = std::numeric_limits<int32_t>::max() - 10;
  StepPlan p;
  p.seqs = {{1, 0, big, true}, {2, 0, 5, true}};
  auto ok = codec::decode_step_plan(codec::encode_step_plan(p, 1));
  REQUIRE(ok.ok());
  REQUIRE(ok->first.num_tokens == big + 5);
  p.seqs.push_back({3, 0, 6, true});
  auto over = codec::decode_step_plan(codec::encode_step_plan(p, 1));
  REQUIRE_FALSE(over.ok());
  REQUIRE(over.error().message.find("add up to more than") != std::string::npos);
}

TEST_CASE("hostile bytes are errors, not crashes", "[codec][badinput]") {
  REQUIRE_FALSE(codec::decode_cancel({}).ok());
  REQUIRE_FALSE(codec::decode_cancel({1, 2, 3}).ok());
  auto good = codec::encode_step_plan(StepPlan{{{1, 0, 5, true}}, {}, {}, 5}, 1);
  for (size_t n = 8; n < good.size(); n += 8) {
    codec::Bytes cut(good.begin(), good.begin() + static_cast<long>(n));
    REQUIRE_FALSE(codec::decode_step_plan(cut).ok());
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    codec::Bytes junk(8 * (1 + rng() % 32));
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    (void)codec::decode_step_plan(junk);  // must not crash; either result is fine
    (void)codec::decode_submit(junk);
  }
  // A segment table claiming a huge segment.
  codec::Bytes huge = {0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f};
  REQUIRE_FALSE(codec::decode_submit(huge).ok());
}
