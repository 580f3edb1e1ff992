// The paged-attention kernels' source (kernels/cuda/attention.cu and the tensor-core
// attention_tc.cu and attention_mma.cu), run on the CPU through tests/kernels/cuda_emulation.h: prefill, a chunk
// in the middle of a sequence and a decode token over an f16 paged cache, GQA groups that
// fill the per-token kernel's four-head groups and ones that do not, contexts over several
// 256-key segments. The split-KV path (a block per segment, then the combine) must give the
// looped path's bits, and so must K staged in shared memory vs read directly; the
// tensor-core kernel must take exactly the tiles of one sequence,
// the per-token kernel the others (its bits unchanged), and so must the mma.sync kernel
// (its fragments, ldmatrix and cp.async as the emulation gives PTX's layouts and
// ordering); and every output must be within
// tolerance of a double reference (queries rounded to f16 as the kernels do).
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel sources use)
#include "kernels/cuda/attention.cu"
#include "kernels/cuda/attention_tc.cu"
#include "kernels/cuda/attention_mma.cu"
#include "kernels/fp16.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

using namespace troupe;

namespace {

struct Case {
  int nh, nkv, hd;
};

// A step over three sequences with their caches filled up to each token.
struct Fixture {
  static constexpr int bs = 16, num_blocks = 48, max_blocks = 40;
  Case c;
  int64_t row = 0, ldq = 0;
  int n = 0;
  std::vector<int32_t> tables, pos, seq;
  std::vector<__half> kc, vc;
  std::vector<float> q;
  cuda::DeviceStep st;

  Fixture(const Case& cs, const std::vector<int>& first, const std::vector<int>& count, std::mt19937& g) : c(cs) {
    row = int64_t{c.nkv} * c.hd;
    ldq = int64_t{c.nh + 2 * c.nkv} * c.hd;
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    tables.resize(first.size() * max_blocks);
    for (size_t s = 0; s < first.size(); ++s)
      for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = perm[(s * 13 + b) % num_blocks];
    // Sequences share some blocks here, which attention does not mind: it only reads.
    std::normal_distribution<float> nd(0.0f, 1.0f);
    kc.resize(static_cast<size_t>(num_blocks) * bs * row);
    vc.resize(kc.size());
    for (auto& h : kc) h = __float2half_rn(nd(g));
    for (auto& h : vc) h = __float2half_rn(nd(g));
    int max_ctx = 0;
    for (size_t s = 0; s < first.size(); ++s)
      for (int p = first[s]; p < first[s] + count[s]; ++p) {
        pos.push_back(p);
        seq.push_back(static_cast<int32_t>(s));
        max_ctx = std::max(max_ctx, p + 1);
      }
    n = static_cast<int>(pos.size());
    q.resize(static_cast<size_t>(n * ldq));
    for (auto& v : q) v = 2.0f * nd(g);
    st.num_tokens = n;
    st.num_seqs = static_cast<int32_t>(first.size());
    st.max_blocks_per_seq = max_blocks;
    st.positions = pos.data();
    st.token_seq = seq.data();
    st.block_tables = tables.data();
    st.max_context = max_ctx;
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(c.hd)); }
  cuda::TcArgs tc_args(float* out, float* partials = nullptr, int max_segments = 0) const {
    return cuda::TcArgs{st,        q.data(),  ldq, c.nh,     c.nkv,        bs, scale(),
                        kc.data(), vc.data(), out, partials, max_segments, {}};
  }
  cuda::MmaArgs mma_args(float* out, float* partials = nullptr, int max_segments = 0) const {
    return cuda::MmaArgs{st,        q.data(),  ldq, c.nh,     c.nkv,        bs, scale(),
                         kc.data(), vc.data(), out, partials, max_segments, {}};
  }
  cuda::Args args(bool skip_tc, uint8_t* xq = nullptr, cuda::Q8Numerics nq = {}) const {
    return cuda::Args{st, q.data(), ldq, c.nh, c.nkv, bs, scale(), kc.data(), vc.data(), skip_tc, xq, nq, {}};
  }
  // The largest |difference| from a double reference over tokens with want(t).
  template <typename Want>
  double worst(const std::vector<float>& out, Want want) const {
    const int group = c.nh / c.nkv, hd = c.hd;
    double w = 0;
    for (int t = 0; t < n; ++t) {
      if (!want(t)) continue;
      for (int h = 0; h < c.nh; ++h) {
        const int kvh = h / group;
        std::vector<double> qh(hd), sc(static_cast<size_t>(pos[t] + 1)), o(hd, 0.0);
        for (int d = 0; d < hd; ++d) qh[d] = __half2float(__float2half_rn(q[t * ldq + h * hd + d]));
        double mx = -1e300, z = 0;
        for (int p = 0; p <= pos[t]; ++p) {
          const int64_t slot = int64_t{tables[seq[t] * max_blocks + p / bs]} * bs + p % bs;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += qh[d] * __half2float(kc[slot * row + kvh * hd + d]);
          sc[p] = dot * scale();
          mx = std::max(mx, sc[p]);
        }
        for (int p = 0; p <= pos[t]; ++p) z += sc[p] = std::exp(sc[p] - mx);
        for (int p = 0; p <= pos[t]; ++p) {
          const int64_t slot = int64_t{tables[seq[t] * max_blocks + p / bs]} * bs + p % bs;
          for (int d = 0; d < hd; ++d) o[d] += sc[p] / z * __half2float(vc[slot * row + kvh * hd + d]);
        }
        for (int d = 0; d < hd; ++d)
          w = std::max(w, std::fabs(o[d] - out[(static_cast<size_t>(t) * c.nh + h) * hd + d]));
      }
    }
    return w;
  }
};

