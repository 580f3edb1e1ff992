// libFuzzer target: the wire codec (actors/codec.cpp: the messages of the node link) on arbitrary bytes. The first
// byte picks the message type (the low nibble, modulo the number of decoders); the rest is
// the message, padded with zeros to whole 8-byte words unless the byte's bit 7 is set (then
// the bytes go as they are, so sizes that are not whole words are tried too).
//
// Every decoder must return an error or a value, never crash, and never decode a message
// into more than a bounded multiple of its size. What a decoder accepts must be a faithful
// round trip: encoding the value and decoding that again must succeed, and encoding the
// second value must give the same bytes as the first encoding.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <variant>

#include "actors/codec.h"

using namespace troupe;

namespace {

// The second decode of our own encoding must succeed and re-encode to the same bytes.
template <typename T, typename Decode, typename Encode>
void round_trip(const T& first, Decode decode, Encode encode) {
  const codec::Bytes b1 = encode(first);
  auto second = decode(b1);
  if (!second.ok()) std::abort();
  if (encode(*second) != b1) std::abort();
}

// The codec's traversal budget is 4 words per word of message plus 1024 (codec.cpp), and
// every decoded element costs at least half a word of it (32-bit values pack two to a
// word; an empty struct is charged a whole word): a hard upper bound on what a message
// decodes into, so a decoder that turned a small message into a huge one is caught.
void bounded(size_t decoded_elements, size_t message_bytes) {
  if (decoded_elements > 2 * (4 * (message_bytes / 8) + 1024)) std::abort();
}

size_t elements(const SamplingParams& s) { return s.logit_bias.size(); }
size_t elements(const actors::StageStep& s) {
  size_t n = s.token_ids.size() + s.positions.size() + s.query_start.size() + s.context_lens.size() +
             s.slot_mapping.size() + s.block_tables.size() + s.logit_rows.size() + s.logit_seq.size() +
             s.new_seqs.size() + s.released.size() + s.hidden.size() + s.sampling.size();
  for (const auto& ns : s.new_seqs) n += ns.prompt.size() + elements(ns.sampling);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  codec::Bytes b(data + 1, data + size);
  if (!(sel & 0x80)) b.resize((b.size() + 7) / 8 * 8, 0);
  const size_t sz = b.size();
  switch ((sel & 0x0f) % 5) {
    case 0:
      if (auto r = codec::decode_stage_step(b); r.ok()) {
        bounded(elements(*r), sz);
        round_trip(*r, codec::decode_stage_step, [](const auto& v) { return codec::encode(v); });
      }
      break;
    case 1:
      if (auto r = codec::decode_step_result(b); r.ok()) {
        if (auto* done = std::get_if<actors::StepDone>(&*r)) {
          size_t n = done->sampled.size();
          for (const auto& s : done->sampled) n += s.result.top.size();
          bounded(n, sz);
        } else if (std::get<actors::StepFailed>(*r).error.empty()) {
          std::abort();  // a failure always says why
        }
        round_trip(*r, codec::decode_step_result,
                   [](const auto& v) { return std::visit([](const auto& x) { return codec::encode(x); }, v); });
      }
      break;
    case 2:  // the node link's hello and its answer (actors/node_link.h)
      if (auto r = codec::decode_node_hello(b); r.ok()) {
        bounded(r->model.size() / 8, sz);
        round_trip(*r, codec::decode_node_hello, [](const auto& v) { return codec::encode(v); });
      }
      if (auto r = codec::decode_node_hello_reply(b); r.ok())
        round_trip(*r, codec::decode_node_hello_reply, [](const auto& v) { return codec::encode(v); });
      break;
    case 4:  // expert parallelism's dispatch and answer (actors/expert_actor.h)
      if (auto r = codec::decode_expert_dispatch(b); r.ok()) {
        bounded(r->experts.size() + r->counts.size() + r->rows.size(), sz);
        round_trip(*r, codec::decode_expert_dispatch, [](const auto& v) { return codec::encode(v); });
      }
      if (auto r = codec::decode_expert_result(b); r.ok()) {
        bounded(r->rows.size() + r->error.size() / 8, sz);
        round_trip(*r, codec::decode_expert_result, [](const auto& v) { return codec::encode(v); });
      }
      break;
    default:  // 3: every decoder on the same bytes (none may crash)
      (void)codec::decode_stage_step(b);
      (void)codec::decode_step_result(b);
      (void)codec::decode_node_hello(b);
      (void)codec::decode_node_hello_reply(b);
      (void)codec::decode_expert_dispatch(b);
      (void)codec::decode_expert_result(b);
      break;
  }
  return 0;
}
