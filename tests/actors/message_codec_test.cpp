// Every actor message round-trips through its Cap'n Proto form (schema/troupe.capnp), and
// truncated or random bytes decode to errors, never crashes.
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
  sp.report_logprob = false;  // not the default: the round trip must carry it
  sp.json_object = true;      // nor is this
  sp.logit_bias = {{5, -100.0f}, {77, 2.5f}};
  return sp;
}

bool same(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p &&
         a.repetition_penalty == b.repetition_penalty && a.presence_penalty == b.presence_penalty &&
         a.frequency_penalty == b.frequency_penalty && a.seed == b.seed && a.logprobs == b.logprobs &&
         a.report_logprob == b.report_logprob && a.logit_bias == b.logit_bias && a.json_object == b.json_object;
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

TEST_CASE("codec: SubmitSeq and CancelSeqs round-trip", "[codec]") {
  SubmitSeq s{42, {1, 2, 3, 49151}, 128, -3, sampling(), {2, 7}, true};
  auto d = codec::decode_submit_seq(codec::encode(s));
  REQUIRE(d.ok());
  REQUIRE(d->seq_id == 42);
  REQUIRE(d->prompt == s.prompt);
  REQUIRE(d->max_new_tokens == 128);
  REQUIRE(d->priority == -3);
  REQUIRE(same(d->sampling, s.sampling));
  REQUIRE(d->stop_token_ids == s.stop_token_ids);
  REQUIRE(d->ignore_eos);
  auto c = codec::decode_cancel_seqs(codec::encode(CancelSeqs{{5, -1, 1ll << 40}}));
  REQUIRE(c.ok());
  REQUIRE(c->seq_ids == std::vector<int64_t>{5, -1, 1ll << 40});
  truncations_fail(codec::encode(s), codec::decode_submit_seq);
}

TEST_CASE("codec: SeqEvent round-trips", "[codec]") {
  SeqEvent e;
  e.seq_id = 9;
  e.token = 1234;
  e.logprob = -0.125f;
  e.top = {{1234, -0.125f}, {5, -2.5f}};
  e.finished = true;
  e.hit_stop = true;
  e.queue_seconds = 0.375;
  e.error = "bad \xE2\x9C\x93";
  auto d = codec::decode_seq_event(codec::encode(e));
  REQUIRE(d.ok());
  REQUIRE(d->seq_id == 9);
  REQUIRE(d->token == 1234);
  REQUIRE(d->logprob == -0.125f);
  REQUIRE(same(d->top, e.top));
  REQUIRE(d->finished);
  REQUIRE(d->hit_stop);
  REQUIRE(d->queue_seconds == 0.375);
  REQUIRE(d->error == e.error);
  truncations_fail(codec::encode(e), codec::decode_seq_event);
}

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

  // The worker's answer carries the step back, plus logits or an error.
  LayersDone done;
  done.step = s;
  done.logits = {0.5f, -1.25f, 3.0f, 1e-7f};
  done.compute_seconds = 0.0125;
  done.device_tokens = {17, -1};
  done.device_logprobs = {-0.25f, 0.0f};
  auto dd = codec::decode_layers_done(codec::encode(done));
  REQUIRE(dd.ok());
  REQUIRE(dd->step.step_no == 77);
  REQUIRE(dd->step.hidden == s.hidden);
  REQUIRE(dd->step.new_seqs.size() == 1);
  REQUIRE(dd->step.logit_seq == s.logit_seq);
  REQUIRE(dd->logits == done.logits);
  REQUIRE(dd->compute_seconds == 0.0125);
  REQUIRE(dd->device_tokens == done.device_tokens);
  REQUIRE(dd->device_logprobs == done.device_logprobs);
  REQUIRE(dd->error.empty());
  done.error = "step block tables have the wrong size";
  auto de = codec::decode_layers_done(codec::encode(done));
  REQUIRE(de.ok());
  REQUIRE(de->error == done.error);
  truncations_fail(codec::encode(done), codec::decode_layers_done);
}

