// On-device sampling: one block per logits row, the host Sampler's semantics
// (runtime/sample/sampler.cpp) without sorting the vocabulary.
//
// Candidates are ordered by a 64-bit key: the logit's order-preserving bits above the
// complement of the token id, so a larger key is a larger logit, ties by the smaller id --
// the host's order. Top-k is the k-th largest key, found by an 8-pass radix select with
// integer histograms. The head of the order (at most kHead keys) is gathered into shared
// memory, sorted, and walked by one thread in the host's order and with the host's double
// accumulation: min-p, top-p and the draw stop there for all but flat distributions. A walk
// that runs past the head continues in the tail by bisection over the key space, each probe a
// deterministic block reduction of the mass at or above it. Every reduction has a fixed
// order (no float atomics), so a row's token depends on its logits and parameters alone.
//
// tests/kernels/sample_kernel_emu_test.cpp also runs this kernel's source on the CPU
// (tests/kernels/cuda_emulation.h, TROUPE_CUDA_EMULATION), so its logic is checked against
// the host sampler on machines without a GPU.
#include <cfloat>
#include <cmath>

#ifndef TROUPE_CUDA_EMULATION
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#endif
#include "kernels/philox.h"
#include "kernels/sample_params.h"

namespace troupe::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kHead = 2048;

// NaN counts as -inf, as on the host.
__device__ __forceinline__ float clean(float x) { return isnan(x) ? -INFINITY : x; }

__device__ __forceinline__ uint64_t key_of(float x, int32_t id) {
  uint32_t b = __float_as_uint(x);
  if ((b & 0x7FFFFFFFu) == 0) b = 0;  // -0 and +0 compare equal on the host: one key
  const uint32_t ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(ord) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t id_of(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

struct Shared {
  uint64_t head[kHead];
  double head_p[kHead];
  uint32_t hist[256];
  double red_d[kWarps];
  uint64_t red_k[kWarps];
  long long red_i[kWarps];
  uint64_t bcast_key;
  int32_t bcast_int[4];
  double bcast_d[4];
  int32_t head_count;
};

// Block reductions in a fixed order; every thread gets the result.
__device__ double block_sum(double v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    double w = sh.red_d[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) sh.red_d[0] = w;
  }
  __syncthreads();
  return sh.red_d[0];
}
__device__ long long block_count(long long v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_i[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    long long w = sh.red_i[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (threadIdx.x == 0) sh.red_i[0] = w;
  }
  __syncthreads();
  return sh.red_i[0];
}
// max (is_max) or min of 64-bit keys.
__device__ uint64_t block_key(uint64_t v, bool is_max, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? (u > v ? u : v) : (u < v ? u : v);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_k[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    uint64_t w = sh.red_k[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t u = __shfl_xor_sync(0xffffffffu, w, o);
      w = is_max ? (u > w ? u : w) : (u < w ? u : w);
    }
    if (threadIdx.x == 0) sh.red_k[0] = w;
  }
  __syncthreads();
  return sh.red_k[0];
}

// The m-th largest key of the row (1 <= m <= vocab; keys are unique).
__device__ uint64_t select_kth(const float* l, int32_t vocab, int64_t m, Shared& sh) {
  uint64_t prefix = 0, mask = 0;
  int64_t remaining = m;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.hist[d] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint64_t k = key_of(clean(l[i]), i);
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t above = 0;
      int digit = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + sh.hist[d] >= remaining) {
          digit = d;
          break;
        }
        above += sh.hist[d];
      }
      sh.bcast_int[0] = digit;
      sh.bcast_d[0] = static_cast<double>(remaining - above);
    }
    __syncthreads();
    prefix |= static_cast<uint64_t>(sh.bcast_int[0]) << shift;
    mask |= uint64_t{0xFF} << shift;
    remaining = static_cast<int64_t>(sh.bcast_d[0]);
    __syncthreads();
  }
  return prefix;
}

// The tail: keys in [lo, hi) that pass min-p (p >= cut) when use_cut.
struct Tail {
  uint64_t lo, hi;
  bool use_cut;
  double cut;
};

struct Row {
  const float* l;
  int32_t vocab;
  float top;
  double inv_t, sum;
  // The host's weight: float exp of the float-rounded scaled difference, as a double.
  __device__ double prob(float x) const {
    return static_cast<double>(expf(static_cast<float>(static_cast<double>(x - top) * inv_t))) / sum;
  }
};

