// Activations an op writes, in its own launch, in the form the matmul that reads its output
// next takes (the ops' `next`): int8 blocks for the int8 GEMV (written by a norm, attention
// or the SiLU GEMV) or half rows for cuBLAS (a norm, SiLU), so that matmul quantizes or
// converts nothing. The CUDA backend records them here; a matmul takes them only as the very
// next op (`seq`: the backend's count of every launch, copy and step) on the same buffer,
// shape and rounding, and quantizes or converts x itself otherwise. A cuBLAS matmul records
// its own half input again, for a next matmul of the same x (unfused Q, K and V).
#pragma once
#include <cstdint>

#include "kernels/cuda/ops.h"

namespace troupe::cuda {

class PreparedActivations {
 public:
  // out (n rows of dim values) is also in xq (rounded as nq) or xh; neither: nothing is.
  void record(const float* out, int64_t n, int64_t dim, uint64_t seq, uint8_t* xq, Q8Numerics nq, HalfOut xh) {
    if (!xq && !xh.p) return;
    p_ = {out, n, dim, seq, xq, nq, xh};
    q8_made_ += xq != nullptr;
  }
  // Where x's int8 blocks are, rounded as nq (consumed either way; null: not prepared).
  uint8_t* take_q8(const float* x, int64_t n, int64_t cols, uint64_t seq, Q8Numerics nq) {
    const bool hit = same(x, n, cols, seq) && p_.xq && p_.nq == nq;
    p_.x = nullptr;
    q8_used_ += hit;
    return hit ? p_.xq : nullptr;
  }
  // Whether x is in `want` already (consumed either way).
  bool take_half(const float* x, int64_t n, int64_t cols, uint64_t seq, HalfOut want) {
    const bool hit = same(x, n, cols, seq) && want.p && p_.xh.p == want.p && p_.xh.bf16 == want.bf16;
    p_.x = nullptr;
    ++half_taken_[hit];
    return hit;
  }
  uint64_t q8_made() const { return q8_made_; }  // ops that quantized their output for the next matmul
  uint64_t q8_used() const { return q8_used_; }  // matmuls that took those bytes instead of quantizing
  // Half cuBLAS matmuls that converted x themselves (false) or took it prepared (true).
  uint64_t half_taken(bool hit) const { return half_taken_[hit]; }

 private:
  bool same(const float* x, int64_t n, int64_t cols, uint64_t seq) const {
    return p_.x == x && p_.seq == seq && p_.n == n && p_.cols == cols;
  }
  struct Entry {
    const float* x = nullptr;
    int64_t n = 0, cols = 0;
    uint64_t seq = 0;
    uint8_t* xq = nullptr;
    Q8Numerics nq;
    HalfOut xh;
  };
  Entry p_;
  uint64_t q8_made_ = 0, q8_used_ = 0, half_taken_[2] = {0, 0};
};

}  // namespace troupe::cuda
