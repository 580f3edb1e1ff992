// SwiGLU blocks as the backend holds them, shared by the forward pass (runtime/model/model.h:
// dense layers, routed and shared experts) and by expert workers (expert_shard.h), which
// build and run the same routed experts from the same file so that their rows come out
// bit-identical wherever an expert runs.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "runtime/format/weights.h"

namespace troupe {

struct Ffn {                         // one SwiGLU block
  std::unique_ptr<Weight> gate_up;   // fused when gate and up share a type
  std::unique_ptr<Weight> gate, up;  // otherwise
  std::unique_ptr<Weight> down;
};

// Routed expert e of layer `layer` from `src`: a slice of the stacked tensors
// blk.N.ffn_{gate,up,down}_exps.weight (GGUF, as llama.cpp writes them) or the per-expert
// tensors blk.N.ffn_{gate,up,down}.E.weight (HF files); shapes checked against the config.
Status build_expert_ffn(Backend& backend, const WeightSource& src, int32_t layer, int32_t e, int32_t num_experts,
                        int64_t hidden, int64_t expert_ffn, Ffn& out);
// A dense block from blk.N.<gate>/<up>/<down> tensors named in full.
Status build_dense_ffn(Backend& backend, const WeightSource& src, const std::string& gate, const std::string& up,
                       const std::string& down, int64_t hidden, int64_t ffn, const std::string& what, Ffn& out);

// y [n, hidden] = down(silu(gate x) * up x) for x [n, hidden]; gu [n, 2 ffn] and act [n, ffn]
// are scratch on the backend. y may alias x.
void run_ffn(Backend& be, const Ffn& f, const float* x, int64_t n, int64_t ffn, int64_t hidden, float* gu, float* act,
             float* y);
// Several blocks over consecutive row groups (a MoE layer's experts, expert-major): block i
// over counts[i] rows of x, into the same rows of y. gu [sum counts, 2 ffn] and act [sum
// counts, ffn] are scratch. On a backend that groups_matmuls() each projection of every
// block runs in one matmul_group (one pass over the threads instead of one per expert);
// elsewhere the blocks run in turn. The bits are run_ffn()'s either way.
void run_ffn_group(Backend& be, const Ffn* const* ffns, const int64_t* counts, int64_t count, const float* x,
                   int64_t ffn, int64_t hidden, float* gu, float* act, float* y);

// "[a, b, c]" for error messages.
std::string shape_str(const std::vector<int64_t>& s);
// A 2-D tensor [rows, cols] (GGUF order: shape = {cols, rows}), or an error naming it.
Result<const TensorRef*> find_matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols);

}  // namespace troupe
