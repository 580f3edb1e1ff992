#include "kernels/cpu/matmul.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/quant_ref.h"

namespace troupe::cpu {

const MatmulKernels& scalar_kernels();
const MatmulKernels& avx2_kernels();
const MatmulKernels& avx512_kernels();

namespace {
bool os_saves_zmm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xE6) == 0xE6;
}
bool os_saves_ymm() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6) == 0x6;
}
}  // namespace

Isa detect_isa() {
  static const Isa isa = [] {
    unsigned a, b, c, d;
    Isa best = Isa::Scalar;
    bool fma = false, f16c = false;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
      fma = c & (1u << 12);
      f16c = c & (1u << 29);
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      const bool avx2 = b & (1u << 5);
      const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
      const bool avx512dq = b & (1u << 17), vnni = c & (1u << 11);
      if (avx2 && fma && f16c && os_saves_ymm()) best = Isa::Avx2;
      if (best == Isa::Avx2 && avx512f && avx512bw && avx512vl && avx512dq && vnni && os_saves_zmm())
        best = Isa::Avx512;
    }
    if (const char* env = std::getenv("TROUPE_CPU_ISA")) {
      if (!std::strcmp(env, "scalar"))
        best = Isa::Scalar;
      else if (!std::strcmp(env, "avx2") && best == Isa::Avx512)
        best = Isa::Avx2;
    }
    return best;
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512-vnni";
  }
  return "?";
}

void* thread_scratch(int slot, size_t bytes) {
  struct Buffers {
    AlignedBytes b[4];
  };
  thread_local Buffers bufs;
  if (slot < 0 || slot >= 4) return nullptr;
  AlignedBytes& a = bufs.b[slot];
  if (a.size < bytes) {
    a = AlignedBytes::allocate(std::max<size_t>(bytes, 2 * a.size));
    if (!a.ptr) throw std::bad_alloc();  // the worker turns this into a failed step
  }
  return a.ptr.get();
}

const MatmulKernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return avx512_kernels();
    case Isa::Avx2:
      return avx2_kernels();
    default:
      return scalar_kernels();
  }
}

void matmul(const PackedWeight& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, MatmulScratch& scratch,
            Isa isa) {
  const MatmulKernels& k = kernels_for(isa);
  if (n_tokens <= 0) return;
  // Rows per task: small enough to balance, large enough to amortise activation reloads.
  constexpr int64_t kRowChunk = 16;
  const int64_t num_row_chunks = (w.rows + kRowChunk - 1) / kRowChunk;
  // Batches (compute-bound) take row chunks a few at a time from a shared counter (at least
  // two tasks per thread), so a thread that loses its core to another process does not hold
  // up the whole matmul; decode (memory-bound) takes one contiguous 1/T share per task,
  // which streams faster (a thread that finishes early may take a second share).
  const int64_t threads = pool.size();
  // (One pass: the tokens fit one tile, so each weight is read once.)
  const bool is_rq = w.kind == PackKind::RQ4 || w.kind == PackKind::RQ8;
  const int64_t one_pass = is_rq && n_tokens <= kStreamTokens ? k.rq_stream_tile : kMaxTile;
  const int64_t chunks_per_task = n_tokens > one_pass ? std::clamp<int64_t>(num_row_chunks / (2 * threads), 1, 4)
                                                      : (num_row_chunks + threads - 1) / threads;
  switch (w.kind) {
    case PackKind::RQ4:
    case PackKind::RQ8: {
      ActQ& a = scratch.act;
      a.num_pairs = w.num_pairs;
      const size_t need_q = static_cast<size_t>(n_tokens * w.num_pairs * 64);
      if (a.q.size() < need_q) a.q.resize(need_q);
      if (a.scales.size() < static_cast<size_t>(n_tokens * w.num_pairs * 4))
        a.scales.resize(static_cast<size_t>(n_tokens * w.num_pairs * 4));
      const ActQuantMode mode = ActQuantMode::for_weight(w.source_type);
      pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1) { quantize_activations(x, w.cols, a, t0, t1, mode); });
      const bool stream = n_tokens <= kStreamTokens;
      const auto rq = stream ? k.rq_stream : k.rq;  // (the same bits)
      const int64_t tile = stream ? k.rq_stream_tile : kMaxTile;
      pool.parallel_for_chunks(num_row_chunks, chunks_per_task, [&](int64_t c0, int64_t c1) {
        const int64_t r0 = c0 * kRowChunk, r1 = std::min(w.rows, c1 * kRowChunk);
        for (int64_t rr = r0; rr < r1; rr += kRowChunk) {
          const int64_t re = std::min(r1, rr + kRowChunk);
          for (int64_t t = 0; t < n_tokens; t += tile) {
            const int nt = static_cast<int>(std::min<int64_t>(tile, n_tokens - t));
            rq(w.rq_layout, w.data, w.row_stride, w.num_pairs, a.q.data() + t * w.num_pairs * 64,
               a.scales.data() + t * w.num_pairs * 4, nt, rr, re, y + t * w.rows, w.rows);
          }
        }
      });
      return;
    }
    case PackKind::Q6K: {
      const int64_t nb = w.cols / kQKK;
      auto& xa = scratch.act_k;
      if (xa.size() < static_cast<size_t>(n_tokens * nb)) xa.resize(static_cast<size_t>(n_tokens * nb));
      pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) quantize_row_ref(DType::Q8_K, x + t * w.cols, xa.data() + t * nb, w.cols);
      });
      pool.parallel_for_chunks(num_row_chunks, chunks_per_task, [&](int64_t c0, int64_t c1) {
        const int64_t r0 = c0 * kRowChunk, r1 = std::min(w.rows, c1 * kRowChunk);
        for (int64_t t = 0; t < n_tokens; t += kMaxTile) {
          const int nt = static_cast<int>(std::min<int64_t>(kMaxTile, n_tokens - t));
          k.q6k(w.data, w.row_stride, nb, xa.data() + t * nb, nt, r0, r1, y + t * w.rows, w.rows);
        }
      });
      return;
    }
    default: {
      pool.parallel_for_chunks(num_row_chunks, chunks_per_task, [&](int64_t c0, int64_t c1) {
        const int64_t r0 = c0 * kRowChunk, r1 = std::min(w.rows, c1 * kRowChunk);
        for (int64_t rr = r0; rr < r1; rr += kRowChunk) {
          const int64_t re = std::min(r1, rr + kRowChunk);
          for (int64_t t = 0; t < n_tokens; t += kMaxTile) {
            const int nt = static_cast<int>(std::min<int64_t>(kMaxTile, n_tokens - t));
            k.flt(w.kind, w.data, w.row_stride, w.cols, x + t * w.cols, nt, rr, re, y + t * w.rows, w.rows);
          }
        }
      });
      return;
    }
  }
}

