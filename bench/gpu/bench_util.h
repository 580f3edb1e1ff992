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
#include "runtime/model_config.h"

namespace gpu_bench {

double now();                    // seconds, steady clock
extern nlohmann::json out;       // gpu-check.json's fields besides the rows
void add(Row r);                 // prints a row; the table and JSON are written again
void fail(std::string what);     // a failed check: listed, the bench goes on and exits 1
// Runs fn (which queues work) over enough repetitions for >= 100 ms of wall time, then
// sync (which waits for that work); returns ms per call. Every figure the tables compare
// (kernels and the ceilings they are a percentage of) is taken this way: a GPU kept busy
// for 100 ms may run at a lower clock than one timed in a short burst, so a ceiling timed
// in a burst would flatter itself against the kernels.
double loop_ms(const std::function<void()>& fn, const std::function<void()>& sync);
double time_ms(troupe::Backend& be, const std::function<void()>& fn);  // loop_ms with be.sync()
std::vector<uint16_t> random_bf16(size_t n, float scale);      // uniform in [-scale, scale)

// A backend, weight or cache, or the bench stops with the reason.
template <typename R>
void need(const R& r) {
  if (!r) {
    std::fprintf(stderr, "%s\n", r.error().message.c_str());
    std::exit(1);
  }
}

// Each op of a Llama-3-8B-shaped bf16 decode step at batch 1 alone (out["decode_parts_ms"]:
// their sum over the layers), then the dummy model end to end in each matmul mode.
void bench_decode_parts(const troupe::ModelConfig& cfg, double copy_gbs);
void bench_end_to_end(const troupe::ModelConfig& cfg, double copy_gbs);

}  // namespace gpu_bench