TEST_CASE("codec: StepDone, StepFailed and EngineStats round-trip", "[codec]") {
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
  EngineStats s{3, 4, 100, 55, 1000, 600, 12345, 678, 9000, 2, 77, 3, 0.25, "boom", 12.5, 11.25, 0.75, 4.5,
                19, 0.0125, 0.0015, 0.0025, 1.5e-8};
  auto e = codec::decode_engine_stats(codec::encode(s));
  REQUIRE(e.ok());
  REQUIRE(e->num_running == 3);
  REQUIRE(e->num_waiting == 4);
  REQUIRE(e->kv_blocks == 100);
  REQUIRE(e->kv_free == 55);
  REQUIRE(e->prefix_queries == 1000);
  REQUIRE(e->prefix_hits == 600);
  REQUIRE(e->prompt_tokens == 12345);
  REQUIRE(e->generation_tokens == 678);
  REQUIRE(e->computed_prompt_tokens == 9000);
  REQUIRE(e->preemptions == 2);
  REQUIRE(e->steps == 77);
  REQUIRE(e->most_plans_in_flight == 3);
  REQUIRE(e->heartbeat_age_seconds == 0.25);
  REQUIRE(e->step_seconds == 12.5);
  REQUIRE(e->compute_seconds == 11.25);
  REQUIRE(e->kv_seconds == 0.75);
  REQUIRE(e->oldest_step_seconds == 4.5);
  REQUIRE(e->capped_steps == 19);
  REQUIRE(e->step_fixed_seconds == 0.0125);
  REQUIRE(e->step_token_seconds == 0.0015);
  REQUIRE(e->step_row_seconds == 0.0025);
  REQUIRE(e->step_pair_seconds == 1.5e-8);
  REQUIRE(e->failure == "boom");
}

TEST_CASE("codec: the KV-block-manager messages (block operations, reply and snapshot) round-trip", "[codec]") {
  KvOpsRequest q;
  q.batch = 41;
  KvOp admit;
  admit.kind = KvOp::Kind::Admit;
  admit.seq = -3;
  admit.cached = 32;
  admit.num_tokens = 17;
  admit.allowance = 7;
  admit.whole = true;
  admit.tokens = {5, 6, 7, 1 << 20};
  KvOp reserve;
  reserve.kind = KvOp::Kind::Reserve;
  reserve.seq = 1LL << 40;
  reserve.num_tokens = 99;
  reserve.tokens = {1};
  KvOp release;
  release.kind = KvOp::Kind::Free;
  release.seq = 8;
  q.ops = {admit, reserve, release};
  q.probes = {{12, {3, 4, 5}}, {13, {}}};
  q.tables = {-3, 1LL << 40};
  REQUIRE_FALSE(codec::decode_kv_ops_request(codec::encode(q))->drop_cached);
  q.drop_cached = true;
  auto d = codec::decode_kv_ops_request(codec::encode(q));
  REQUIRE(d.ok());
  REQUIRE(d->drop_cached);
  REQUIRE(d->batch == 41);
  REQUIRE(d->ops.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(d->ops[i].kind == q.ops[i].kind);
    REQUIRE(d->ops[i].seq == q.ops[i].seq);
    REQUIRE(d->ops[i].cached == q.ops[i].cached);
    REQUIRE(d->ops[i].num_tokens == q.ops[i].num_tokens);
    REQUIRE(d->ops[i].allowance == q.ops[i].allowance);
    REQUIRE(d->ops[i].whole == q.ops[i].whole);
    REQUIRE(d->ops[i].tokens == q.ops[i].tokens);
  }
  REQUIRE(d->probes.size() == 2);
  REQUIRE(d->probes[0].seq == 12);
  REQUIRE(d->probes[0].tokens == std::vector<int32_t>{3, 4, 5});
  REQUIRE(d->probes[1].tokens.empty());
  REQUIRE(d->tables == q.tables);

  KvOpsReply r;
  r.batch = 41;
  r.results = {{true, 32, 9}, {false, 0, 0}, {true, 0, 0}};
  r.copies = {{4, 9}};
  r.tables = {{-3, {7, 2, 11}}, {1LL << 40, {}}};
  r.snapshot.num_free = 17;
  r.snapshot.seqs = {{-3, 3, 1}, {5, 10, 10}};
  r.snapshot.hints = {{12, 2, 1}};
  r.snapshot.stats = {64, 17, 5, 300, 120};
  auto e = codec::decode_kv_ops_reply(codec::encode(r));
  REQUIRE(e.ok());
  REQUIRE(e->batch == 41);
  REQUIRE(e->results.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(e->results[i].ok == r.results[i].ok);
    REQUIRE(e->results[i].cached == r.results[i].cached);
    REQUIRE(e->results[i].num_new == r.results[i].num_new);
  }
  REQUIRE(e->copies.size() == 1);
  REQUIRE(e->copies[0].src == 4);
  REQUIRE(e->copies[0].dst == 9);
  REQUIRE(e->tables.size() == 2);
  REQUIRE(e->tables[0].seq == -3);
  REQUIRE(e->tables[0].blocks == std::vector<int32_t>{7, 2, 11});
  REQUIRE(e->tables[1].blocks.empty());
  REQUIRE(e->snapshot.num_free == 17);
  REQUIRE(e->snapshot.seqs.size() == 2);
  REQUIRE(e->snapshot.seqs[1].seq == 5);
  REQUIRE(e->snapshot.seqs[0].held == 3);
  REQUIRE(e->snapshot.seqs[0].exclusive == 1);
  REQUIRE(e->snapshot.hints.size() == 1);
  REQUIRE(e->snapshot.hints[0].seq == 12);
  REQUIRE(e->snapshot.hints[0].cached_blocks == 2);
  REQUIRE(e->snapshot.hints[0].free_listed == 1);
  REQUIRE(e->snapshot.stats.num_blocks == 64);
  REQUIRE(e->snapshot.stats.num_free == 17);
  REQUIRE(e->snapshot.stats.num_cached_free == 5);
  REQUIRE(e->snapshot.stats.prefix_queries == 300);
  REQUIRE(e->snapshot.stats.prefix_hits == 120);

  // An operation kind the schema does not know is refused, not cast.
  capnp::MallocMessageBuilder m;
  auto bad = m.initRoot<schema::KvOpsRequest>();
  bad.initOps(1)[0].setKind(static_cast<schema::KvOp::Kind>(9));
  auto words = capnp::messageToFlatArray(m);
  codec::Bytes bytes(words.asBytes().begin(), words.asBytes().end());
  auto refused = codec::decode_kv_ops_request(bytes);
  REQUIRE(!refused.ok());
  REQUIRE(refused.error().message.find("unknown block operation") != std::string::npos);
}

