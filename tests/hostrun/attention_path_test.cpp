// CudaBackend's choice of attention kernel (kernels/cuda/attention_path.h) against the rules
// docs/gpu.md states, with the kernels' real shared-memory needs (their source compiled for
// the host here).
#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/attention_path.h"
#include "kernels/cuda/ops.h"

namespace troupe {
namespace {

constexpr int64_t kH200 = 227 * 1024;  // bytes a block may opt into: sm_90
constexpr int64_t kSm89 = 99 * 1024;   // sm_86, sm_89, sm_120

cuda::AttentionPath path(bool invariant, const char* attn, int32_t tokens, int32_t hd, int64_t optin) {
  const std::string a = attn ? attn : "";
  return cuda::attention_path({invariant, a == "tc" || a == "wmma", a == "wmma", tokens, hd, optin});
}
bool none(const cuda::AttentionPath& p) { return !p.every_token && !p.tiles && !p.mma; }

TEST_CASE("host-run: which attention kernel a step takes (attention_path)", "[hostrun]") {
  INFO("shared bytes at head size 128: mma " << cuda::attention_mma_shared_bytes(128, false) << ", mma invariant "
                                             << cuda::attention_mma_shared_bytes(128, true) << ", WMMA "
                                             << cuda::attention_tc_shared_bytes(128) << "; at 256: WMMA "
                                             << cuda::attention_tc_shared_bytes(256));
  for (const int32_t hd : {64, 128, 256}) {
    for (const int32_t tokens : {1, 63, 64, 500}) {
      INFO("head size " << hd << ", " << tokens << " tokens");
      // Batch-invariant by default: the per-token kernel for every step, whatever its size.
      CHECK(none(path(true, nullptr, tokens, hd, kH200)));
      // TROUPE_CUDA_ATTN=tc only changes the batch-invariant mode ...
      if (tokens < cuda::kTcMinTokens) CHECK(none(path(false, "tc", tokens, hd, kH200)));
      // ... where its choice depends on head size and device alone, never on the step.
      for (const char* attn : {"tc", "wmma"}) {
        INFO(attn);
        const auto p = path(true, attn, tokens, hd, kH200), q = path(true, attn, 1, hd, kH200);
        CHECK(p.every_token == q.every_token);
        CHECK(p.mma == q.mma);
        CHECK(!p.tiles);
      }
      // No shared memory to opt into (no device attribute): the per-token kernel.
      for (const bool inv : {true, false})
        for (const char* attn : {static_cast<const char*>(nullptr), "tc", "wmma"})
          CHECK(none(path(inv, attn, tokens, hd, 0)));
    }
  }
  // --cuda-cublas: tiles on tensor cores from 64 tokens, on the mma.sync kernel up to head
  // size 128 (69 KB: also on 99 KB devices), WMMA with TROUPE_CUDA_ATTN=wmma.
  for (const int64_t optin : {kH200, kSm89}) {
    INFO("opt-in " << optin);
    for (const int32_t hd : {64, 128}) {
      INFO("head size " << hd);
      CHECK(none(path(false, nullptr, cuda::kTcMinTokens - 1, hd, optin)));
      const auto p = path(false, nullptr, cuda::kTcMinTokens, hd, optin);
      CHECK((p.tiles && p.mma && !p.every_token));
      const auto w = path(false, "wmma", 500, hd, optin);
      CHECK((w.tiles && !w.mma));
    }
  }
  // Heads over 128: no mma.sync kernel; WMMA tiles where the device allows their memory.
  const auto wide = path(false, nullptr, 500, 256, kH200);
  CHECK(!wide.mma);
  CHECK(wide.tiles == (cuda::attention_tc_shared_bytes(256) > 0 && cuda::attention_tc_shared_bytes(256) <= kH200));
  // TROUPE_CUDA_ATTN=tc at head size 128: the mma.sync kernel needs 100 KB in this mode, so
  // an H200 takes it and a 99 KB device the WMMA one; =wmma takes WMMA on both.
  const auto h200 = path(true, "tc", 7, 128, kH200), small = path(true, "tc", 7, 128, kSm89);
  CHECK((h200.every_token && h200.mma));
  CHECK((small.every_token && !small.mma));
  const auto w = path(true, "wmma", 7, 128, kH200);
  CHECK((w.every_token && !w.mma));
  // Head size 256 has no batch-invariant tensor-core kernel: the per-token one.
  CHECK(none(path(true, "tc", 7, 256, kH200)));
}

}  // namespace
}  // namespace troupe