// quantize_q8()'s bytes for rows of x, through the quantizer's own per-warp step: one warp
// per 32-value block (what matmul_q8.cu's quantize_q8_kernel does).
__global__ void quantize_rows_kernel(const float* x, int64_t dim, uint8_t* out, cuda::Q8Numerics nq) {
  const int64_t b = threadIdx.x / 32, t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  cuda::quantize_q8_block(x[t * dim + b * 32 + lane], lane, b, dim / 32, out + t * cuda::q8_row_bytes(dim), nq);
}

// Whether every value of h is out's, rounded to f16 (or bf16) as to_half_rows rounds it.
bool halves_of(const std::vector<float>& out, const std::vector<uint16_t>& h, bool bf16) {
  size_t wrong = h.size() != out.size();
  for (size_t i = 0; i < h.size() && i < out.size(); ++i)
    wrong += h[i] != (bf16 ? f32_to_bf16(out[i]) : f32_to_f16(out[i]));
  return wrong == 0;
}

unsigned head_groups(const Case& c) {
  const int group = c.nh / c.nkv;
  return static_cast<unsigned>(c.nkv * ((group + cuda::kGroup - 1) / cuda::kGroup));
}

template <int DPL>
void check(const Case& c, std::mt19937& g) {
  Fixture f(c, {0, 300, 599}, {5, 3, 1}, g);  // prefill, a chunk, a decode token
  const int segs = cuda::attention_segments(f.st.max_context);
  std::vector<float> looped(static_cast<size_t>(f.n) * c.nh * c.hd, -1.0f), split(looped.size(), -2.0f);
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>, f.args(false),
                    looped.data());
  std::vector<float> partials(static_cast<size_t>(f.n) * c.nh * segs * (c.hd + 2), 0.0f);
  cuda_emu::launch3(f.n, head_groups(c), segs, cuda::kThreads, cuda::attention_split_kernel<DPL>, f.args(false), segs,
                    partials.data());
  cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<DPL>, f.args(false), segs,
                    static_cast<const float*>(partials.data()), split.data());
  CHECK(std::memcmp(looped.data(), split.data(), looped.size() * 4) == 0);
  // More segments than any token needs (attention_segments() rounds up): their blocks
  // return at once and the combine merges a token's own segments only, so the same bits;
  // partials no block writes are NaN, so reading one would show.
  {
    const int more = segs + 2;
    std::vector<float> wide(static_cast<size_t>(f.n) * c.nh * more * (c.hd + 2), std::nanf(""));
    std::vector<float> out(looped.size(), -3.0f);
    cuda_emu::launch3(f.n, head_groups(c), more, cuda::kThreads, cuda::attention_split_kernel<DPL>, f.args(false), more,
                      wide.data());
    cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<DPL>, f.args(false), more,
                      static_cast<const float*>(wide.data()), out.data());
    CHECK(std::memcmp(looped.data(), out.data(), looped.size() * 4) == 0);
  }
  // K rows staged in shared memory (heads up to 128 wide) or read directly: the same bits.
  std::vector<float> direct(looped.size(), -4.0f);
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL, false>, f.args(false),
                    direct.data());
  CHECK(std::memcmp(looped.data(), direct.data(), looped.size() * 4) == 0);
  const double w = f.worst(looped, [](int) { return true; });
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << c.hd << ": max |diff| from the double reference " << w);
  CHECK(w < 2e-3);
  // Asked to quantize the output for the O projection's int8 GEMV, both paths write the
  // bytes the quantizer writes from the output, and the output's bits are unchanged.
  const int64_t dim = int64_t{c.nh} * c.hd;
  const size_t qbytes = static_cast<size_t>(f.n) * cuda::q8_row_bytes(dim);
  for (const cuda::Q8Numerics nq :
       {cuda::q8_numerics(DType::Q4_0), cuda::q8_numerics(DType::Q4_1), cuda::q8_numerics(DType::Q6_K)}) {
    std::vector<uint8_t> want(qbytes, 0), xq_loop(qbytes, 0), xq_split(qbytes, 0);
    if (dim / 32 <= 32)  // (one block of dim threads, as the reference kernel wants)
      cuda_emu::launch(f.n, static_cast<unsigned>(dim), quantize_rows_kernel, static_cast<const float*>(looped.data()),
                       dim, want.data(), nq);
    std::vector<float> out_loop(looped.size(), -5.0f), out_split(looped.size(), -6.0f);
    cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>,
                      f.args(false, xq_loop.data(), nq), out_loop.data());
    cuda_emu::launch3(f.n, head_groups(c), segs, cuda::kThreads, cuda::attention_split_kernel<DPL>, f.args(false), segs,
                      partials.data());
    cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<DPL>,
                      f.args(false, xq_split.data(), nq), segs, static_cast<const float*>(partials.data()),
                      out_split.data());
    CHECK(std::memcmp(looped.data(), out_loop.data(), looped.size() * 4) == 0);
    CHECK(std::memcmp(looped.data(), out_split.data(), looped.size() * 4) == 0);
    CHECK(xq_loop == xq_split);
    if (dim / 32 <= 32) CHECK(xq_loop == want);
  }
  // Asked for a half copy for the O projection's cuBLAS matmul: both paths write the
  // output's values as to_half_rows rounds them, and the output's bits are unchanged.
  for (const bool bf16 : {false, true}) {
    std::vector<uint16_t> h_loop(looped.size(), 0xEEEE), h_split(looped.size(), 0xEEEE);
    std::vector<float> out_loop(looped.size(), -5.0f), out_split(looped.size(), -6.0f);
    auto half_args = [&](std::vector<uint16_t>& h) {
      cuda::Args a = f.args(false);
      a.xh = {h.data(), bf16};
      return a;
    };
    cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>, half_args(h_loop),
                      out_loop.data());
    cuda_emu::launch3(f.n, head_groups(c), segs, cuda::kThreads, cuda::attention_split_kernel<DPL>, f.args(false), segs,
                      partials.data());
    cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<DPL>, half_args(h_split), segs,
                      static_cast<const float*>(partials.data()), out_split.data());
    INFO((bf16 ? "bf16" : "f16"));
    CHECK(std::memcmp(looped.data(), out_loop.data(), looped.size() * 4) == 0);
    CHECK(std::memcmp(looped.data(), out_split.data(), looped.size() * 4) == 0);
    CHECK(halves_of(looped, h_loop, bf16));
    CHECK(halves_of(looped, h_split, bf16));
  }
}