TEST_CASE("codec: random bytes never crash an actor-message decoder", "[codec][badinput]") {
  std::mt19937 rng(5);
  for (int i = 0; i < 3000; ++i) {
    codec::Bytes junk(8 * (1 + rng() % 40));
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    (void)codec::decode_stage_step(junk);
    (void)codec::decode_seq_event(junk);
    (void)codec::decode_step_result(junk);
    (void)codec::decode_engine_stats(junk);
    (void)codec::decode_submit_seq(junk);
    (void)codec::decode_cancel_seqs(junk);
    (void)codec::decode_kv_ops_request(junk);
    (void)codec::decode_kv_ops_reply(junk);
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

// A KvOpsRequest whose ops list holds `count` elements of zero size: Cap'n Proto stores
// them in no words at all (an INLINE_COMPOSITE list of 0 words whose tag says `count`), so
// the message is 56 bytes whatever the count.
codec::Bytes empty_struct_list(uint32_t count) {
  const uint64_t words[7] = {
      uint64_t{6} << 32,                 // segment table: one segment of 6 words
      uint64_t{0x00030001} << 32,        // root: struct at +0, 1 data word, 3 pointers
      0,                                 // batch
      (uint64_t{7} << 32) | (2u << 2) | 1u,  // ops: list at +2, INLINE_COMPOSITE, 0 words
      0, 0,                              // probes, tables: null
      uint64_t{count} << 2,              // the list's tag: `count` structs of 0 + 0 words
  };
  codec::Bytes b(sizeof(words));
  std::memcpy(b.data(), words, sizeof(words));
  return b;
}

}  // namespace

TEST_CASE("codec: a small message cannot decode into a huge one (lists of empty structs)", "[codec][badinput]") {
  // A few such elements are a valid message: each decodes to a default operation.
  auto few = codec::decode_kv_ops_request(empty_struct_list(3));
  REQUIRE(few.ok());
  REQUIRE(few->ops.size() == 3);
  REQUIRE(few->ops[0].kind == KvOp::Kind::Admit);
  // Millions of them from 56 bytes would be hundreds of MB of decoded operations: the
  // traversal budget grows with the message's size, so the decoder refuses.
  for (uint32_t count : {100000u, 8000000u, (1u << 29) - 1}) {
    auto many = codec::decode_kv_ops_request(empty_struct_list(count));
    INFO("count " << count);
    REQUIRE_FALSE(many.ok());
    REQUIRE(many.error().message.find("KvOpsRequest: malformed message") != std::string::npos);
  }
}

TEST_CASE("codec: the same sampling parameters always encode to the same bytes", "[codec]") {
  // The logit-bias map iterates in an order that depends on how it was filled; the wire
  // form is in token order.
  SubmitSeq a, b;
  a.seq_id = b.seq_id = 1;
  for (int32_t t : {5, 77, 1000, 3, 49151, 64}) a.sampling.logit_bias[t] = static_cast<float>(t) / 8;
  for (int32_t t : {64, 49151, 3, 1000, 77, 5}) b.sampling.logit_bias[t] = static_cast<float>(t) / 8;
  b.sampling.logit_bias.rehash(1024);
  REQUIRE(codec::encode(a) == codec::encode(b));
  auto d = codec::decode_submit_seq(codec::encode(a));
  REQUIRE(d.ok());
  REQUIRE(d->sampling.logit_bias == a.sampling.logit_bias);
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
  SeqEvent e;
  e.seq_id = 3;
  e.error = nul_inside;
  auto d = codec::decode_seq_event(codec::encode(e));
  REQUIRE(d.ok());
  REQUIRE(d->error == nul_inside);
  EngineStats st;
  st.failure = nul_first;
  auto s = codec::decode_engine_stats(codec::encode(st));
  REQUIRE(s.ok());
  REQUIRE(s->failure == nul_first);
}
