// The host-run CUDA backend (tests/hostrun/README.md): the CUDA backend's own host code and
// its kernels' source, over the fake runtime, on the CPU. These checks are the ones a GPU
// run would make of the backend's logic (not of its speed, nor of the device's memory
// model): the fake device catches what a GPU would refuse, every dummy weight type gives
// the CPU backend's greedy tokens, the fused epilogues, the norms' quantization and graph
// replay change no bit, and a layer takes the launches docs/gpu.md says.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/gpu/bench_util.h"
#include "bench/gpu/gemv_alone.h"
#include "kernels/backend.h"
#include "kernels/cuda/prepared.h"
#include "kernels/cuda/step_graph.h"
#include "kernels/cuda/step_pack.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/sequence_runner.h"
#include "runtime/spec/draft_source.h"
#include "tests/hostrun/runtime.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/runtime/greedy_util.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

std::unique_ptr<Backend> hostrun_backend(const CudaBackendOptions& o = {}) {
  auto b = make_cuda_backend(o);
  if (!b) FAIL(b.error().message);
  return std::move(*b);
}

// configs/tiny-llama.json (2 layers, 256 positions) or a copy with `layers` layers and
// `positions` positions, random weights of dtype.
Result<ModelFiles> tiny(const std::string& dtype, int layers = 2, uint64_t seed = 7, int positions = 256) {
  std::string path = test::source_dir() + "/configs/tiny-llama.json";
  const bool copy = layers != 2 || positions != 256;
  if (copy) {
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    j["num_hidden_layers"] = layers;
    j["max_position_embeddings"] = positions;
    path = (std::filesystem::temp_directory_path() /
            ("troupe_hostrun_tiny_" + std::to_string(layers) + "_" + std::to_string(positions) + "_" +
             std::to_string(::getpid()) + ".json"))
               .string();
    std::ofstream(path) << j.dump();
  }
  OpenOptions o;
  o.load_format = "dummy";
  o.dummy_dtype = dtype;
  o.seed = seed;
  auto files = open_model(path, o);
  if (copy) std::filesystem::remove(path);
  return files;
}

// The logits of every step: a prompt, then n - 1 tokens fed one by one -- each step's
// argmax, or forced[i] where given (teacher forcing) -- with each step's argmax.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
Trace trace(const ModelFiles& f, Backend& be, const std::vector<int32_t>& prompt, int n,
            const std::vector<int32_t>& forced = {}, int32_t capacity = 256) {
  auto m = Model::build(f.config, *f.weights, be, 64);
  if (!m) FAIL(m.error().message);
  auto r = SequenceRunner::create(**m, be, capacity);
  if (!r) FAIL(r.error().message);
  Trace t;
  auto l = (*r)->feed(prompt);
  for (int i = 0; i < n; ++i) {
    if (!l) FAIL(be.name() << ": " << l.error().message);
    const int64_t vocab = f.config.vocab;
    t.logits.emplace_back(*l, *l + vocab);
    const auto tok = static_cast<int32_t>(std::max_element(*l, *l + vocab) - *l);
    t.tokens.push_back(tok);
    if (i + 1 < n) l = (*r)->feed({static_cast<size_t>(i) < forced.size() ? forced[i] : tok});
  }
  return t;
}

const std::vector<int32_t> kPrompt = {1, 17, 300, 511, 42, 42, 9, 0, 250, 77, 3, 128};

}  // namespace

namespace {
// How a trace fed ref's tokens agrees with ref: the largest |logit difference| and |logit|
// over every step, and at the decisive steps (ref's top two more than 0.05 apart) how
// many pick ref's token.
struct Agreement {
  double max_diff = 0, max_abs = 0;
  int decisive = 0, agree = 0;
};
Agreement agreement(const Trace& ref, const Trace& got) {
  Agreement a;
  REQUIRE(got.logits.size() == ref.logits.size());
  for (size_t s = 0; s < ref.logits.size(); ++s) {
    const auto& rl = ref.logits[s];
    std::vector<float> sorted = rl;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    for (size_t i = 0; i < rl.size(); ++i) {
      a.max_diff = std::max(a.max_diff, std::fabs(double(rl[i]) - got.logits[s][i]));
      a.max_abs = std::max(a.max_abs, std::fabs(double(rl[i])));
    }
    if (sorted[0] - sorted[1] > 0.05f) {
      ++a.decisive;
      a.agree += got.tokens[s] == ref.tokens[s];
    }
  }
  return a;
}
}  // namespace

TEST_CASE("host-run: the fake device runs the CUDA backend's kernels", "[hostrun]") {
  auto b = hostrun_backend();
  INFO(b->name());
  const auto before = hostrun::counters();
  std::vector<float> x(300), y(300);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i), y[i] = 2.f * float(i);
  float* dx = b->alloc(x.size());
  float* dy = b->alloc(y.size());
  b->copy_in(dx, x.data(), x.size());
  b->copy_in(dy, y.data(), y.size());
  b->add(dx, dy, x.size());
  std::vector<float> out(x.size());
  b->copy_out(out.data(), dx, out.size());
  REQUIRE(b->sync().ok());
  for (size_t i = 0; i < x.size(); ++i) CHECK(out[i] == 3.f * float(i));
  CHECK(hostrun::counters().kernel_launches > before.kernel_launches);
}

