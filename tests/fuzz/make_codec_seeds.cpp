// Writes the committed seed corpus of codec_fuzz (tests/fuzz/corpus/codec/): one valid
// encoding of every actor message the codec carries, each behind the selector byte that
// codec_fuzz.cpp maps to its decoder, plus the hostile list of 100,000 empty structs in 56
// bytes that the traversal budget must refuse. Deterministic: rerunning rewrites the same
// bytes. Needs the generated schema of a CMake build (build/schema):
//
//   g++ -std=c++20 -O1 -I. -Ibuild/schema tests/fuzz/make_codec_seeds.cpp actors/codec.cpp \
//       build/schema/troupe.capnp.c++ -lcapnp -lkj -o /tmp/make_codec_seeds && /tmp/make_codec_seeds .
//
// Inputs that once crashed the target are kept under names starting with "regress-"; this
// program does not touch them.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "actors/codec.h"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

fs::path g_dir;

void seed(const std::string& name, uint8_t selector, const codec::Bytes& msg) {
  fs::create_directories(g_dir);
  std::ofstream f(g_dir / name, std::ios::binary | std::ios::trunc);
  f.put(static_cast<char>(selector));
  f.write(reinterpret_cast<const char*>(msg.data()), static_cast<std::streamsize>(msg.size()));
  if (!f) {
    std::fprintf(stderr, "make_codec_seeds: cannot write %s\n", (g_dir / name).c_str());
    std::exit(1);
  }
}

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
  sp.logit_bias = {{5, -100.0f}, {77, 2.5f}};
  return sp;
}

actors::StageStep stage_step() {
  actors::StageStep s;
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
  for (int i = 0; i < 4 * 8; ++i) s.hidden.push_back(0.25f * static_cast<float>(i - 16));
  s.compute_seconds = 0.125;
  DeviceSampleParams d;
  d.temperature = 0.7f;
  d.top_k = 40;
  d.seed = 42;
  d.counter = 7;
  d.want_logprob = 1;
  d.on_device = 1;
  s.sampling = {d, DeviceSampleParams{}};
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s REPO_ROOT\n", argv[0]);
    return 2;
  }
  g_dir = fs::path(argv[1]) / "tests/fuzz/corpus/codec";

  SchedRequest r;
  r.id = 9;
  r.prompt = {1, 2, 3, 49151};
  r.max_new_tokens = 128;
  r.priority = -2;
  seed("submit.bin", 0, codec::encode_submit(r, sampling()));

  StepPlan p;
  p.seqs = {{1, 0, 5, true}, {2, 17, 1, false}};
  p.preempted = {4};
  p.copies = {{3, 8}};
  p.num_tokens = 6;
  seed("step-plan.bin", 1, codec::encode_step_plan(p, 12));
  seed("cancel.bin", 2, codec::encode_cancel(-5));

  actors::SubmitSeq s;
  s.seq_id = 100;
  s.prompt = {5, 6, 7};
  s.max_new_tokens = 16;
  s.sampling = sampling();
  s.stop_token_ids = {2, 0};
  s.ignore_eos = true;
  seed("submit-seq.bin", 3, codec::encode(s));
  seed("cancel-seqs.bin", 4, codec::encode(actors::CancelSeqs{{1, 2, 3}}));

  actors::SeqEvent e;
  e.seq_id = 100;
  e.token = 42;
  e.logprob = -0.5f;
  e.top = {{42, -0.5f}, {7, -1.25f}};
  e.finished = true;
  e.hit_stop = true;
  e.queue_seconds = 0.01;
  seed("seq-event.bin", 5, codec::encode(e));
  e.error = "prompt is longer than the context";
  seed("seq-event-error.bin", 5, codec::encode(e));

  seed("stage-step.bin", 6, codec::encode(stage_step()));
  actors::LayersDone done;
  done.step = stage_step();
  done.logits = {0.5f, -1.0f, 2.0f};
  done.compute_seconds = 0.5;
  done.device_tokens = {4, -1};
  done.device_logprobs = {-0.25f, 0.0f};
  seed("layers-done.bin", 7, codec::encode(done));

  actors::StepDone sd;
  sd.step_no = 5;
  sd.compute_seconds = 0.002;
  SampleResult res;
  res.token = 11;
  res.logprob = -0.1f;
  res.top = {{11, -0.1f}};
  sd.sampled = {{100, res}};
  seed("step-done.bin", 8, codec::encode(sd));
  seed("step-failed.bin", 8, codec::encode(actors::StepFailed{6, "worker: out of device memory"}));

  actors::EngineStats st;
  st.num_running = 3;
  st.num_waiting = 1;
  st.kv_blocks = 2048;
  st.kv_free = 100;
  st.steps = 77;
  st.failure = "";
  seed("engine-stats.bin", 9, codec::encode(st));

  KvOpsRequest q;
  q.batch = 41;
  KvOp admit;
  admit.kind = KvOp::Kind::Admit;
  admit.seq = 3;
  admit.cached = 32;
  admit.num_tokens = 17;
  admit.allowance = 7;
  admit.whole = true;
  admit.tokens = {5, 6, 7};
  KvOp release;
  release.kind = KvOp::Kind::Free;
  release.seq = 8;
  q.ops = {admit, release};
  q.probes = {{12, {3, 4, 5}}};
  q.tables = {3};
  seed("kv-ops-request.bin", 10, codec::encode(q));

  KvOpsReply k;
  k.batch = 41;
  k.results = {{true, 32, 9}, {false, 0, 0}};
  k.copies = {{4, 9}};
  k.tables = {{3, {7, 2, 11}}};
  k.snapshot.num_free = 17;
  k.snapshot.seqs = {{3, 3, 1}};
  k.snapshot.hints = {{12, 2, 1}};
  k.snapshot.stats = {64, 17, 5, 300, 120};
  seed("kv-ops-reply.bin", 11, codec::encode(k));

  // A KvOpsRequest whose ops list claims 100,000 structs of zero size in no words (56
  // bytes): refused by the traversal budget, which grows with the message's size.
  const uint64_t words[7] = {uint64_t{6} << 32, uint64_t{0x00030001} << 32, 0, (uint64_t{7} << 32) | (2u << 2) | 1u,
                             0, 0, uint64_t{100000} << 2};
  codec::Bytes amp(sizeof(words));
  std::memcpy(amp.data(), words, sizeof(words));
  seed("empty-structs.bin", 10, amp);
  actors::NodeHello hello;
  hello.model = "gguf llama layers 30 hidden 576 heads 9/3 ffn 1536 vocab 49152 bytes 98000000";
  hello.layer_first = 15;
  hello.layer_last = 30;
  hello.kv_blocks = 2048;
  seed("node-hello.bin", 12, codec::encode(hello));
  seed("node-hello-reply.bin", 12, codec::encode(actors::NodeHelloReply{"", hello.model, "cpu(avx512-vnni, 2 threads)"}));
  seed("all-decoders.bin", 13, codec::encode(stage_step()));
  std::printf("make_codec_seeds: wrote %s\n", g_dir.c_str());
  return 0;
}
