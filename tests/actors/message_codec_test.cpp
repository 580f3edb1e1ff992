// Every message that crosses a process (the node link's) round-trips through its Cap'n
// Proto form (schema/troupe.capnp), and truncated or random bytes decode to errors, never crashes.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "actors/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "troupe.capnp.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

SamplingParams sampling() {
  SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.05f;
  sp.repetition_penalty = 1.1f;
  sp.presence_penalty = -0.5f;
  sp.frequency_penalty = 0.25f;
  sp.seed = 0xfedcba9876543210ull;
  sp.logprobs = 3;
  sp.report_logprob = false;               // not the default: the round trip must carry it
  sp.json_object = true;                   // nor is this
  sp.grammar = "root ::= \"a\" [0-9]+\n";  // (both at once never passes validate(); the codec carries both)
  sp.logit_bias = {{5, -100.0f}, {77, 2.5f}};
  return sp;
}

bool same(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
         a.repetition_penalty == b.repetition_penalty && a.presence_penalty == b.presence_penalty &&
         a.frequency_penalty == b.frequency_penalty && a.seed == b.seed && a.logprobs == b.logprobs &&
         a.report_logprob == b.report_logprob && a.logit_bias == b.logit_bias && a.json_object == b.json_object &&
         a.grammar == b.grammar;
}

bool same(const std::vector<TokenLogprob>& a, const std::vector<TokenLogprob>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].token != b[i].token || a[i].logprob != b[i].logprob) return false;
  return true;
}

template <typename Decode>
void truncations_fail(const codec::Bytes& good, Decode decode) {
  for (size_t n = 0; n < good.size(); n += 8) {
    codec::Bytes cut(good.begin(), good.begin() + static_cast<long>(n));
    REQUIRE_FALSE(decode(cut).ok());
  }
}

}  // namespace

TEST_CASE("codec: StageStep with activations round-trips", "[codec]") {
  StageStep s;
  s.step_no = 77;
  s.token_ids = {5, 6, 7, 8};
  s.positions = {0, 1, 2, 9};
  s.query_start = {0, 3, 4};
  s.context_lens = {3, 10};
  s.slot_mapping = {16, 17, 18, 41};
  s.block_tables = {1, 0, 2, 3};
  s.logit_rows = {2, 3};
  s.logit_seq = {100, 101};
  s.max_blocks_per_seq = 2;
  s.new_seqs = {{100, sampling(), {5, 6, 7}}};
  s.released = {3, 4};
  s.hidden.resize(4 * 64);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& h : s.hidden) h = nd(rng);
  s.compute_seconds = 0.125;
  DeviceSampleParams ds;
  ds.temperature = 0.7f;
  ds.top_k = 40;
  ds.top_p = 0.9f;
  ds.min_p = 0.05f;
  ds.seed = 0xFEDCBA9876543210ull;
  ds.counter = 12345678901ull;
  ds.want_logprob = 1;
  ds.on_device = 1;
  s.sampling = {ds, DeviceSampleParams{}};
  auto d = codec::decode_stage_step(codec::encode(s));
  REQUIRE(d.ok());
  REQUIRE(d->step_no == 77);
  REQUIRE(d->compute_seconds == 0.125);
  REQUIRE(d->token_ids == s.token_ids);
  REQUIRE(d->positions == s.positions);
  REQUIRE(d->query_start == s.query_start);
  REQUIRE(d->context_lens == s.context_lens);
  REQUIRE(d->slot_mapping == s.slot_mapping);
  REQUIRE(d->block_tables == s.block_tables);
  REQUIRE(d->logit_rows == s.logit_rows);
  REQUIRE(d->logit_seq == s.logit_seq);
  REQUIRE(d->max_blocks_per_seq == 2);
  REQUIRE(d->new_seqs.size() == 1);
  REQUIRE(d->new_seqs[0].seq_id == 100);
  REQUIRE(same(d->new_seqs[0].sampling, s.new_seqs[0].sampling));
  REQUIRE(d->new_seqs[0].prompt == s.new_seqs[0].prompt);
  REQUIRE(d->released == s.released);
  REQUIRE(d->hidden == s.hidden);  // bit-exact activations
  REQUIRE(d->sampling.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto &a = d->sampling[i], &b = s.sampling[i];
    REQUIRE(a.temperature == b.temperature);
    REQUIRE(a.top_k == b.top_k);
    REQUIRE(a.top_p == b.top_p);
    REQUIRE(a.min_p == b.min_p);
    REQUIRE(a.seed == b.seed);
    REQUIRE(a.counter == b.counter);
    REQUIRE(a.want_logprob == b.want_logprob);
    REQUIRE(a.on_device == b.on_device);
  }
  truncations_fail(codec::encode(s), codec::decode_stage_step);
}