TEST_CASE("host-run: what a GPU would refuse or corrupt is an error of the step", "[hostrun]") {
  std::vector<float> host(64, 1.f);
  SECTION("a kernel writing past its buffer") {
    auto b = hostrun_backend();
    float* small = b->alloc(8);
    float* big = b->alloc(64);
    b->copy_in(big, host.data(), host.size());
    b->add(small, big, 64);  // 56 floats past `small`
    const auto s = b->sync();
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("illegal memory access") != std::string::npos);
    // The next backend is unharmed.
    auto c = hostrun_backend();
    float* d = c->alloc(64);
    c->copy_in(d, host.data(), host.size());
    c->add(d, d, 64);
    std::vector<float> out(64);
    c->copy_out(out.data(), d, 64);
    REQUIRE(c->sync().ok());
    CHECK(out[63] == 2.f);
  }
  SECTION("a kernel given host memory") {
    auto b = hostrun_backend();
    float* d = b->alloc(64);
    b->add(d, host.data(), 64);
    const auto s = b->sync();
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("add") != std::string::npos);
  }
  SECTION("an allocation that failed is not the next launch's error") {
    // (a failed cudaMalloc also sets the thread's last error, which a launch's
    // cudaGetLastError would otherwise report: the engine may retry a smaller KV cache)
    auto b = hostrun_backend();
    KvCacheShape huge;
    huge.num_layers = 1;
    huge.num_blocks = 1 << 20;
    huge.block_size = 16;
    huge.num_kv_heads = 8;
    huge.head_dim = 128;  // 32 GiB
    auto c = b->make_kv_cache(huge);
    REQUIRE_FALSE(c.ok());
    CHECK(c.error().message.find("out of memory") != std::string::npos);
    float* d = b->alloc(64);
    b->copy_in(d, host.data(), host.size());
    b->add(d, d, 64);
    std::vector<float> out(64);
    b->copy_out(out.data(), d, 64);
    const auto s = b->sync();
    INFO((s.ok() ? std::string("ok") : s.error().message));
    CHECK(s.ok());
    CHECK(out[0] == 2.f);
  }
  SECTION("weights larger than the device") {
    auto files = tiny("f32");
    REQUIRE(files.ok());
    // (TROUPE_HOSTRUN_MEMORY_MB would shrink the device for the whole process: a weight
    // bigger than the default 4 GiB instead)
    auto b = hostrun_backend();
    std::vector<uint8_t> row(4096 * 4, 0);
    std::vector<std::pair<const void*, int64_t>> parts;
    for (int i = 0; i < 300000; ++i) parts.push_back({row.data(), 1});  // 300000 rows of 16 KiB: 4.9 GB
    auto w = b->make_weight(DType::F32, 4096, parts);
    REQUIRE_FALSE(w.ok());
    INFO(w.error().message);
    CHECK(w.error().message.find("out of memory") != std::string::npos);
  }
}