template <int DPL>
void check_tc(const Case& c, std::mt19937& g) {
  constexpr int HD = DPL * 32;
  // Token 0 decodes (position 300), tokens 1..20 are a chunk (100..119), tokens 21..65 a
  // prefill (0..44): tiles 0 and 1 mix sequences, tiles 2, 3 and the partial tile 4 do not.
  Fixture f(c, {300, 100, 0}, {1, 20, 45}, g);
  std::vector<float> pure(static_cast<size_t>(f.n) * c.nh * HD, -1.0f), mixed(pure.size(), -3.0f);
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>, f.args(false),
                    pure.data());
  const unsigned tiles = static_cast<unsigned>((f.n + 15) / 16);
  cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kTcWarps * 32, cuda::attention_tc_kernel<HD, cuda::kUniform>,
                    f.tc_args(mixed.data()));
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>, f.args(true),
                    mixed.data());
  auto in_tc = [&](int t) { return t >= 32; };  // tiles 2, 3, 4
  const size_t per_token = static_cast<size_t>(c.nh) * HD;
  for (int t = 0; t < f.n; ++t) {
    INFO("token " << t);
    if (in_tc(t)) {
      CHECK(std::memcmp(pure.data() + t * per_token, mixed.data() + t * per_token, per_token * 4) != 0);
    } else {
      CHECK(std::memcmp(pure.data() + t * per_token, mixed.data() + t * per_token, per_token * 4) == 0);
    }
  }
  const double w = f.worst(mixed, in_tc), w_all = f.worst(mixed, [](int) { return true; });
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << HD << ": tensor-core tiles max |diff| " << w << ", all " << w_all);
  CHECK(w < 2e-3);  // (P is rounded to f16 before P V: about 3e-4 here)
  CHECK(w_all < 2e-3);
  // With a half copy for cuBLAS: the tile kernel writes its tokens', the per-token kernel the
  // rest, every value as to_half_rows rounds the output; the output's bits unchanged.
  for (const bool bf16 : {false, true}) {
    std::vector<float> again(mixed.size(), -7.0f);
    std::vector<uint16_t> h(mixed.size(), 0xEEEE);
    cuda::TcArgs ta = f.tc_args(again.data());
    ta.xh = {h.data(), bf16};
    cuda::Args la = f.args(true);
    la.xh = {h.data(), bf16};
    cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kTcWarps * 32, cuda::attention_tc_kernel<HD, cuda::kUniform>, ta);
    cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<DPL>, la, again.data());
    INFO((bf16 ? "bf16" : "f16"));
    CHECK(std::memcmp(again.data(), mixed.data(), mixed.size() * 4) == 0);
    CHECK(halves_of(mixed, h, bf16));
  }
}