TEST_CASE("codec: StepDone and StepFailed round-trip", "[codec]") {
  StepDone done;
  done.step_no = 5;
  done.compute_seconds = 0.5;
  SampleResult r;
  r.token = 11;
  r.logprob = -1.5f;
  r.top = {{11, -1.5f}, {12, -2.0f}};
  done.sampled = {{7, r}, {8, SampleResult{3, -0.25f, {}}}};
  auto d = codec::decode_step_result(codec::encode(done));
  REQUIRE(d.ok());
  REQUIRE(std::holds_alternative<StepDone>(*d));
  const auto& dd = std::get<StepDone>(*d);
  REQUIRE(dd.step_no == 5);
  REQUIRE(dd.compute_seconds == 0.5);
  REQUIRE(dd.sampled.size() == 2);
  REQUIRE(dd.sampled[0].seq_id == 7);
  REQUIRE(dd.sampled[0].result.token == 11);
  REQUIRE(same(dd.sampled[0].result.top, r.top));
  REQUIRE(dd.sampled[1].result.token == 3);
  auto f = codec::decode_step_result(codec::encode(StepFailed{6, "KV slot out of range"}));
  REQUIRE(f.ok());
  REQUIRE(std::holds_alternative<StepFailed>(*f));
  REQUIRE(std::get<StepFailed>(*f).error == "KV slot out of range");
  REQUIRE(std::get<StepFailed>(*f).step_no == 6);
}

TEST_CASE("codec: random bytes never crash an actor-message decoder", "[codec][badinput]") {
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) {
    codec::Bytes junk(8 * (1 + rng() % 40));
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    (void)codec::decode_stage_step(junk);
    (void)codec::decode_step_result(junk);
    (void)codec::decode_node_hello(junk);
    (void)codec::decode_node_hello_reply(junk);
  }
}

TEST_CASE("codec: the node link's hello and its answer round-trip", "[codec]") {
  actors::NodeHello h;
  h.version = 7;
  h.model = "gguf llama layers 30 hidden 576";
  h.layer_first = 10;
  h.layer_last = 30;
  h.is_last = true;
  h.kv_blocks = 1 << 20;
  h.block_size = 32;
  h.max_batch_tokens = 2048;
  auto d = codec::decode_node_hello(codec::encode(h));
  REQUIRE(d.ok());
  REQUIRE(d->version == 7);
  REQUIRE(d->model == h.model);
  REQUIRE(d->layer_first == 10);
  REQUIRE(d->layer_last == 30);
  REQUIRE(d->is_last);
  REQUIRE(d->kv_blocks == (1 << 20));
  REQUIRE(d->block_size == 32);
  REQUIRE(d->max_batch_tokens == 2048);
  actors::NodeHelloReply r{"busy", std::string("m\0x", 3), "cpu(avx2, 2 threads)"};
  auto dr = codec::decode_node_hello_reply(codec::encode(r));
  REQUIRE(dr.ok());
  REQUIRE(dr->error == "busy");
  REQUIRE(dr->model == r.model);
  REQUIRE(dr->device == r.device);
}