TEST_CASE("host-run: a step's inputs packed for one upload: sequences, attention tiles, padded block tables",
          "[hostrun]") {
  // Three sequences of 1, 20 and 33 tokens; 3 blocks each, padded to 4.
  std::vector<int32_t> ids(54), pos(54), slots(54), qs = {0, 1, 21, 54}, ctx = {8, 30, 40}, bt(9);
  std::iota(ids.begin(), ids.end(), 100);
  std::iota(pos.begin(), pos.end(), 0);
  std::iota(slots.begin(), slots.end(), 1000);
  std::iota(bt.begin(), bt.end(), 1);
  StepInputs st{54, 3, ids.data(), pos.data(), qs.data(), ctx.data(), slots.data(), bt.data(), 3};
  const cuda::StepLayout l = cuda::step_layout(st);
  CHECK(l.width == 4);
  CHECK(l.total == 5 * 54 + 1 + 3 * 4);
  std::vector<int32_t> h(l.total, -7);
  CHECK(cuda::pack_step(st, l, h.data()) == 54);
  CHECK(h[0] == 100);
  CHECK(h[l.positions + 53] == 53);
  CHECK(h[l.slots + 5] == 1005);
  CHECK(h[l.token_seq + 0] == 0);
  CHECK(h[l.token_seq + 1] == 1);
  CHECK(h[l.token_seq + 20] == 1);
  CHECK(h[l.token_seq + 21] == 2);
  CHECK(h[l.token_seq + 53] == 2);
  const std::vector<int32_t> tiles(h.begin() + l.tiles, h.begin() + l.tiles + 8);
  CHECK(tiles == std::vector<int32_t>{0, 1, 17, 21, 37, 53, 54, 54});  // then 54 to the end
  CHECK(h[l.tiles + 54] == 54);
  CHECK(std::vector<int32_t>(h.begin() + l.block_tables, h.end()) ==
        std::vector<int32_t>{1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9, 0});
  // Query spans past the step's tokens are clamped: nothing is written outside the buffer.
  std::vector<int32_t> bad_qs = {0, 30, 1 << 30, -5};
  StepInputs bad = st;
  bad.query_start = bad_qs.data();
  std::vector<int32_t> g(l.total + 64, -7);
  cuda::pack_step(bad, l, g.data());
  CHECK(std::all_of(g.begin() + l.total, g.end(), [](int32_t v) { return v == -7; }));
  CHECK(g[l.token_seq + 53] == 1);
  // Spans with a gap (tokens 5..7 in none): still tiles of 1..16 tokens of one sequence that
  // cover every token once.
  std::vector<int32_t> gap_qs = {0, 5, 8, 54};
  bad.query_start = gap_qs.data();
  std::vector<int32_t> v(l.total, -7);
  cuda::pack_step(bad, l, v.data());
  int32_t covered = 0;
  for (size_t i = 0; i < 54 && v[l.tiles + i] < 54; ++i) {
    const int32_t a = v[l.tiles + i], b = v[l.tiles + i + 1];
    INFO("tile " << i << ": " << a << ".." << b);
    CHECK(a == covered);
    CHECK((b > a && b - a <= 16));
    for (int32_t t = a; t < b; ++t) CHECK(v[l.token_seq + t] == v[l.token_seq + a]);
    covered = b;
  }
  CHECK(covered == 54);
}

