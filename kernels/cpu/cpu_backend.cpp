// The CPU backend: SIMD kernels with runtime dispatch, parallel over a spin/sleep pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed.h"
#include "kernels/fp16.h"

namespace troupe {
namespace {

using cpu::PackedWeight;

class CpuWeight final : public Weight {
 public:
  PackedWeight packed;
};

class CpuKvCache final : public KvCache {
 public:
  explicit CpuKvCache(const KvCacheShape& s) : shape_(s) {}
  const KvCacheShape& shape() const override { return shape_; }
  KvCacheShape shape_;
  size_t layer_elems = 0;  // num_blocks * block_size * num_kv_heads * head_dim
  // [num_layers, layer_elems] f16, on transparent huge pages: a serving step reads blocks
  // scattered over the whole pool, and with 4 KiB pages nearly every block costs TLB misses.
  struct Halves {
    cpu::AlignedBytes mem;
    uint16_t* data() const { return reinterpret_cast<uint16_t*>(mem.ptr.get()); }
  } k, v;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : pool_(threads), isa_(cpu::detect_isa()) {
    scratch_.resize(static_cast<size_t>(pool_.size()));
  }
  std::string name() const override {
    return std::string("cpu(") + cpu::isa_name(isa_) + ", " + std::to_string(pool_.size()) + " threads)";
  }

  Result<std::unique_ptr<Weight>> make_weight(DType type, int64_t cols,
                                              const std::vector<std::pair<const void*, int64_t>>& parts) override {
    auto w = std::make_unique<CpuWeight>();
    auto packed = parts.size() == 1 ? cpu::pack_weight(type, parts[0].second, cols, parts[0].first)
                                    : cpu::pack_concat(type, cols, parts);
    if (!packed) return packed.error();
    w->packed = std::move(*packed);
    w->type = type;
    w->rows = w->packed.rows;
    w->cols = cols;
    return std::unique_ptr<Weight>(std::move(w));
  }

  Result<std::unique_ptr<KvCache>> make_kv_cache(const KvCacheShape& s) override {
    if (s.num_layers <= 0 || s.num_blocks <= 0 || s.block_size <= 0 || s.num_kv_heads <= 0 || s.head_dim <= 0)
      return make_error("invalid KV cache shape");
    auto c = std::make_unique<CpuKvCache>(s);
    c->layer_elems = static_cast<size_t>(s.num_blocks) * s.block_size * s.num_kv_heads * s.head_dim;
    const size_t bytes = c->layer_elems * s.num_layers * sizeof(uint16_t);
    for (auto* h : {&c->k, &c->v}) {
      h->mem = cpu::AlignedBytes::allocate(bytes);
      if (!h->mem.ptr)
        return make_error("out of memory allocating the KV cache (" + std::to_string(bytes >> 20) + " MiB)");
      std::memset(h->mem.ptr.get(), 0, bytes);
    }
    return std::unique_ptr<KvCache>(std::move(c));
  }

  float* alloc(size_t n) override {
    buffers_.emplace_back(n);
    return buffers_.back().data();
  }

  void begin_step(const StepInputs& step) override { step_ = step; }

  void embed(const Weight& table, const int32_t* ids, int64_t n, float* out) override {
    const auto& w = static_cast<const CpuWeight&>(table).packed;
    pool_.parallel_for(n, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) cpu::unpack_row(w, ids[i], out + i * w.cols);
    });
  }

