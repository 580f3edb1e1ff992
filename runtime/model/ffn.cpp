#include "runtime/model/ffn.h"

#include <algorithm>
#include <vector>

namespace troupe {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Result<const TensorRef*> find_matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols) {
  const TensorRef* t = src.find(name);
  if (!t) return make_error("missing tensor '" + name + "'");
  if (t->shape.size() != 2 || t->shape[0] != cols || t->shape[1] != rows)
    return make_error("tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected [" + std::to_string(cols) +
                      ", " + std::to_string(rows) + "]");
  return t;
}

namespace {

// One matrix of a SwiGLU block as the backend needs it: type, data and shape checked.
struct Part {
  DType type = DType::F32;
  const void* data = nullptr;
};

Result<Part> dense_part(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols) {
  auto t = find_matrix(src, name, rows, cols);
  if (!t) return t.error();
  return Part{(*t)->type, (*t)->data};
}

// Expert e's matrix of `base` (ffn_gate, ffn_up, ffn_down): a slice of the stacked tensor
// blk.N.<base>_exps.weight (GGUF shape [cols, rows, experts]) or blk.N.<base>.<e>.weight.
Result<Part> expert_part(const WeightSource& src, const std::string& p, const std::string& base, int32_t e,
                         int32_t experts, int64_t rows, int64_t cols) {
  const std::string stacked = p + base + "_exps.weight";
  if (const TensorRef* t = src.find(stacked)) {
    if (t->shape.size() != 3 || t->shape[0] != cols || t->shape[1] != rows || t->shape[2] != experts)
      return make_error("tensor '" + stacked + "' has shape " + shape_str(t->shape) + ", expected [" +
                        std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(experts) + "]");
    const auto rb = row_bytes(t->type, static_cast<uint64_t>(cols));
    if (!rb) return make_error("tensor '" + stacked + "': rows of " + std::to_string(cols) + " do not fit its blocks");
    const uint64_t per_expert = *rb * static_cast<uint64_t>(rows);
    if (t->nbytes < per_expert * static_cast<uint64_t>(experts))
      return make_error("tensor '" + stacked + "' holds fewer bytes than its shape needs");
    return Part{t->type, static_cast<const uint8_t*>(t->data) + per_expert * static_cast<uint64_t>(e)};
  }
  const std::string one = p + base + "." + std::to_string(e) + ".weight";
  if (!src.find(one)) return make_error("missing tensor '" + stacked + "' (or per-expert '" + one + "')");
  return dense_part(src, one, rows, cols);
}

// A SwiGLU block from its three matrices: gate and up fused into one weight when they share a type.
Status make_ffn(Backend& backend, Result<Part> g, Result<Part> u, Result<Part> d, int64_t H, int64_t F,
                const std::string& name, Ffn& f) {
  for (auto* r : {&g, &u, &d})
    if (!*r) return r->error();
  auto wrap = [&](Result<std::unique_ptr<Weight>> r, const std::string& what, std::unique_ptr<Weight>& out) -> Status {
    if (!r) return make_error(name + what + ": " + r.error().message);
    out = std::move(*r);
    return {};
  };
  if (g->type == u->type) {
    TROUPE_TRY(wrap(backend.make_weight(g->type, H, {{g->data, F}, {u->data, F}}), "gate_up", f.gate_up));
  } else {
    TROUPE_TRY(wrap(backend.make_weight(g->type, H, {{g->data, F}}), "gate", f.gate));
    TROUPE_TRY(wrap(backend.make_weight(u->type, H, {{u->data, F}}), "up", f.up));
  }
  return wrap(backend.make_weight(d->type, F, {{d->data, H}}), "down", f.down);
}

}  // namespace

Status build_expert_ffn(Backend& backend, const WeightSource& src, int32_t layer, int32_t e, int32_t num_experts,
                        int64_t H, int64_t F, Ffn& out) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  return make_ffn(backend, expert_part(src, p, "ffn_gate", e, num_experts, F, H),
                  expert_part(src, p, "ffn_up", e, num_experts, F, H),
                  expert_part(src, p, "ffn_down", e, num_experts, H, F), H, F, p + "expert " + std::to_string(e) + " ",
                  out);
}

Status build_dense_ffn(Backend& backend, const WeightSource& src, const std::string& gate, const std::string& up,
                       const std::string& down, int64_t H, int64_t F, const std::string& what, Ffn& out) {
  return make_ffn(backend, dense_part(src, gate, F, H), dense_part(src, up, F, H), dense_part(src, down, H, F), H, F,
                  what, out);
}

void run_ffn(Backend& be, const Ffn& f, const float* x, int64_t n, int64_t ffn, int64_t hidden, float* gu, float* act,
             float* y) {
  if (f.gate_up) {
    be.matmul_silu(*f.gate_up, x, n, ffn, gu, act, f.down.get());
  } else {
    be.matmul(*f.gate, x, n, gu, 2 * ffn);
    be.matmul(*f.up, x, n, gu + ffn, 2 * ffn);
    be.silu_mul(gu, n, ffn, act, f.down.get());
  }
  be.matmul(*f.down, act, n, y, hidden);
}

void run_ffn_group(Backend& be, const Ffn* const* ffns, const int64_t* counts, int64_t count, const float* x,
                   int64_t ffn, int64_t hidden, float* gu, float* act, float* y) {
  if (!be.groups_matmuls()) {
    int64_t off = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (counts[i] > 0) run_ffn(be, *ffns[i], x + off * hidden, counts[i], ffn, hidden, gu, act, y + off * hidden);
      off += counts[i];
    }
    return;
  }
  thread_local std::vector<MatmulJob> jobs;  // (no allocation per layer once grown)
  jobs.clear();
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t off = total;
    total += std::max<int64_t>(0, counts[i]);
    if (counts[i] <= 0) continue;
    const Ffn& f = *ffns[i];
    const float* xi = x + off * hidden;
    float* gi = gu + off * 2 * ffn;
    if (f.gate_up) {
      jobs.push_back({f.gate_up.get(), xi, counts[i], gi, 2 * ffn});
    } else {
      jobs.push_back({f.gate.get(), xi, counts[i], gi, 2 * ffn});
      jobs.push_back({f.up.get(), xi, counts[i], gi + ffn, 2 * ffn});
    }
  }
  if (total == 0) return;
  be.matmul_group(jobs.data(), static_cast<int64_t>(jobs.size()));
  be.silu_mul(gu, total, ffn, act);  // row by row: the bits of each block's own call
  jobs.clear();
  for (int64_t i = 0, off = 0; i < count; off += std::max<int64_t>(0, counts[i]), ++i)
    if (counts[i] > 0) jobs.push_back({ffns[i]->down.get(), act + off * ffn, counts[i], y + off * hidden, hidden});
  be.matmul_group(jobs.data(), static_cast<int64_t>(jobs.size()));
}

}  // namespace troupe
