// What the sections of troupe_gpu_bench share (defined in bench/gpu/gpu_bench.cpp): the rows
// and results, timing, random bf16 weights; and the end-to-end sections (model_bench.cpp).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/gpu/gpu_targets.h"
#include "kernels/backend.h"
#include "runtime/model/model_config.h"

namespace gpu_bench {

// The sizes the sections run at: Llama-3-8B's by default; small with --smoke, to run every
// section and check over the host-run CUDA fake (tests/hostrun) before a GPU's time is
// spent on them (the rows' labels keep the default sizes).
struct Sizes {
  size_t copy_bytes = size_t{4} << 30;      // the copy ceiling
  int gemm = 8192;                          // the cuBLAS ceiling's m = n = k
  int64_t rows = 14336, cols = 4096;        // GEMV and prefill matmul weights: ffn x hidden
  int64_t tokens = 2048;                    // prefill tokens (also the small ops' rows)
  size_t stream_bytes = size_t{512} << 20;  // weight copies streamed, past the L2
  int64_t vocab = 128256, sample_batch = 64;
  int32_t attn_ctx = 4096, attn_seqs = 16, attn_heads = 32, attn_kv_heads = 8;  // head size 128
  std::vector<int64_t> q8_tokens = {16, 64, 256};  // the int8 tensor-core matmul below prefill
  int32_t e2e_ctx = 1024, e2e_prefill = 2048;
  std::vector<int32_t> e2e_batches = {1, 8, 64, 256};
  static Sizes smoke();
};
extern Sizes S;

double now();                 // seconds, steady clock
extern nlohmann::json out;    // gpu-check.json's fields besides the rows
void add(Row r);              // prints a row; the table and JSON are written again
void fail(std::string what);  // a failed check: listed, the bench goes on and exits 1
// Runs fn (which queues work) over enough repetitions for >= 100 ms of wall time, then
// sync (which waits for that work); returns ms per call. Every figure the tables compare
// (kernels and the ceilings they are a percentage of) is taken this way: a GPU kept busy
// for 100 ms may run at a lower clock than one timed in a short burst, so a ceiling timed
// in a burst would flatter itself against the kernels.
double loop_ms(const std::function<void()>& fn, const std::function<void()>& sync);
double time_ms(troupe::Backend& be, const std::function<void()>& fn);  // loop_ms with be.sync()
std::vector<uint16_t> random_bf16(size_t n, float scale);              // uniform in [-scale, scale)

// A backend, weight or cache, or the bench stops with the reason.
template <typename R>
void need(const R& r) {
  if (!r) {
    std::fprintf(stderr, "%s\n", r.error().message.c_str());
    std::exit(1);
  }
}

// troupe_gpu_bench OUT_DIR [--config F] [--skip-e2e] [--smoke] (bench/gpu/gpu_bench_main.cpp;
// the host-run tests call it with --smoke): 0 when every check passed.
int run(int argc, char** argv);

// Each op of a Llama-3-8B-shaped bf16 decode step at batch 1 alone (out["decode_parts_ms"]:
// their sum over the layers), then the dummy model end to end in each matmul mode.
void bench_decode_parts(const troupe::ModelConfig& cfg, double copy_gbs);
void bench_end_to_end(const troupe::ModelConfig& cfg, double copy_gbs);

}  // namespace gpu_bench
