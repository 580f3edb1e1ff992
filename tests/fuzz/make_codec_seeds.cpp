// Writes the committed seed corpus of codec_fuzz (tests/fuzz/corpus/codec/): one valid
// encoding of every message the codec carries (the node link's), each behind the selector
// byte that codec_fuzz.cpp maps to its decoder, plus the hostile list of 100,000 empty
// structs in 56 bytes that the traversal budget must refuse. Deterministic: rerunning rewrites the same
// bytes.
//
//   cmake --build build/fuzz/cmake --target make_codec_seeds && build/fuzz/cmake/bin/make_codec_seeds .
//   (build/fuzz/cmake: the fuzz build that tests/fuzz/run.sh configures)
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

  seed("stage-step.bin", 0, codec::encode(stage_step()));

  actors::StepDone sd;
  sd.step_no = 5;
  sd.compute_seconds = 0.002;
  SampleResult res;
  res.token = 11;
  res.logprob = -0.1f;
  res.top = {{11, -0.1f}};
  sd.sampled = {{100, res}};
  seed("step-done.bin", 1, codec::encode(sd));
  seed("step-failed.bin", 1, codec::encode(actors::StepFailed{6, "worker: out of device memory"}));

  // A StepResult whose sampled list claims 100,000 structs of zero size in no words (56
  // bytes): refused by the traversal budget, which grows with the message's size.
  const uint64_t words[7] = {
      uint64_t{6} << 32,    uint64_t{0x00020002} << 32, 0, 0, (uint64_t{7} << 32) | (1u << 2) | 1u, 0,
      uint64_t{100000} << 2};
  codec::Bytes amp(sizeof(words));
  std::memcpy(amp.data(), words, sizeof(words));
  seed("empty-structs.bin", 1, amp);

  actors::NodeHello hello;
  hello.model = "gguf llama layers 30 hidden 576 heads 9/3 ffn 1536 vocab 49152 bytes 98000000";
  hello.layer_first = 15;
  hello.layer_last = 30;
  hello.kv_blocks = 2048;
  seed("node-hello.bin", 2, codec::encode(hello));
  seed("node-hello-reply.bin", 2,
       codec::encode(actors::NodeHelloReply{"", hello.model, "cpu(avx512-vnni, 2 threads)"}));
  seed("all-decoders.bin", 3, codec::encode(stage_step()));
  // Expert parallelism: a hello naming experts, one layer's dispatch and its answer.
  actors::NodeHello eh;
  eh.model = hello.model;
  eh.experts = {{0, {0, 1, 2, 3}}, {1, {4, 5}}};
  eh.max_expert_rows = 1024;
  seed("node-hello-experts.bin", 2, codec::encode(eh));
  actors::ExpertDispatch d;
  d.id = 17;
  d.layer = 1;
  d.experts = {4, 5};
  d.counts = {2, 1};
  for (int i = 0; i < 3 * 16; ++i) d.rows.push_back(0.125f * static_cast<float>(i % 9) - 0.5f);
  seed("expert-dispatch.bin", 4, codec::encode(d));
  actors::ExpertResult er;
  er.id = 17;
  er.layer = 1;
  er.rows = d.rows;
  er.compute_seconds = 0.002;
  seed("expert-result.bin", 4, codec::encode(er));
  er.rows.clear();
  er.error = "expert dispatch: this worker does not hold expert 7 of layer 1";
  seed("expert-result-error.bin", 4, codec::encode(er));
  std::printf("make_codec_seeds: wrote %s\n", g_dir.c_str());
  return 0;
}