TEST_CASE("host-run: a launch sequence whose graph capture fails runs eagerly, now and later", "[hostrun]") {
  // A copy from pageable memory cannot be captured (the fake refuses it as a GPU does): the
  // second sighting's capture fails, and that flush and every later one run the copy eagerly,
  // each with the value the host holds then.
  cudaStream_t st = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 64) == cudaSuccess);
  std::vector<float> pageable(16, 0.0f);
  cuda::StepGraphs graphs;
  graphs.set_recording(true);
  for (int i = 0; i < 4; ++i) {
    pageable[0] = static_cast<float>(i);
    graphs.add("pageable copy", {1},
               [&](cudaStream_t s) { return cudaMemcpyAsync(dev, pageable.data(), 64, cudaMemcpyHostToDevice, s); });
    std::string what;
    INFO("flush " << i << ": " << what);
    REQUIRE(graphs.flush(st, &what) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    float back[16];
    REQUIRE(cudaMemcpy(back, dev, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(back[0] == static_cast<float>(i));
  }
  CHECK(graphs.capture_failures() == 1);
  CHECK(graphs.num_graphs() == 0);
  CHECK(graphs.replays() == 0);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaFree(dev);
  cudaStreamDestroy(st);
}

TEST_CASE("host-run: gpu_bench's GEMV kernels alone run eagerly and from a graph", "[hostrun]") {
  // troupe_gpu_bench's kernel-alone rows (bench/gpu/gemv_alone.cpp) on small shapes: every
  // launch and the capture go through the fake's bounds and capture checks, and the product
  // is the backend's matmul() of the same weights, bit for bit (the same kernels).
  std::mt19937 rng(9);
  int calls = 0;
  const gpu_bench::LoopMs once = [&](const std::function<void()>& fn, const std::function<void()>& sync) {
    ++calls;
    fn();
    sync();
    return 1.0;
  };
  for (const DType t : {DType::BF16, DType::Q4_1, DType::Q6_K}) {
    INFO(dtype_traits(t).name);
    const int64_t rows = 40, cols = 512;
    const auto gguf = test::random_weight(t, rows, cols, rng);
    const auto x = test::random_floats(static_cast<size_t>(cols), rng);
    std::vector<float> y;
    const auto r = gpu_bench::gemv_alone_rows(t, gguf, rows, cols, x, 1000.0, once, 0, &y);
    auto be = hostrun_backend();
    auto w = be->make_weight(t, cols, {{gguf.data(), rows}});
    REQUIRE(w.ok());
    float* dx = be->upload(x);
    float* dy = be->alloc(static_cast<size_t>(rows));
    be->matmul(**w, dx, 1, dy, rows);
    std::vector<float> want(static_cast<size_t>(rows), -1.0f);
    be->copy_out(want.data(), dy, want.size());
    REQUIRE(be->sync().ok());
    REQUIRE(y.size() == want.size());
    CHECK(std::memcmp(y.data(), want.data(), y.size() * 4) == 0);
    REQUIRE(r.size() == 2);
    CHECK(r[1].ms == 0.5);  // one graph of two launches a call
    CHECK(r[0].what.rfind("GEMV ", 0) == 0);
    CHECK(r[0].shape == "40x512, n=1");
    CHECK(cudaGetLastError() == cudaSuccess);
  }
  CHECK(calls == 6);
}

TEST_CASE("host-run: tiny-llama in every dummy weight type gives the CPU backend's logits and greedy choices",
          "[hostrun][model]") {
  // Both backends are fed the CPU's greedy tokens (random weights give flat logits, so a
  // free-running comparison would diverge at the first near tie): every step's logits
  // agree within 2% of their range, and where the CPU's top two differ by more than
  // 0.05 the device picks the same token.
  auto cpu = make_cpu_backend({1});
  for (const std::string dtype : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}) {
    auto files = tiny(dtype);
    REQUIRE(files.ok());
    auto gpu = hostrun_backend();
    const Trace c = trace(*files, *cpu, kPrompt, 24);
    const Trace g = trace(*files, *gpu, kPrompt, 24, c.tokens);
    const Agreement a = agreement(c, g);
    INFO(dtype << ": logits max |diff| " << a.max_diff << " of " << a.max_abs << " over 24 steps; " << a.agree << " of "
               << a.decisive << " decisive steps pick the CPU's token");
    CHECK(a.max_diff <= 0.02 * a.max_abs);
    CHECK(a.decisive >= 8);
    CHECK(a.agree == a.decisive);
  }
}

TEST_CASE("host-run: fused epilogues, the norms' quantization and graph replay change no bit", "[hostrun][model]") {
  for (const std::string dtype : {"q8_0", "q4_1", "bf16"}) {
    auto files = tiny(dtype);
    REQUIRE(files.ok());
    INFO(dtype);
    CudaBackendOptions eager;
    eager.graph_max_tokens = 0;
    auto fused = hostrun_backend(eager);
    const Trace a = trace(*files, *fused, kPrompt, 12);
    CHECK(fused->stats().find("fused GEMV epilogues: 0;") == std::string::npos);
    CHECK(fused->stats().find(" 0 replays") != std::string::npos);
    auto plain = [&] {
      test::EnvScope e("TROUPE_CUDA_FUSE", "0");
      return hostrun_backend(eager);
    }();
    const Trace b = trace(*files, *plain, kPrompt, 12);
    CHECK(plain->stats().find("fused GEMV epilogues: 0;") != std::string::npos);
    CHECK(a.tokens == b.tokens);
    CHECK(a.logits == b.logits);                         // bit for bit
    CHECK(CudaBackendOptions{}.graph_max_tokens == 64);  // graphs are the default (decode steps)
    auto graphs = hostrun_backend();
    const auto before = hostrun::counters();
    const Trace c = trace(*files, *graphs, kPrompt, 12);
    INFO(graphs->stats());
    CHECK(hostrun::counters().graph_launches > before.graph_launches);
    CHECK(graphs->stats().find(" 0 replays") == std::string::npos);
    CHECK(graphs->stats().find(" 0 failed captures") != std::string::npos);
    CHECK(a.tokens == c.tokens);
    CHECK(a.logits == c.logits);
  }
}

TEST_CASE("host-run: graphs replay decode steps across attention segment boundaries, bit for bit", "[hostrun][model]") {
  // A 500-token prompt (64-token chunks), then decode steps at positions 500..522: split-KV
  // attention needs 2 segments up to position 511, then 3 (attention_segments() rounds
  // neither up). Each segment count is its own launch signature, captured on its second
  // step and replayed after, with the eager launches' bits.
  auto files = tiny("q4_1", 2, 7, 1024);
  REQUIRE(files.ok());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 500; ++i) prompt.push_back((i * 37 + 5) % 512);
  CudaBackendOptions eager;
  eager.graph_max_tokens = 0;
  auto e_be = hostrun_backend(eager);
  const Trace a = trace(*files, *e_be, prompt, 24, {}, 1024);
  CHECK(e_be->stats().find(" 0 replays") != std::string::npos);
  auto be = hostrun_backend();  // (graphs: the default)
  auto replays = [&] { return static_cast<long long>(test::stats_count(*be, " held, ")); };
  // Twice on one backend: the second pass grows no scratch buffer (which would drop the
  // graphs), so a signature that missed the segment count would replay the 2-segment graph
  // for the 3-segment steps, and their logits would differ.
  const int64_t vocab = files->config.vocab;
  for (int pass = 0; pass < 2; ++pass) {
    auto m = Model::build(files->config, *files->weights, *be, 64);
    REQUIRE(m.ok());
    auto r = SequenceRunner::create(**m, *be, 1024);
    REQUIRE(r.ok());
    auto l = (*r)->feed(prompt);
    long long before = 0;
    for (int i = 0; i < 24; ++i) {
      REQUIRE(l.ok());
      INFO("pass " << pass << ", step " << i << ": " << be->stats());
      REQUIRE(std::equal(*l, *l + vocab, a.logits[static_cast<size_t>(i)].begin()));  // bit for bit
      // Positions 500..511 (steps 1-12, 2 segments), then 512..522 (steps 13-23, 3
      // segments): each shape's first step runs eagerly, the second is captured, and every
      // later one replays. (The first pass may run one more step of each eagerly: a scratch
      // buffer that grew drops the graphs.)
      if (i == 1) before = replays();
      if (i == 12) {
        CHECK(replays() - before >= (pass == 0 ? 10 : 11));
        before = replays();
      }
      if (i == 23) CHECK(replays() - before >= (pass == 0 ? 9 : 10));
      if (i + 1 < 24) l = (*r)->feed({a.tokens[static_cast<size_t>(i)]});
    }
  }
  CHECK(be->stats().find(" 0 failed captures") != std::string::npos);
}