// The mma.sync prefill attention (attention_mma.cu) as the backend runs it: its kernel over
// the one-sequence tiles, then the per-token kernel skipping them. Token 0 decodes
// (position 300), tokens 1..47 are a chunk at 200..246 (keys over four 64-key steps, so
// both K/V stages and their cp.async groups are used twice), tokens 48..87 a prefill from
// 0 (0..39): tile 0 mixes sequences, tiles 1-4 do not and tile 5 is a partial one.
template <int HD>
void check_mma(const Case& c, std::mt19937& g) {
  Fixture f(c, {300, 200, 0}, {1, 47, 40}, g);
  std::vector<float> pure(static_cast<size_t>(f.n) * c.nh * HD, -1.0f), mixed(pure.size(), -3.0f);
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<HD / 32>, f.args(false),
                    pure.data());
  const unsigned tiles = static_cast<unsigned>((f.n + 15) / 16);
  cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kMmaWarps * 32, cuda::attention_mma_kernel<HD, cuda::kMmaUniform>,
                    f.mma_args(mixed.data()));
  cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<HD / 32>, f.args(true),
                    mixed.data());
  auto in_mma = [&](int t) { return t >= 16; };  // tiles 1-5
  const size_t per_token = static_cast<size_t>(c.nh) * HD;
  for (int t = 0; t < f.n; ++t) {
    INFO("token " << t);
    if (in_mma(t) && f.pos[t] > 0) {  // (one key: both give its V row exactly)
      CHECK(std::memcmp(pure.data() + t * per_token, mixed.data() + t * per_token, per_token * 4) != 0);
    } else {
      CHECK(std::memcmp(pure.data() + t * per_token, mixed.data() + t * per_token, per_token * 4) == 0);
    }
  }
  const double w = f.worst(mixed, in_mma), w_all = f.worst(mixed, [](int) { return true; });
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << HD << ": mma tiles max |diff| " << w << ", all " << w_all);
  CHECK(w < 2e-3);  // (P is rounded to f16 before P V, as in attention_tc)
  CHECK(w_all < 2e-3);
  // With a half copy for cuBLAS: the tile kernel writes its tokens', the per-token kernel the
  // rest, every value as to_half_rows rounds the output; the output's bits unchanged.
  for (const bool bf16 : {false, true}) {
    std::vector<float> again(mixed.size(), -7.0f);
    std::vector<uint16_t> h(mixed.size(), 0xEEEE);
    cuda::MmaArgs ma = f.mma_args(again.data());
    ma.xh = {h.data(), bf16};
    cuda::Args la = f.args(true);
    la.xh = {h.data(), bf16};
    cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kMmaWarps * 32, cuda::attention_mma_kernel<HD, cuda::kMmaUniform>,
                      ma);
    cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kThreads, cuda::attention_loop_kernel<HD / 32>, la, again.data());
    INFO((bf16 ? "bf16" : "f16"));
    CHECK(std::memcmp(again.data(), mixed.data(), mixed.size() * 4) == 0);
    CHECK(halves_of(mixed, h, bf16));
  }
}