bool can_group(const GroupJob* jobs, int64_t count) {
  if (count <= 0) return false;
  const PackedWeight& w0 = *jobs[0].w;
  for (int64_t j = 0; j < count; ++j) {
    const PackedWeight& w = *jobs[j].w;
    if ((w.kind != PackKind::RQ4 && w.kind != PackKind::RQ8) || w.num_pairs != w0.num_pairs || w.cols != w0.cols ||
        w.source_type != w0.source_type || jobs[j].n < 0 || jobs[j].ldy < w.rows)
      return false;
  }
  return true;
}

void matmul_group(const GroupJob* jobs, int64_t count, ThreadPool& pool, MatmulScratch& scratch, Isa isa) {
  const MatmulKernels& k = kernels_for(isa);
  constexpr int64_t kRowChunk = 16;  // as matmul(): the same tiles, so the same bits
  auto& toks = scratch.group_tokens;
  auto& chunks = scratch.group_chunks;
  toks.assign(static_cast<size_t>(count + 1), 0);
  chunks.assign(static_cast<size_t>(count + 1), 0);
  for (int64_t j = 0; j < count; ++j) {
    toks[j + 1] = toks[j] + jobs[j].n;
    chunks[j + 1] = chunks[j] + (jobs[j].n > 0 ? (jobs[j].w->rows + kRowChunk - 1) / kRowChunk : 0);
  }
  const int64_t T = toks[count], C = chunks[count];
  if (T == 0) return;
  const PackedWeight& w0 = *jobs[0].w;
  ActQ& a = scratch.act;
  a.num_pairs = w0.num_pairs;
  const size_t need_q = static_cast<size_t>(T * w0.num_pairs * 64);
  if (a.q.size() < need_q) a.q.resize(need_q);
  if (a.scales.size() < static_cast<size_t>(T * w0.num_pairs * 4))
    a.scales.resize(static_cast<size_t>(T * w0.num_pairs * 4));
  const ActQuantMode mode = ActQuantMode::for_weight(w0.source_type);
  // Activations: global token t is job j's token t - toks[j].
  pool.parallel_for(T, [&](int64_t t0, int64_t t1) {
    int64_t j = std::upper_bound(toks.begin(), toks.end(), t0) - toks.begin() - 1;
    for (int64_t t = t0; t < t1; ++j) {
      const int64_t e = std::min(t1, toks[j + 1]);
      if (e > t) quantize_activations_into(jobs[j].x, w0.cols, a, t - toks[j], e - toks[j], t, mode);
      t = std::max(t, e);
    }
  });
  // (job, row chunk) tasks. As in matmul(): batches take a few at a time from a shared
  // counter; decode-sized jobs (memory-bound) one contiguous share per thread, which streams
  // the weights faster.
  int64_t most = 0;
  for (int64_t j = 0; j < count; ++j) most = std::max(most, jobs[j].n);
  const int64_t threads = pool.size();
  const int64_t per_task = most > kMaxTile ? std::clamp<int64_t>(C / (2 * threads), 1, 4) : (C + threads - 1) / threads;
  pool.parallel_for_chunks(C, per_task, [&](int64_t c0, int64_t c1) {
    int64_t j = std::upper_bound(chunks.begin(), chunks.end(), c0) - chunks.begin() - 1;
    for (int64_t c = c0; c < c1; ++c) {
      while (c >= chunks[j + 1]) ++j;
      const GroupJob& g = jobs[j];
      const PackedWeight& w = *g.w;
      const int64_t rr = (c - chunks[j]) * kRowChunk, re = std::min(w.rows, rr + kRowChunk);
      for (int64_t t = 0; t < g.n; t += kMaxTile) {
        const int nt = static_cast<int>(std::min<int64_t>(kMaxTile, g.n - t));
        const int64_t gt = toks[j] + t;
        k.rq(w.rq_layout, w.data, w.row_stride, w.num_pairs, a.q.data() + gt * w.num_pairs * 64,
             a.scales.data() + gt * w.num_pairs * 4, nt, rr, re, g.y + t * g.ldy, g.ldy);
      }
    }
  });
}

}  // namespace troupe::cpu