TEST_CASE("host-run: with --cuda-cublas, steps through cuBLAS are not recorded as graphs", "[hostrun][model]") {
  // Three 12-token chunks (cuBLAS: over 8 tokens) of one signature would be captured and
  // replayed, piece by piece between the cuBLAS calls, if recorded; then decode steps (the
  // GEMV) are recorded and replay. Either way the bits are the eager launches'.
  auto files = tiny("bf16");
  REQUIRE(files.ok());
  CudaBackendOptions o;
  o.batch_invariant = false;
  CudaBackendOptions oe = o;
  oe.graph_max_tokens = 0;
  auto be = hostrun_backend(o), eager = hostrun_backend(oe);
  auto replays = [&] { return static_cast<long long>(test::stats_count(*be, " held, ")); };
  std::vector<std::vector<float>> got[2];
  for (int k = 0; k < 2; ++k) {
    Backend& b = k == 0 ? *be : *eager;
    auto m = Model::build(files->config, *files->weights, b, 64);
    REQUIRE(m.ok());
    auto r = SequenceRunner::create(**m, b, 256);
    REQUIRE(r.ok());
    const int64_t vocab = files->config.vocab;
    for (int c = 0; c < 3; ++c) {
      std::vector<int32_t> chunk(kPrompt.begin(), kPrompt.end());
      for (auto& t : chunk) t = (t + 31 * c) % 512;
      auto l = (*r)->feed(chunk);
      REQUIRE(l.ok());
      got[k].emplace_back(*l, *l + vocab);
    }
    if (k == 0) CHECK(replays() == 0);
    for (int i = 0; i < 6; ++i) {
      auto l = (*r)->feed({static_cast<int32_t>(7 * i + 1)});
      REQUIRE(l.ok());
      got[k].emplace_back(*l, *l + vocab);
    }
    if (k == 0) CHECK(replays() >= 4);  // decode steps: 6, the first two not replayed
  }
  CHECK(got[0] == got[1]);  // bit for bit
}

TEST_CASE("host-run: the int8 matmuls on tensor cores (TROUPE_CUDA_Q8_MMA) change no bit", "[hostrun][model]") {
  // From 4 tokens on: the 12-token prompt's matmuls take the mma kernel (and the unfused
  // RoPE and SiLU ops), decode steps the GEMV.
  for (const std::string dtype : {"q8_0", "q4_1", "q5_0"}) {
    auto files = tiny(dtype);
    REQUIRE(files.ok());
    INFO(dtype);
    auto gemv = hostrun_backend();
    const Trace a = trace(*files, *gemv, kPrompt, 12);
    CHECK(gemv->stats().find("int8 matmuls on tensor cores: 0") != std::string::npos);
    auto mma = [] {
      test::EnvScope e("TROUPE_CUDA_Q8_MMA", "4");
      return hostrun_backend();
    }();
    const Trace b = trace(*files, *mma, kPrompt, 12);
    INFO(mma->stats());
    CHECK(mma->stats().find("int8 matmuls on tensor cores: 0") == std::string::npos);
    CHECK(a.tokens == b.tokens);
    CHECK(a.logits == b.logits);  // bit for bit
  }
}

TEST_CASE("host-run: every token's attention on tensor cores (TROUPE_CUDA_ATTN=tc) runs the model",
          "[hostrun][model]") {
  // The 12-token prompt in one tile per sequence, then decode steps of one token (split-KV
  // never: 12 keys are one segment). Other bits than the per-token kernel (P rounded to
  // f16), so: logits within 2% of their range of the default backend's, the same token
  // wherever its top two differ by more than 0.05.
  for (const std::string dtype : {"q4_1", "bf16"}) {
    auto files = tiny(dtype);
    REQUIRE(files.ok());
    INFO(dtype);
    auto plain = hostrun_backend();
    const Trace a = trace(*files, *plain, kPrompt, 12);
    auto tc = [] {
      test::EnvScope e("TROUPE_CUDA_ATTN", "tc");
      return hostrun_backend();
    }();
    const Trace b = trace(*files, *tc, kPrompt, 12, a.tokens);
    INFO(tc->stats());
    CHECK(tc->stats().find("batch-invariant attention on tensor cores: 0") == std::string::npos);
    CHECK(plain->stats().find("batch-invariant attention on tensor cores: 0") != std::string::npos);
    const Agreement g = agreement(a, b);
    INFO("logits max |diff| " << g.max_diff << " of " << g.max_abs << "; " << g.agree << " of " << g.decisive);
    CHECK(g.max_diff > 0);  // (another kernel ran)
    CHECK(g.max_diff <= 0.02 * g.max_abs);
    CHECK(g.agree == g.decisive);
  }
}

