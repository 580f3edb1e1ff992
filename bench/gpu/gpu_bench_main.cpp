// troupe_gpu_bench: the GPU microbenchmarks and end-to-end figures of bench/gpu/check.sh
// (bench/gpu/gpu_bench.cpp, docs/gpu.md).
#include "bench/gpu/bench_util.h"

int main(int argc, char** argv) { return gpu_bench::run(argc, argv); }