  void rms_norm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out,
                const Weight* /*next*/ = nullptr) override {
    pool_.parallel_for(n, [&](int64_t a, int64_t b) { cpu::rms_norm_rows(x, w, eps, a, b, dim, out); });
  }

  void matmul(const Weight& w, const float* x, int64_t n, float* y, int64_t ldy) override {
    const auto& p = static_cast<const CpuWeight&>(w).packed;
    if (ldy == p.rows) {
      cpu::matmul(p, x, n, y, pool_, scratch_[0], isa_);
      return;
    }
    // Strided output: compute contiguously, then scatter rows.
    tmp_.resize(static_cast<size_t>(n * p.rows));
    cpu::matmul(p, x, n, tmp_.data(), pool_, scratch_[0], isa_);
    for (int64_t t = 0; t < n; ++t) std::memcpy(y + t * ldy, tmp_.data() + t * p.rows, p.rows * sizeof(float));
  }

  bool groups_matmuls() const override { return true; }
  void matmul_group(const MatmulJob* jobs, int64_t count) override {
    group_.resize(static_cast<size_t>(count));
    for (int64_t j = 0; j < count; ++j)
      group_[j] = {&static_cast<const CpuWeight&>(*jobs[j].w).packed, jobs[j].x, jobs[j].n, jobs[j].y, jobs[j].ldy};
    if (!cpu::can_group(group_.data(), count)) {
      Backend::matmul_group(jobs, count);
      return;
    }
    cpu::matmul_group(group_.data(), count, pool_, scratch_[0], isa_);
  }

  void add_bias(float* y, int64_t ld, const float* bias, int64_t n, int64_t dim) override {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < dim; ++j) y[t * ld + j] += bias[j];
  }

  void rope(float* x, int64_t ld, int64_t n, int64_t num_heads, int64_t head_dim, const float* cos_sin,
            RopeKind kind) override {
    const auto style = kind == RopeKind::Neox ? cpu::RopeStyle::Neox : cpu::RopeStyle::Interleaved;
    pool_.parallel_for(n,
                       [&](int64_t a, int64_t b) { cpu::rope_rows(x, ld, a, b, num_heads, head_dim, cos_sin, style); });
  }

  void kv_write(KvCache& cache, int32_t layer, const float* k, const float* v, int64_t ld) override {
    auto& c = static_cast<CpuKvCache&>(cache);
    const int64_t row = static_cast<int64_t>(c.shape_.num_kv_heads) * c.shape_.head_dim;
    uint16_t* kb = c.k.data() + c.layer_elems * layer;
    uint16_t* vb = c.v.data() + c.layer_elems * layer;
    for (int32_t t = 0; t < step_.num_tokens; ++t) {
      const int64_t slot = step_.slot_mapping[t];
      cpu::f32_to_f16_kv_row(k + t * ld, kb + slot * row, row);
      cpu::f32_to_f16_kv_row(v + t * ld, vb + slot * row, row);
    }
  }

  void attention(KvCache& cache, int32_t layer, const float* q, int64_t ld_q, int32_t num_heads, float scale,
                 float* out, const Weight* /*next*/ = nullptr) override {
    auto& c = static_cast<CpuKvCache&>(cache);
    const int32_t nkv = c.shape_.num_kv_heads, hd = c.shape_.head_dim, bs = c.shape_.block_size;
    const int32_t group = num_heads / nkv;
    const int64_t row = static_cast<int64_t>(nkv) * hd;
    const uint16_t* kb = c.k.data() + c.layer_elems * layer;
    const uint16_t* vb = c.v.data() + c.layer_elems * layer;
    // Tasks: (sequence, tile of up to 4 consecutive query tokens), its KV heads one after
    // another: a cache row holds every KV head of a position, and the first head's pass
    // prefetches whole rows, which the next heads then find in the core's L2 (the cache of a
    // serving step is far out of the CPU caches; one task per head read a third of each row).
    // Fewer such tasks than threads (one decoding sequence): one task per KV head instead.
    constexpr int32_t kTile = 4;
    int64_t tiles = 0;
    for (int32_t s = 0; s < step_.num_seqs; ++s)
      tiles += (step_.query_start[s + 1] - step_.query_start[s] + kTile - 1) / kTile;
    const bool per_head = tiles < pool_.size() && nkv > 1;
    tasks_.clear();
    for (int32_t s = 0; s < step_.num_seqs; ++s)
      for (int32_t t = step_.query_start[s]; t < step_.query_start[s + 1]; t += kTile)
        for (int32_t h = per_head ? 0 : -1; h < (per_head ? nkv : 0); ++h)
          tasks_.push_back({s, t, std::min(kTile, step_.query_start[s + 1] - t), h});
    // Later query tiles attend to more positions: hand out the costliest first.
    std::reverse(tasks_.begin(), tasks_.end());
    pool_.parallel_for_dynamic(static_cast<int64_t>(tasks_.size()), [&](int64_t i) {
      {
        const Task& tk = tasks_[static_cast<size_t>(i)];
        cpu::AttentionTile at;
        at.k = kb;
        at.v = vb;
        at.row = row;
        at.head_dim = hd;
        at.block_size = bs;
        at.group = group;
        at.block_table = step_.block_tables + static_cast<int64_t>(tk.seq) * step_.max_blocks_per_seq;
        at.scale = scale;
        at.q = q + tk.first * ld_q;
        at.ld_q = ld_q;
        at.positions = step_.positions + tk.first;
        at.num = tk.count;
        at.out = out + static_cast<int64_t>(tk.first) * num_heads * hd;
        at.ld_out = static_cast<int64_t>(num_heads) * hd;
        for (int32_t h = tk.head < 0 ? 0 : tk.head; h < (tk.head < 0 ? nkv : tk.head + 1); ++h) {
          at.kv_head = h;
          at.prefetch_heads = tk.head < 0 ? nkv - h : 1;  // whole rows when the heads follow here
          cpu::attention_tile(at);
        }
      }
    });
  }

  void silu_mul(const float* gate_up, int64_t n, int64_t ffn, float* out, const Weight* /*next*/ = nullptr) override {
    pool_.parallel_for(n, [&](int64_t a, int64_t b) { cpu::silu_mul_rows(gate_up, a, b, ffn, out); });
  }

  void add(float* x, const float* y, int64_t count) override { cpu::add_range(x, y, 0, count); }
  // Each thread adds and normalizes its own rows (the same bits as add, then rms_norm).
  void add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t n, int64_t dim, float* out,
                    const Weight* /*next*/ = nullptr) override {
    pool_.parallel_for(n, [&](int64_t a, int64_t b) {
      cpu::add_range(x, y, a * dim, b * dim);
      cpu::rms_norm_rows(x, w, eps, a, b, dim, out);
    });
  }

  void idle() override { pool_.park(); }
  void gather_rows(const float* x, int64_t dim, const int32_t* rows, int64_t n, float* out) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out + i * dim, x + static_cast<int64_t>(rows[i]) * dim, dim * sizeof(float));
  }

 private:
  cpu::ThreadPool pool_;
  cpu::Isa isa_;
  std::vector<cpu::MatmulScratch> scratch_;
  std::vector<cpu::GroupJob> group_;
  std::vector<std::vector<float>> buffers_;
  std::vector<float> tmp_;
  StepInputs step_{};
  struct Task {
    int32_t seq, first, count;
    int32_t head;  // -1: every KV head of the sequence, in order
  };
  std::vector<Task> tasks_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts) {
  int n = opts.num_threads > 0 ? opts.num_threads : static_cast<int>(std::thread::hardware_concurrency());
  return std::make_unique<CpuBackend>(std::max(1, n));
}

}  // namespace troupe