TEST_CASE("host-run: --cuda-cublas prefill attention on tensor cores (mma.sync, WMMA) runs the model",
          "[hostrun][model]") {
  // A 100-token prompt in steps of up to 64 tokens: the first step's four one-sequence tiles
  // take the tensor-core kernel (64+ tokens), the second step (36) the per-token one, then
  // decode steps. Against the batch-invariant backend (other numerics: cuBLAS rounds x to
  // bf16, P is rounded to f16): logits within 3% of their range, the same token wherever
  // its top two differ by more than 0.05. The stats line counts the mma.sync kernel's calls
  // (one a layer for the 64-token step), as the two kernels' logits coincide here: emulated,
  // their S and P V products are alike, and their softmax weights mostly round to the same
  // f16 and then to the same bf16 (scaling the mma.sync kernel's output by hand moves the
  // logits by 0.018 instead of 0.0014).
  auto files = tiny("bf16");
  REQUIRE(files.ok());
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((37 * i + 5) % 512);
  auto plain = hostrun_backend();
  const Trace a = trace(*files, *plain, prompt, 6);
  for (const char* attn : {static_cast<const char*>(nullptr), "wmma"}) {
    auto be = [&] {
      test::EnvScope e("TROUPE_CUDA_ATTN", attn);
      CudaBackendOptions o;
      o.batch_invariant = false;
      return hostrun_backend(o);
    }();
    const Agreement g = agreement(a, trace(*files, *be, prompt, 6, a.tokens));
    INFO((attn ? attn : "mma.sync") << ": logits max |diff| " << g.max_diff << " of " << g.max_abs << "; " << g.agree
                                    << " of " << g.decisive << "; " << be->stats());
    CHECK(test::stats_count(*be, "prefill tiles' attention on mma.sync: ") ==
          static_cast<uint64_t>(attn ? 0 : files->config.num_layers));
    CHECK(g.max_diff > 0);
    CHECK(g.max_diff <= 0.03 * g.max_abs);
    CHECK(g.agree == g.decisive);
  }
}