// The batch-invariant tensor-core attention (TROUPE_CUDA_ATTN=tc): the looped kernel and
// split-KV (a block per segment, then attention.cu's combine) give the same bits; so do
// tiles of up to 16 tokens of a sequence (as the backend cuts them) and every token a tile
// of its own (its batch neighbours and how far they reach change nothing); and the values
// are within tolerance of the double reference.
template <int DPL>
void check_tc_invariant(const Case& c, std::mt19937& g, bool every_token_alone = true) {
  constexpr int HD = DPL * 32;
  // A decode token at 520 (three segments), a chunk 252..259 (across a segment boundary),
  // a prefill 0..17. (Small: the emulated WMMA is slow, and this runs three times in CI.)
  Fixture f(c, {520, 252, 0}, {1, 8, 18}, g);
  const int segs = cuda::attention_segments(f.st.max_context);
  std::vector<int32_t> by_seq, alone;
  for (int32_t t : {0, 1, 9, 25}) by_seq.push_back(t);  // (the backend's cut: 1, 8, 16 + 2)
  by_seq.resize(static_cast<size_t>(f.n) + 1, f.n);
  for (int32_t t = 0; t <= f.n; ++t) alone.push_back(t);
  const size_t size = static_cast<size_t>(f.n) * c.nh * HD;
  // Split-KV with one segment more than any token needs (attention_segments() rounds up):
  // that segment's blocks return at once, and its partials (NaN) are never read.
  auto run = [&](const std::vector<int32_t>& tiles, bool split) {
    f.st.tiles = tiles.data();
    const int gz = segs + 1;
    std::vector<float> out(size, -5.0f), partials(size / HD * gz * (HD + 2), std::nanf(""));
    if (split) {
      cuda_emu::launch3(f.n, head_groups(c), gz, cuda::kTcWarps * 32, cuda::attention_tc_kernel<HD, cuda::kSplit>,
                        f.tc_args(out.data(), partials.data(), gz));
      cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<DPL>, f.args(false), gz,
                        static_cast<const float*>(partials.data()), out.data());
    } else {
      cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kTcWarps * 32, cuda::attention_tc_kernel<HD, cuda::kLooped>,
                        f.tc_args(out.data()));
    }
    f.st.tiles = nullptr;
    return out;
  };
  const auto looped = run(by_seq, false), split = run(by_seq, true);
  CHECK(std::memcmp(looped.data(), split.data(), size * 4) == 0);
  if (every_token_alone) {
    const auto single = run(alone, false);
    CHECK(std::memcmp(looped.data(), single.data(), size * 4) == 0);
  }
  const double w = f.worst(looped, [](int) { return true; });
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << HD << ": max |diff| " << w);
  CHECK(w < 2e-3);
}

