// The paged-attention kernels' source (kernels/cuda/attention.cu), run on the CPU through
// tests/kernels/cuda_emulation.h: prefill, a chunk in the middle of a sequence and a decode
// token over an f16 paged cache, GQA groups that fill the kernel's four-head groups and ones
// that do not, contexts over several 256-key segments. The split-KV path (a block per
// segment, then the combine) must give the looped path's bits, and both the softmax-weighted
// values of a double reference (queries rounded to f16 as the kernel does).
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/attention.cu"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <random>

using namespace troupe;

namespace {

struct Case {
  int nh, nkv, hd;
};

template <int DPL>
void check(const Case& c, std::mt19937& g) {
  const int hd = DPL * 32, bs = 16, num_blocks = 48, max_blocks = 40;
  const int64_t row = int64_t{c.nkv} * hd;
  // Three sequences: positions 0..4 (prefill), 300..302 (a chunk) and 599 (decode).
  const std::vector<int> first = {0, 300, 599}, count = {5, 3, 1};
  std::vector<int32_t> tables(3 * max_blocks);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  for (int s = 0; s < 3; ++s)
    for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = perm[(s * 13 + b) % num_blocks];
  // The cache: every position of every sequence up to its last token (sequences share some
  // blocks here, which attention does not mind: it only reads).
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<__half> kc(static_cast<size_t>(num_blocks) * bs * row), vc(kc.size());
  for (auto& h : kc) h = __float2half_rn(nd(g));
  for (auto& h : vc) h = __float2half_rn(nd(g));
  std::vector<int32_t> pos, seq;
  for (int s = 0; s < 3; ++s)
    for (int p = first[s]; p < first[s] + count[s]; ++p) {
      pos.push_back(p);
      seq.push_back(s);
    }
  const int n = static_cast<int>(pos.size());
  const int64_t ldq = int64_t{c.nh + 2 * c.nkv} * hd;
  std::vector<float> q(static_cast<size_t>(n * ldq));
  for (auto& v : q) v = 2.0f * nd(g);
  cuda::DeviceStep st;
  st.num_tokens = n;
  st.num_seqs = 3;
  st.max_blocks_per_seq = max_blocks;
  st.positions = pos.data();
  st.token_seq = seq.data();
  st.block_tables = tables.data();
  st.max_context = 600;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const cuda::Args a{st, q.data(), ldq, c.nh, c.nkv, bs, scale, kc.data(), vc.data()};
  const int group = c.nh / c.nkv;
  const unsigned ys = static_cast<unsigned>(c.nkv * ((group + cuda::kGroup - 1) / cuda::kGroup));
  const int segs = (st.max_context + cuda::kSegment - 1) / cuda::kSegment;  // attention_segments()
  // Each (y, z) of the grid is one emulated launch over x (tokens).
  auto launch = [&](unsigned gx, unsigned gy, unsigned gz, auto kernel, auto... args) {
    for (unsigned z = 0; z < gz; ++z)
      for (unsigned y = 0; y < gy; ++y)
        cuda_emu::launch(gx, cuda::kThreads, [=](auto... xs) {
          blockIdx.y = y;
          blockIdx.z = z;
          kernel(xs...);
        }, args...);
  };
  std::vector<float> looped(static_cast<size_t>(n) * c.nh * hd, -1.0f), split(looped.size(), -2.0f);
  launch(n, ys, 1, cuda::attention_loop_kernel<DPL>, a, looped.data());
  std::vector<float> partials(static_cast<size_t>(n) * c.nh * segs * (hd + 2), 0.0f);
  launch(n, ys, segs, cuda::attention_split_kernel<DPL>, a, segs, partials.data());
  launch(n, c.nh, 1, cuda::attention_combine_kernel<DPL>, a, segs, static_cast<const float*>(partials.data()),
         split.data());
  CHECK(std::memcmp(looped.data(), split.data(), looped.size() * 4) == 0);
  // The double reference.
  double worst = 0;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < c.nh; ++h) {
      const int kvh = h / group;
      std::vector<double> qh(hd), sc(static_cast<size_t>(pos[t] + 1)), o(hd, 0.0);
      for (int d = 0; d < hd; ++d) qh[d] = __half2float(__float2half_rn(q[t * ldq + h * hd + d]));
      double mx = -1e300, z = 0;
      for (int p = 0; p <= pos[t]; ++p) {
        const int64_t slot = int64_t{tables[seq[t] * max_blocks + p / bs]} * bs + p % bs;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += qh[d] * __half2float(kc[slot * row + kvh * hd + d]);
        sc[p] = dot * scale;
        mx = std::max(mx, sc[p]);
      }
      for (int p = 0; p <= pos[t]; ++p) z += sc[p] = std::exp(sc[p] - mx);
      for (int p = 0; p <= pos[t]; ++p) {
        const int64_t slot = int64_t{tables[seq[t] * max_blocks + p / bs]} * bs + p % bs;
        for (int d = 0; d < hd; ++d) o[d] += sc[p] / z * __half2float(vc[slot * row + kvh * hd + d]);
      }
      for (int d = 0; d < hd; ++d)
        worst = std::max(worst, std::fabs(o[d] - looped[(static_cast<size_t>(t) * c.nh + h) * hd + d]));
    }
  INFO("heads " << c.nh << "/" << c.nkv << " hd " << hd << ": max |diff| from the double reference " << worst);
  CHECK(worst < 2e-3);
}

}  // namespace

TEST_CASE("the paged-attention kernels' source: split-KV gives the looped path's bits and the reference's values", "[kernels][cuda-emulation]") {
  std::mt19937 g(31);
  check<2>({8, 2, 64}, g);   // group 4: one full four-head group per KV head
  check<4>({6, 1, 128}, g);  // group 6: a full group and a half-empty one
  check<1>({3, 3, 32}, g);   // MHA: group 1
  check<8>({4, 2, 256}, g);  // the widest head
}