// Mass (sum of probabilities) and count of the tail's keys at or above `from`.
__device__ void tail_mass(const Row& r, const Tail& t, uint64_t from, Shared& sh, double* mass, long long* count) {
  double m = 0;
  long long c = 0;
  for (int32_t i = threadIdx.x; i < r.vocab; i += kThreads) {
    const float x = clean(r.l[i]);
    const uint64_t k = key_of(x, i);
    if (k < t.lo || k >= t.hi || k < from) continue;
    const double p = r.prob(x);
    if (t.use_cut && !(p >= t.cut)) continue;
    m += p;
    ++c;
  }
  *mass = block_sum(m, sh);
  if (count) *count = block_count(c, sh);
}

// The largest key k in the tail with base + mass(keys >= k) reaching target (>= target, or
// > target when strict); the caller has checked that the whole tail reaches it.
__device__ uint64_t tail_bisect(const Row& r, const Tail& t, double base, double target, bool strict, Shared& sh) {
  uint64_t lo = t.lo, hi = t.hi;  // lo reaches the target, hi does not
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    double m;
    tail_mass(r, t, mid, sh, &m, nullptr);
    const double f = base + m;
    if (strict ? f > target : f >= target)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int32_t vocab, const DeviceSampleParams* params, int32_t* tokens,
                  float* logprobs) {
  __shared__ Shared sh;
  const DeviceSampleParams P = params[blockIdx.x];
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * vocab;

  // The best key: the greedy token, and the maximum for the softmax.
  uint64_t best = 0;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const uint64_t k = key_of(clean(l[i]), i);
    best = k > best ? k : best;
  }
  best = block_key(best, true, sh);
  const float top = clean(l[id_of(best)]);

  float log_z = 0;
  if (P.want_logprob) {
    double z = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) z += expf(clean(l[i]) - top);
    z = block_sum(z, sh);
    log_z = top + static_cast<float>(log(z));
  }

  int32_t chosen = id_of(best);
  if (P.temperature != 0.0f) {
    Row r{l, vocab, top, 1.0 / static_cast<double>(P.temperature), 1.0};
    const int64_t k0 = P.top_k > 0 && P.top_k < vocab ? P.top_k : vocab;
    const uint64_t kth = k0 < vocab ? select_kth(l, vocab, k0, sh) : 0;
    // The normaliser over the candidates (keys >= kth).
    double s = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float x = clean(l[i]);
      if (key_of(x, i) >= kth) s += r.prob(x);  // sum is 1 here: the weight itself
    }
    r.sum = block_sum(s, sh);
    // The head: the best h candidates, sorted, with their probabilities.
    const int32_t h = static_cast<int32_t>(k0 < kHead ? k0 : kHead);
    const uint64_t head_lo = h == k0 ? kth : select_kth(l, vocab, h, sh);
    int32_t hp = 1;
    while (hp < h) hp *= 2;
    for (int j = threadIdx.x; j < hp; j += kThreads) sh.head[j] = 0;
    if (threadIdx.x == 0) sh.head_count = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint64_t k = key_of(clean(l[i]), i);
      if (k >= head_lo) {
        const int slot = atomicAdd(&sh.head_count, 1);
        if (slot < kHead) sh.head[slot] = k;
      }
    }
    __syncthreads();
    for (int size = 2; size <= hp; size <<= 1) {  // bitonic sort, descending
      for (int stride = size / 2; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < hp; i += kThreads) {
          const int j = i ^ stride;
          if (j > i) {
            const uint64_t a = sh.head[i], b = sh.head[j];
            if ((i & size) == 0 ? a < b : a > b) {
              sh.head[i] = b;
              sh.head[j] = a;
            }
          }
        }
        __syncthreads();
      }
    }
    for (int j = threadIdx.x; j < h; j += kThreads) sh.head_p[j] = r.prob(clean(l[id_of(sh.head[j])]));
    __syncthreads();

    // min-p: the candidates with p >= p(best) * min_p (at least one).
    int64_t k = k0;
    const bool use_cut = P.min_p > 0;
    const double cut = sh.head_p[0] * static_cast<double>(P.min_p);
    Tail tail{kth, head_lo, use_cut, cut};
    if (use_cut) {
      if (threadIdx.x == 0) {
        int32_t keep = 1;
        while (keep < h && sh.head_p[keep] >= cut) ++keep;
        sh.bcast_int[1] = keep;
      }
      __syncthreads();
      const int32_t keep = sh.bcast_int[1];
      __syncthreads();  // read by all before thread 0 writes it again
      k = keep;
      if (keep == h && h < k0) {
        double m;
        long long c;
        tail_mass(r, tail, tail.lo, sh, &m, &c);
        k = h + c;
      }
    }
    // top-p: the shortest prefix whose mass reaches top_p.
    if (P.top_p < 1.0f) {
      if (threadIdx.x == 0) {
        double c = 0;
        int32_t keep = 0, found = 0;
        const int32_t lim = static_cast<int32_t>(k < h ? k : h);
        while (keep < lim) {
          c += sh.head_p[keep++];
          if (c >= static_cast<double>(P.top_p)) {
            found = 1;
            break;
          }
        }
        sh.bcast_int[1] = keep;
        sh.bcast_int[2] = found;
        sh.bcast_d[1] = c;
      }
      __syncthreads();
      const int32_t keep = sh.bcast_int[1];
      const bool found = sh.bcast_int[2] != 0;
      const double c_head = sh.bcast_d[1];
      __syncthreads();
      if (found) {
        k = keep;
      } else if (k > h) {
        double m;
        tail_mass(r, tail, tail.lo, sh, &m, nullptr);
        if (c_head + m >= static_cast<double>(P.top_p)) {
          tail.lo = tail_bisect(r, tail, c_head, static_cast<double>(P.top_p), false, sh);
          long long c;
          tail_mass(r, tail, tail.lo, sh, &m, &c);
          k = h + c;
        }
      }
      if (k < 1) k = 1;
    }
    // The kept mass (1 when nothing was cut) and the draw over it.
    const int32_t head_kept = static_cast<int32_t>(k < h ? k : h);
    double tail_total = 0;
    if (k > h && k != k0) tail_mass(r, tail, tail.lo, sh, &tail_total, nullptr);
    if (threadIdx.x == 0) {
      double total = 1.0;
      if (k != k0) {
        total = 0;
        for (int32_t i = 0; i < head_kept; ++i) total += sh.head_p[i];
        total += tail_total;
      }
      const double u = philox_uniform(P.seed, P.counter) * total;
      double acc = 0;
      int32_t pick = -1;
      for (int32_t i = 0; i < head_kept; ++i) {
        acc += sh.head_p[i];
        if (u < acc) {
          pick = i;
          break;
        }
      }
      sh.bcast_int[1] = pick;
      sh.bcast_d[1] = acc;
      sh.bcast_d[2] = u;
    }
    __syncthreads();
    const int32_t pick = sh.bcast_int[1];
    const double acc_head = sh.bcast_d[1], u = sh.bcast_d[2];
    __syncthreads();
    if (pick >= 0) {
      chosen = id_of(sh.head[pick]);
    } else {
      bool done = false;
      if (k > h) {
        double m;
        tail_mass(r, tail, tail.lo, sh, &m, nullptr);
        if (acc_head + m > u) {
          chosen = id_of(tail_bisect(r, tail, acc_head, u, true, sh));
          done = true;
        } else {
          // Rounding left u past the last share: the last kept token with any weight.
          uint64_t least = ~uint64_t{0};
          for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
            const float x = clean(l[i]);
            const uint64_t kk = key_of(x, i);
            if (kk < tail.lo || kk >= tail.hi) continue;
            const double p = r.prob(x);
            if ((tail.use_cut && !(p >= tail.cut)) || !(p > 0)) continue;
            least = kk < least ? kk : least;
          }
          least = block_key(least, false, sh);
          if (least != ~uint64_t{0}) {
            chosen = id_of(least);
            done = true;
          }
        }
      }
      if (!done) {
        int32_t i = head_kept - 1;
        while (i > 0 && !(sh.head_p[i] > 0)) --i;
        chosen = id_of(sh.head[i]);
      }
    }
  }
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = chosen;
    logprobs[blockIdx.x] = P.want_logprob ? clean(l[chosen]) - log_z : 0.0f;
  }
}

}  // namespace

#ifndef TROUPE_CUDA_EMULATION
cudaError_t sample(const float* logits, int64_t n, int64_t vocab, const DeviceSampleParams* params, int32_t* tokens,
                   float* logprobs, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, static_cast<int32_t>(vocab), params, tokens,
                                                                   logprobs);
  return cudaGetLastError();
}
#endif

}  // namespace troupe::cuda