// The batch-invariant mma.sync attention (attention_mma.cu's looped and split modes,
// TROUPE_CUDA_ATTN=tc): as the WMMA one above, and a chunk at 56..65 whose tile reaches
// into a second 64-key step that its first rows have no key in (a step that must leave
// them exactly as they were, which the tile of one token never takes).
template <int HD>
void check_mma_invariant(const Case& c, std::mt19937& g) {
  Fixture f(c, {520, 252, 0, 56}, {1, 8, 18, 10}, g);
  const int segs = cuda::attention_segments(f.st.max_context);
  std::vector<int32_t> by_seq, alone;
  for (int32_t t : {0, 1, 9, 25, 27}) by_seq.push_back(t);  // (the backend's cut: 1, 8, 16 + 2, 10)
  by_seq.resize(static_cast<size_t>(f.n) + 1, f.n);
  for (int32_t t = 0; t <= f.n; ++t) alone.push_back(t);
  const size_t size = static_cast<size_t>(f.n) * c.nh * HD;
  auto run = [&](const std::vector<int32_t>& tiles, bool split) {
    f.st.tiles = tiles.data();
    const int gz = segs + 1;  // (one segment more than any token needs: its partials, NaN, are never read)
    std::vector<float> out(size, -5.0f), partials(size / HD * gz * (HD + 2), std::nanf(""));
    if (split) {
      cuda_emu::launch3(f.n, head_groups(c), gz, cuda::kMmaWarps * 32, cuda::attention_mma_kernel<HD, cuda::kMmaSplit>,
                        f.mma_args(out.data(), partials.data(), gz));
      cuda_emu::launch3(f.n, c.nh, 1, cuda::kThreads, cuda::attention_combine_kernel<HD / 32>, f.args(false), gz,
                        static_cast<const float*>(partials.data()), out.data());
    } else {
      cuda_emu::launch3(f.n, head_groups(c), 1, cuda::kMmaWarps * 32, cuda::attention_mma_kernel<HD, cuda::kMmaLooped>,
                        f.mma_args(out.data()));
    }
    f.st.tiles = nullptr;
    return out;
  };
  const auto looped = run(by_seq, false), split = run(by_seq, true), single = run(alone, false);
  CHECK(std::memcmp(looped.data(), split.data(), size * 4) == 0);
  CHECK(std::memcmp(looped.data(), single.data(), size * 4) == 0);
  const double w = f.worst(looped, [](int) { return true; });
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << HD << ": max |diff| " << w);
  CHECK(w < 2e-3);
}

// The hole the KV cache's finite f16 (kernels/fp16.h: f32_to_f16_kv; kv_half in
// common.cuh) closes: the tile kernels multiply a masked key's weight (exactly 0) by its V
// row. One prefill of 18 tokens (tiles 0..15 and 16..17); position 15's V row set to the f16
// limit (what the KV writes store for anything larger) leaves tokens 0..14, which must not
// see it, exactly as they were, and changes token 15. An Inf row there (what a plain f16
// conversion stores for an overflow) would turn some of tokens 0..14 into NaN.
template <int HD, typename Launch>
void check_masked_v(const Case& c, std::mt19937& g, Launch launch) {
  Fixture f(c, {0}, {18}, g);
  const size_t per_token = static_cast<size_t>(c.nh) * HD;
  const unsigned tiles = static_cast<unsigned>((f.n + 15) / 16);
  auto run = [&] {
    std::vector<float> out(static_cast<size_t>(f.n) * per_token, -1.0f);
    launch(f, tiles, out);
    return out;
  };
  const auto base = run();
  const int64_t slot = int64_t{f.tables[15 / Fixture::bs]} * Fixture::bs + 15 % Fixture::bs;
  auto with_v15 = [&](float v) {
    for (int64_t j = 0; j < f.row; ++j) f.vc[static_cast<size_t>(slot * f.row + j)] = __float2half_rn(v);
    return run();
  };
  const auto sat = with_v15(65504.0f);
  CHECK(std::memcmp(base.data(), sat.data(), 15 * per_token * 4) == 0);
  CHECK(std::memcmp(base.data() + 15 * per_token, sat.data() + 15 * per_token, per_token * 4) != 0);
  int nonfinite = 0;
  for (const float v : sat) nonfinite += !std::isfinite(v);
  CHECK(nonfinite == 0);
  const auto inf = with_v15(std::numeric_limits<float>::infinity());
  int nan_tokens = 0;
  for (size_t t = 0; t < 15; ++t)
    nan_tokens += std::any_of(inf.begin() + t * per_token, inf.begin() + (t + 1) * per_token,
                              [](float v) { return std::isnan(v); });
  INFO("tokens before position 15 that an Inf V row there turns into NaN: " << nan_tokens);
  CHECK(nan_tokens > 0);
}

}  // namespace

