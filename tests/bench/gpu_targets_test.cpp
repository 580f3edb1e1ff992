// The targets table troupe_gpu_bench ends with (bench/gpu/gpu_targets.h), on rows made up
// here: it runs only on a GPU, so its logic is checked on the CPU.
#include <catch2/catch.hpp>

#include <sstream>

#include "bench/gpu/gpu_targets.h"

using gpu_bench::Row;

namespace {
Row row(const std::string& what, const std::string& shape, double ms, double pct, const std::string& of) {
  return Row{what, shape, ms, 0, "GB/s", pct, of};
}
const nlohmann::json& target(const nlohmann::json& t, const std::string& starts) {
  for (const auto& e : t)
    if (e["target"].get<std::string>().rfind(starts, 0) == 0) return e;
  FAIL("no target " << starts);
  return t;
}
}  // namespace

TEST_CASE("gpu_bench's targets: the best row per target, the worst quantized type, the time between kernels",
          "[bench]") {
  std::vector<Row> rows = {
      row("decode Llama-3-8B dummy bf16, batch-invariant GEMV, CUDA graphs", "batch 1, ctx 1024", 5.0, 70,
          "bandwidth roofline"),
      row("decode Llama-3-8B dummy bf16, cuBLAS above 8 tokens, CUDA graphs", "batch 1, ctx 1024", 4.5, 88,
          "bandwidth roofline"),
      row("decode attention (paged, f16 KV, K staged)", "16 seqs x 4096 ctx", 0.1, 40, "copy"),
      row("decode attention (tensor cores, batch-invariant, TROUPE_CUDA_ATTN=tc)", "16 seqs x 4096 ctx", 0.1, 60,
          "copy"),
      row("GEMV q8_0 (int8 x, dp4a)", "14336x4096, n=1", 0.1, 90, "copy"),
      row("GEMV q8_0 (int8 x, dp4a)", "14336x4096, n=8", 0.1, 20, "copy"),  // (8 tokens: not this target)
      row("GEMV q4_0 (int8 x, dp4a)", "14336x4096, n=1", 0.1, 86, "copy"),
      row("GEMV q4_0 (f32 x in shared memory)", "14336x4096, n=1", 0.1, 30, "copy"),
      row("GEMV q4_1 (int8 x, dp4a)", "14336x4096, n=1", 0.1, 87, "copy"),
      row("GEMV q4_k (int8 x, dp4a)", "14336x4096, n=1", 0.1, 50, "copy"),
      row("GEMV q4_k (f32 x in shared memory)", "14336x4096, n=1", 0.1, 55, "copy"),
      row("GEMV q6_k (int8 x, dp4a)", "14336x4096, n=1", 0.1, 95, "copy"),
      row("prefill matmul bf16 (x->bf16 + cuBLAS)", "14336x4096 x 2048 tokens", 0.4, 92, "cuBLAS same shape"),
      row("prefill attention (paged, causal)", "4096 tokens", 12, 1.4, "bf16 GEMM"),
  };
  std::ostringstream md;
  const auto t = gpu_bench::targets_table(rows, 4.8, md);
  REQUIRE(t.size() == 6);
  CHECK(target(t, "decode at batch 1")["measured_pct"] == 88);
  CHECK(target(t, "decode at batch 1")["met"] == true);
  CHECK(target(t, "decode attention")["measured_pct"] == 60);
  CHECK(target(t, "decode attention")["met"] == false);
  // q4_k's best kernel (55) is the worst type's best: missed.
  const auto& q = target(t, "quantized GEMV");
  CHECK(q["measured_pct"] == 55);
  CHECK(q["from"].get<std::string>().find("q4_k (f32 x") != std::string::npos);
  CHECK(q["met"] == false);
  CHECK(target(t, "prefill matmul")["met"] == true);
  CHECK(target(t, "prefill attention")["measured_pct"] == Approx(1.4));
  // (5.0 - 4.8) / 5.0 = 4%: under the 5% bound.
  const auto& gap = target(t, "time between kernels");
  CHECK(gap["measured_pct"] == Approx(4.0));
  CHECK(gap["met"] == true);
  CHECK(md.str().find("| no |") != std::string::npos);
  // Without the decode parts, or with no row for a target: "not measured", not met.
  std::ostringstream md2;
  const auto none = gpu_bench::targets_table({}, -1, md2);
  for (const auto& e : none) CHECK(e["met"] == false);
  CHECK(md2.str().find("not measured") != std::string::npos);
}