namespace {

// A StepResult whose sampled list holds `count` elements of zero size: Cap'n Proto stores
// them in no words at all (an INLINE_COMPOSITE list of 0 words whose tag says `count`), so
// the message is 56 bytes whatever the count.
codec::Bytes empty_struct_list(uint32_t count) {
  const uint64_t words[7] = {
      uint64_t{6} << 32,           // segment table: one segment of 6 words
      uint64_t{0x00020002} << 32,  // root: struct at +0, 2 data words, 2 pointers
      0,
      0,                                     // stepId, computeSeconds
      (uint64_t{7} << 32) | (1u << 2) | 1u,  // sampled: list at +1, INLINE_COMPOSITE, 0 words
      0,                                     // error: null
      uint64_t{count} << 2,                  // the list's tag: `count` structs of 0 + 0 words
  };
  codec::Bytes b(sizeof(words));
  std::memcpy(b.data(), words, sizeof(words));
  return b;
}

}  // namespace

TEST_CASE("codec: a small message cannot decode into a huge one (lists of empty structs)", "[codec][badinput]") {
  // A few such elements are a valid message: each decodes to a default sampled token.
  auto few = codec::decode_step_result(empty_struct_list(3));
  REQUIRE(few.ok());
  REQUIRE(std::holds_alternative<StepDone>(*few));
  REQUIRE(std::get<StepDone>(*few).sampled.size() == 3);
  // Millions of them from 56 bytes would be hundreds of MB of decoded tokens: the traversal
  // budget grows with the message's size, so the decoder refuses.
  for (uint32_t count : {100000u, 8000000u, (1u << 29) - 1}) {
    auto many = codec::decode_step_result(empty_struct_list(count));
    INFO("count " << count);
    REQUIRE_FALSE(many.ok());
    REQUIRE(many.error().message.find("malformed message") != std::string::npos);
  }
}

TEST_CASE("codec: the same sampling parameters always encode to the same bytes", "[codec]") {
  // The logit-bias map iterates in an order that depends on how it was filled; the wire
  // form is in token order.
  StageStep a, b;
  a.step_no = b.step_no = 1;
  NewSeqSampling na{7, {}, {1, 2}}, nb{7, {}, {1, 2}};
  for (int32_t t : {5, 77, 1000, 3, 49151, 64}) na.sampling.logit_bias[t] = static_cast<float>(t) / 8;
  for (int32_t t : {64, 49151, 3, 1000, 77, 5}) nb.sampling.logit_bias[t] = static_cast<float>(t) / 8;
  nb.sampling.logit_bias.rehash(1024);
  a.new_seqs = {na};
  b.new_seqs = {nb};
  REQUIRE(codec::encode(a) == codec::encode(b));
  auto d = codec::decode_stage_step(codec::encode(a));
  REQUIRE(d.ok());
  REQUIRE(d->new_seqs.size() == 1);
  REQUIRE(d->new_seqs[0].sampling.logit_bias == na.sampling.logit_bias);
  REQUIRE(codec::encode(*d) == codec::encode(a));
}

TEST_CASE("codec: texts with embedded NUL bytes keep every byte", "[codec][badinput]") {
  // (codec_fuzz found a StepFailed whose error began with NUL decoding to an empty error:
  // through a C string, a failure can turn into no failure)
  const std::string nul_first("\0worker", 7), nul_inside("out of\0memory", 13);
  StepFailed f{6, nul_first};
  auto r = codec::decode_step_result(codec::encode(f));
  REQUIRE(r.ok());
  REQUIRE(std::holds_alternative<StepFailed>(*r));
  REQUIRE(std::get<StepFailed>(*r).error == nul_first);
  actors::NodeHelloReply h{nul_inside, std::string("m\0", 2), "cpu"};
  auto d = codec::decode_node_hello_reply(codec::encode(h));
  REQUIRE(d.ok());
  REQUIRE(d->error == nul_inside);
  REQUIRE(d->model == h.model);
}