TEST_CASE("the batch-invariant tensor-core attention's source: split-KV, any tiling, the reference",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(33);
  check_tc_invariant<2>({8, 2, 64}, g);  // group 4: every warp a head
  check_tc_invariant<1>({6, 3, 32}, g);  // group 2: two spare warps
  check_tc_invariant<1>({3, 3, 32}, g);  // MHA: three spare warps
  // Head size 128 (64 output values a lane in registers) looped and split only: its 64
  // emulated 16x16x16 products a key step, each done by every lane, are slow here.
  check_tc_invariant<4>({4, 2, 128}, g, /*every_token_alone=*/false);
}

TEST_CASE("the paged-attention kernels' source: split-KV gives the looped path's bits and the reference's values",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(31);
  check<2>({8, 2, 64}, g);   // group 4: one full four-head group per KV head
  check<4>({6, 1, 128}, g);  // group 6: a full group and a half-empty one
  check<1>({3, 3, 32}, g);   // MHA: group 1
  check<8>({4, 2, 256}, g);  // the widest head
}

TEST_CASE("the tensor-core prefill attention's source takes the one-sequence tiles and matches the reference",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(32);
  check_tc<2>({8, 2, 64}, g);   // group 4: every warp a head
  check_tc<4>({6, 3, 128}, g);  // group 2: two spare warps
  check_tc<1>({3, 3, 32}, g);   // MHA: three spare warps
  check_tc<5>({2, 1, 160}, g);  // 32-key steps (heads over 128)
}

TEST_CASE("the mma.sync prefill attention's source takes the one-sequence tiles and matches the reference",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(34);
  check_mma<64>({8, 2, 64}, g);    // group 4: every warp a head
  check_mma<128>({6, 3, 128}, g);  // group 2: two spare warps
  check_mma<32>({3, 3, 32}, g);    // MHA: three spare warps
  check_mma<96>({4, 1, 96}, g);    // the head size whose O n-tiles are not a power of two
}

TEST_CASE("the batch-invariant mma.sync attention's source: split-KV, any tiling, the reference",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(35);
  check_mma_invariant<64>({8, 2, 64}, g);    // group 4: every warp a head
  check_mma_invariant<32>({6, 3, 32}, g);    // group 2: two spare warps
  check_mma_invariant<128>({4, 4, 128}, g);  // MHA: three spare warps
  check_mma_invariant<96>({8, 2, 96}, g);
}

TEST_CASE("attention_segments: the segments a context needs, rounded up to two sizes an octave",
          "[kernels][cuda-emulation]") {
  // Decode steps keep one launch signature (and CUDA graph) while contexts grow.
  CHECK(cuda::attention_segments(0) == 0);
  const std::vector<std::pair<int, int>> want = {
      {1, 1},    {256, 1},  {257, 2},   {512, 2},   {513, 3},   {768, 3},   {769, 4},   {1024, 4},   {1025, 6},
      {1536, 6}, {1537, 8}, {2049, 12}, {3072, 12}, {3073, 16}, {4097, 24}, {8193, 48}, {32768, 128}};
  for (const auto& [ctx, segs] : want) {
    INFO("context " << ctx);
    CHECK(cuda::attention_segments(ctx) == segs);
  }
  int prev = 0, sizes = 0;
  for (int ctx = 1; ctx <= 1 << 20; ++ctx) {
    const int s = cuda::attention_segments(ctx), need = (ctx + cuda::kAttentionSegment - 1) / cuda::kAttentionSegment;
    if (s < need || 2 * s > 3 * need) FAIL("context " << ctx << ": " << s << " segments for " << need);
    if (s != prev) ++sizes;
    prev = s;
  }
  CHECK(sizes == 24);  // 1 .. 4096 segments: 1, 2, then two sizes in each of 11 octaves (3, 4 .. 3072, 4096)
}

TEST_CASE("the tile attention kernels' source: a V row at the f16 limit past a token's position leaves it unchanged",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(35);
  const Case c{2, 1, 64};
  check_masked_v<64>(c, g, [&](const Fixture& f, unsigned tiles, std::vector<float>& out) {
    cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kTcWarps * 32, cuda::attention_tc_kernel<64, cuda::kUniform>,
                      f.tc_args(out.data()));
  });
  check_masked_v<64>(c, g, [&](const Fixture& f, unsigned tiles, std::vector<float>& out) {
    cuda_emu::launch3(tiles, head_groups(c), 1, cuda::kMmaWarps * 32, cuda::attention_mma_kernel<64, cuda::kMmaUniform>,
                      f.mma_args(out.data()));
  });
}