TEST_CASE("host-run: troupe_gpu_bench --smoke runs every section, row and check of the GPU bench", "[hostrun]") {
  // bench/gpu's bench at small sizes over this fake (its code runs on a GPU only in a lent
  // machine's one check.sh run, where a crash or a check that cannot pass costs that run):
  // every section runs, no check fails, the table and JSON are written with every target.
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-gpu-bench-smoke-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string cfg = test::source_dir() + "/configs/tiny-llama.json";
  std::vector<std::string> args = {"troupe_gpu_bench", dir.string(), "--smoke", "--config", cfg};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const int rc = gpu_bench::run(static_cast<int>(argv.size()), argv.data());
  std::ifstream in(dir / "gpu-check.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  INFO(j.dump(1).substr(0, 4000));
  CHECK(rc == 0);
  CHECK(j["failures"].empty());
  std::set<std::string> what;
  for (const auto& r : j["rows"]) {
    what.insert(r["what"].get<std::string>());
    CHECK(r["ms"].get<double>() > 0);
  }
  for (const std::string w : {"ceiling: device-to-device copy", "rms_norm, bf16 copy for cuBLAS too",
                              "gate/up GEMV + silu_mul bf16 (fused epilogue)", "decode part: attention",
                              "prefill matmul bf16 (x->bf16 + cuBLAS)",
                              "prefill matmul bf16 (x in bf16 from the norm + cuBLAS; the norm's extra store counted)",
                              "decode attention (tensor cores, batch-invariant, mma.sync, TROUPE_CUDA_ATTN=tc)",
                              "decode Llama-3-8B dummy bf16, batch-invariant GEMV, CUDA graphs",
                              "prefill Llama-3-8B dummy bf16, cuBLAS above 8 tokens, CUDA graphs",
                              "matmul bf16 (batch-invariant tensor cores)"})
    CHECK(what.count(w) == 1);
  CHECK(what.size() >= 60);
  CHECK(j["targets"].size() >= 6);
  std::filesystem::remove_all(dir);
}

TEST_CASE(
    "host-run: a matmul takes prepared activations only from the op just before, on the same buffer, shape and "
    "rounding",
    "[hostrun]") {
  // kernels/cuda/prepared.h: what the backend records after a norm, attention or SiLU and
  // a matmul asks for (seq: the backend's op count). Every take consumes the record.
  cuda::PreparedActivations p;
  float a[1], b[1];
  uint8_t xq[1];
  uint16_t h[1], h2[1];
  const cuda::Q8Numerics q40 = cuda::q8_numerics(DType::Q4_0), q41 = cuda::q8_numerics(DType::Q4_1);
  p.record(a, 4, 64, 5, xq, q40, {});
  CHECK(p.take_q8(a, 4, 64, 5, q40) == xq);
  CHECK(p.take_q8(a, 4, 64, 5, q40) == nullptr);  // consumed
  const auto miss_q8 = [&](const float* x, int64_t n, int64_t cols, uint64_t seq, cuda::Q8Numerics nq) {
    p.record(a, 4, 64, 5, xq, q40, {});
    const bool miss = p.take_q8(x, n, cols, seq, nq) == nullptr;
    return miss && p.take_q8(a, 4, 64, 5, q40) == nullptr;  // (a miss consumes it too)
  };
  CHECK(miss_q8(b, 4, 64, 5, q40));  // another buffer
  CHECK(miss_q8(a, 3, 64, 5, q40));  // another token count
  CHECK(miss_q8(a, 4, 96, 5, q40));  // another width
  CHECK(miss_q8(a, 4, 64, 6, q40));  // an op in between
  CHECK(miss_q8(a, 4, 64, 5, q41));  // another rounding
  CHECK(p.q8_made() == 6);
  CHECK(p.q8_used() == 1);
  // An op that prepared nothing leaves the record as it was (its seq has moved on anyway).
  p.record(a, 4, 64, 5, xq, q40, {});
  p.record(b, 4, 64, 5, nullptr, {}, {});
  CHECK(p.take_q8(a, 4, 64, 5, q40) == xq);
  // Half rows for cuBLAS: the same rules, and the buffer and bf16/f16 must be the asker's.
  const auto take_half = [&](const float* x, int64_t n, int64_t cols, uint64_t seq, cuda::HalfOut want) {
    p.record(a, 4, 64, 5, nullptr, {}, {h, true});
    return p.take_half(x, n, cols, seq, want);
  };
  CHECK(take_half(a, 4, 64, 5, {h, true}));
  CHECK_FALSE(p.take_half(a, 4, 64, 5, {h, true}));  // consumed
  CHECK_FALSE(take_half(a, 4, 64, 5, {h, false}));   // f16 asked, bf16 written
  CHECK_FALSE(take_half(a, 4, 64, 5, {h2, true}));   // another buffer (xh_ reallocated)
  CHECK_FALSE(take_half(a, 4, 64, 5, {nullptr, true}));
  CHECK_FALSE(take_half(a, 4, 64, 6, {h, true}));
  CHECK_FALSE(take_half(b, 4, 64, 5, {h, true}));
  CHECK(p.half_taken(true) == 1);
  CHECK(p.half_taken(false) == 6);
  // Neither form stands in for the other.
  p.record(a, 4, 64, 5, nullptr, {}, {h, true});
  CHECK(p.take_q8(a, 4, 64, 5, q40) == nullptr);
  p.record(a, 4, 64, 5, xq, q40, {});
  CHECK_FALSE(p.take_half(a, 4, 64, 5, {h, true}));
}

TEST_CASE("host-run: --cuda-cublas matmuls take x in half from the norm or SiLU before them, the same bits",
          "[hostrun][model]") {
  // A 100-token prompt (steps of 64 and 36 tokens: cuBLAS) and decode steps (the GEMV): the
  // norms, attention and SiLU write their output in half for the cuBLAS matmul after them
  // (bf16; f16 for the other types, dequantized to f16 there), which converts nothing. Per
  // layer and cuBLAS step the QKV and gate/up matmuls take the norms' copies, O attention's
  // (the 64-token step's from the mma.sync tile kernel -- the WMMA one with
  // TROUPE_CUDA_ATTN=wmma -- and the per-token one, the 36-token step's from the per-token
  // one) and down SiLU's (Q, K and V unfused: K and V take Q's). Against TROUPE_CUDA_FUSE=0
  // (every matmul converts): the same logits, bit for bit.
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((37 * i + 5) % 512);
  for (const auto& [dtype, attn] : std::vector<std::pair<std::string, const char*>>{
           {"bf16", nullptr}, {"f16", nullptr}, {"q8_0", nullptr}, {"bf16", "wmma"}}) {
    auto files = tiny(dtype);
    REQUIRE(files.ok());
    test::EnvScope env("TROUPE_CUDA_ATTN", attn);
    CudaBackendOptions o;
    o.batch_invariant = false;
    auto fused = hostrun_backend(o);
    auto plain = [&] {
      test::EnvScope e("TROUPE_CUDA_FUSE", "0");
      return hostrun_backend(o);
    }();
    const Trace a = trace(*files, *fused, prompt, 4);
    const Trace b = trace(*files, *plain, prompt, 4, a.tokens);
    INFO(dtype << (attn ? " wmma: " : ": ") << fused->stats());
    const uint64_t layers = static_cast<uint64_t>(files->config.num_layers);
    CHECK(test::stats_count(*fused, "cuBLAS inputs in half from the op before: ") >= 2 * 4 * layers);
    CHECK(test::stats_count(*fused, "(converted: ") == 0);
    CHECK(test::stats_count(*plain, "cuBLAS inputs in half from the op before: ") == 0);
    CHECK(test::stats_count(*plain, "(converted: ") >= 2 * 4 * layers);
    CHECK(a.logits == b.logits);
  }
}

TEST_CASE("host-run: a decode step takes 7 launches a layer, int8 types and bf16 alike", "[hostrun][model]") {
  // norm (int8: quantizing for QKV), QKV with RoPE + KV write, attention (quantizing for O),
  // O, add + norm (quantizing for gate/up), gate/up with SiLU (quantizing for down), down.
  // Launches of one decode step (12 tokens of context: one attention launch) with 2 and 4
  // layers; the difference is two layers' worth.
  for (const auto& [dtype, per_layer] :
       std::vector<std::pair<std::string, uint64_t>>{{"q8_0", 7}, {"q4_0", 7}, {"bf16", 7}}) {
    uint64_t step[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      auto files = tiny(dtype, i == 0 ? 2 : 4);
      REQUIRE(files.ok());
      auto gpu = hostrun_backend();
      auto m = Model::build(files->config, *files->weights, *gpu, 64);
      REQUIRE(m.ok());
      auto r = SequenceRunner::create(**m, *gpu, 256);
      REQUIRE(r.ok());
      REQUIRE((*r)->feed(kPrompt).ok());
      const auto before = hostrun::counters().kernel_launches;
      REQUIRE((*r)->feed({5}).ok());
      step[i] = hostrun::counters().kernel_launches - before;
    }
    INFO(dtype << ": a decode step of 2 layers takes " << step[0] << " launches, of 4 layers " << step[1]);
    CHECK(step[1] - step[0] == 2 * per_layer);
  }
}

namespace {
// make_backend("cuda...") -- the actor runtime's way to a backend -- gives this binary's
// host-run CUDA backend.
[[maybe_unused]] const bool factory_installed = [] {
  set_cuda_backend_factory_for_tests(&make_cuda_backend);
  return true;
}();
}  // namespace

TEST_CASE("host-run: speculative decoding on the CUDA backend (n-gram and self-drafts) changes no token",
          "[hostrun][model]") {
  // Composition only: the verifying pass is an ordinary packed step, a self-draft round is
  // the first layers, the final norm and the LM head through the same kernels.
  auto files = tiny("q8_0", 4);
  REQUIRE(files.ok());
  auto be = hostrun_backend();
  auto model = Model::build(files->config, *files->weights, *be, 64);
  REQUIRE(model.ok());
  std::vector<std::vector<int32_t>> prompts = {kPrompt, {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7}, {400, 3, 3, 3, 3, 3}};
  auto run = [&](const std::string& method, SpecStats* spec) {
    EngineConfig cfg;
    cfg.scheduler = {64, 8};
    cfg.scheduler.num_speculative_tokens = method.empty() ? 0 : 4;
    cfg.kv = {32, 16, true};
    auto e = Engine::create(**model, *be, cfg, SchedulingPolicy::fcfs(), [](int32_t) { return false; });
    REQUIRE(e.ok());
    if (!method.empty()) {
      auto d = make_draft_source(method);
      REQUIRE(d.ok());
      REQUIRE((*e)->set_draft_source(std::move(*d)).ok());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      SeqRequest r;
      r.id = static_cast<int64_t>(i);
      r.prompt = prompts[i];
      r.max_new_tokens = 20;
      r.sampling.temperature = 0;
      REQUIRE((*e)->add(r).ok());
    }
    std::map<int64_t, std::vector<int32_t>> out;
    for (int guard = 0; (*e)->has_work() && guard < 1000; ++guard) {
      auto ev = (*e)->step();
      if (!ev) FAIL(ev.error().message);
      for (const auto& x : *ev) out[x.id].push_back(x.token);
    }
    CHECK((*e)->kv().num_free_blocks() == 32);
    if (spec) *spec = (*e)->scheduler().spec_stats();
    return out;
  };
  const auto plain = run("", nullptr);
  for (const std::string method : {"ngram", "self:2", "self:4"}) {
    INFO(method);
    SpecStats spec;
    CHECK(run(method, &spec) == plain);
    if (method != "ngram") CHECK(spec.num_draft_tokens > 0);
    // (the whole model as its draft: batch-invariant kernels land every greedy draft)
    if (method == "self:4") CHECK(spec.num_accepted_tokens + 3 * 4 >= spec.num_draft_tokens);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}
