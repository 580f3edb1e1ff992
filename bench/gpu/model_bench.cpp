// troupe_gpu_bench's end-to-end sections (bench/gpu/bench_util.h): Llama-3-8B-shaped dummy
// bf16 weights, each op of a batch-1 decode step alone, and decode and prefill in each
// matmul mode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu/bench_util.h"
#include "runtime/model/model.h"
#include "runtime/format/weights.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

namespace gpu_bench {

using json = nlohmann::json;

// Llama-3-8B-shaped weights where every layer shares one set of random bf16 tensors, so
// the host holds one layer (the device still gets 32 separate copies).
namespace {
class SharedDummySource : public WeightSource {
 public:
  explicit SharedDummySource(const ModelConfig& c) {
    const int64_t H = c.hidden, q = int64_t{c.num_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
    auto mat = [&](const std::string& key, int64_t rows_, int64_t cols_, float scale) {
      bufs_[key] = random_bf16(size_t(rows_) * cols_, scale);
      return std::make_pair(bufs_[key].data(), std::vector<int64_t>{cols_, rows_});
    };
    norm_.assign(size_t(H), 1.0f);
    const float ws = 1.0f / std::sqrt(float(H));
    auto put = [&](const std::string& name, std::pair<uint16_t*, std::vector<int64_t>> m) {
      TensorRef t;
      t.name = name;
      t.type = DType::BF16;
      t.shape = m.second;
      t.data = m.first;
      t.nbytes = size_t(t.shape[0]) * t.shape[1] * 2;
      add(std::move(t));
    };
    auto put_norm = [&](const std::string& name) {
      TensorRef t;
      t.name = name;
      t.type = DType::F32;
      t.shape = {H};
      t.data = norm_.data();
      t.nbytes = size_t(H) * 4;
      add(std::move(t));
    };
    put("token_embd.weight", mat("embd", c.vocab, H, 1.0f));
    put("output.weight", mat("out", c.vocab, H, ws));
    put_norm("output_norm.weight");
    auto wq = mat("q", q, H, ws), wk = mat("k", kv, H, ws), wv = mat("v", kv, H, ws), wo = mat("o", H, q, ws);
    auto wg = mat("g", c.ffn, H, ws), wu = mat("u", c.ffn, H, ws),
         wd = mat("d", H, c.ffn, 1.0f / std::sqrt(float(c.ffn)));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      put(p + "attn_q.weight", wq);
      put(p + "attn_k.weight", wk);
      put(p + "attn_v.weight", wv);
      put(p + "attn_output.weight", wo);
      put(p + "ffn_gate.weight", wg);
      put(p + "ffn_up.weight", wu);
      put(p + "ffn_down.weight", wd);
      put_norm(p + "attn_norm.weight");
      put_norm(p + "ffn_norm.weight");
    }
  }

 private:
  std::map<std::string, std::vector<uint16_t>> bufs_;
  std::vector<float> norm_;
};

}  // namespace

// The ops of one Llama-3-8B bf16 decode step at batch 1 (1024-token context), each alone
// and back to back as a replayed step would run them, so the end-to-end row below can be
// read against the sum of its parts: what the step loses beyond that sum is between the
// kernels. Weights come in enough copies to stream past the L2, as distinct layers do.
void bench_decode_parts(const ModelConfig& cfg, double copy_gbs) {
  auto be = make_cuda_backend({});
  need(be);
  std::mt19937 rng(6);
  const int64_t H = cfg.hidden, hd = cfg.head_dim, nh = cfg.num_heads, nkv = cfg.num_kv_heads, ffn = cfg.ffn;
  const int64_t qkv_rows = (nh + 2 * nkv) * hd;
  const int32_t ctx = S.e2e_ctx, bs = 16, bps = ctx / bs;
  auto cache = (*be)->make_kv_cache(KvCacheShape{1, bps, bs, int32_t(nkv), int32_t(hd)});
  need(cache);
  std::vector<int32_t> ids = {7}, pos = {ctx - 1}, qs = {0, 1}, cl = {ctx}, slots = {ctx - 1}, bt(bps);
  for (int32_t b = 0; b < bps; ++b) bt[b] = b;
  StepInputs st{1, 1, ids.data(), pos.data(), qs.data(), cl.data(), slots.data(), bt.data(), bps};
  (*be)->begin_step(st);
  float* x = (*be)->upload(test::random_floats(size_t(std::max(H, ffn)), rng, 0.5f));
  float* y = (*be)->alloc(size_t(std::max<int64_t>(cfg.vocab, 2 * ffn)));
  float* act = (*be)->alloc(size_t(ffn));
  float* qkv = (*be)->alloc(size_t(qkv_rows));
  float* norm_w = (*be)->upload(test::random_floats(size_t(H), rng));
  std::vector<float> cs(static_cast<size_t>(hd));
  for (int64_t i = 0; i < hd / 2; ++i) {
    cs[2 * i] = std::cos(0.1f * i);
    cs[2 * i + 1] = std::sin(0.1f * i);
  }
  float* dcs = (*be)->upload(cs);
  double layer_ms = 0;
  auto part = [&](const std::string& what, const std::string& shape, int per_layer, double bytes,
                  const std::function<void()>& fn) {
    const double ms = time_ms(**be, fn);
    layer_ms += per_layer * ms;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    add({"decode part: " + what, shape, ms, gbs, "GB/s", 100.0 * gbs / copy_gbs, "copy"});
  };
  auto gemv_part = [&](const std::string& what, int64_t rows, int64_t cols, int per_layer, auto call) {
    auto v = random_bf16(size_t(rows) * cols, 0.02f);
    const size_t bytes = v.size() * 2;
    const size_t copies = std::max<size_t>(1, S.stream_bytes / bytes + 1);
    std::vector<std::unique_ptr<Weight>> ws;
    for (size_t i = 0; i < copies; ++i) {
      auto w = (*be)->make_weight(DType::BF16, cols, {{v.data(), rows}});
      need(w);
      ws.push_back(std::move(*w));
    }
    size_t k = 0;
    part(what, std::to_string(rows) + "x" + std::to_string(cols), per_layer, double(bytes),
         [&] { call(*ws[k++ % copies]); });
  };
  gemv_part("QKV GEMV + RoPE + KV write", qkv_rows, H, 1, [&](const Weight& w) {
    (*be)->matmul_rope_kv_write(w, x, **cache, 0, qkv, qkv_rows, 1, int32_t(nh), int32_t(nkv), hd, dcs, cfg.rope_kind);
  });
  part("attention", "1 seq x 1024 ctx", 1, 2.0 * ctx * nkv * hd * 2,
       [&] { (*be)->attention(**cache, 0, qkv, qkv_rows, int32_t(nh), 0.088f, act); });
  gemv_part("o GEMV", H, nh * hd, 1, [&](const Weight& w) { (*be)->matmul(w, act, 1, y, H); });
  float* xr = (*be)->upload(test::random_floats(size_t(H), rng, 0.5f));  // (its own residual: it grows)
  part("add_rms_norm", "1 x " + std::to_string(H), 2, 4.0 * H * 4,
       [&] { (*be)->add_rms_norm(xr, y, norm_w, 1e-5f, 1, H, y); });
  gemv_part("gate/up GEMV + SiLU", 2 * ffn, H, 1, [&](const Weight& w) { (*be)->matmul_silu(w, x, 1, ffn, y, act); });
  gemv_part("down GEMV", H, ffn, 1, [&](const Weight& w) { (*be)->matmul(w, act, 1, y, H); });
  const double before_head = layer_ms;
  layer_ms = 0;
  gemv_part("output GEMV (logits)", cfg.vocab, H, 1, [&](const Weight& w) { (*be)->matmul(w, x, 1, y, cfg.vocab); });
  const double step_ms = cfg.num_layers * before_head + layer_ms;
  add({"decode parts summed (" + std::to_string(cfg.num_layers) + " layers + logits)", "batch 1, ctx 1024", step_ms,
       1e3 / step_ms, "tok/s", -1, ""});
  out["decode_parts_ms"] = step_ms;
}

void bench_end_to_end(const ModelConfig& cfg, double copy_gbs) {
  const int32_t max_b = *std::max_element(S.e2e_batches.begin(), S.e2e_batches.end());
  std::printf("building Llama-3-8B-shaped dummy bf16 weights...\n");
  std::fflush(stdout);
  SharedDummySource src(cfg);
  const double layer_bytes =
      2.0 * cfg.hidden * (int64_t{cfg.num_heads} * cfg.head_dim + 2 * int64_t{cfg.num_kv_heads} * cfg.head_dim) +
      2.0 * cfg.hidden * int64_t{cfg.num_heads} * cfg.head_dim + 3 * 2.0 * cfg.hidden * cfg.ffn;
  const double step_bytes = cfg.num_layers * layer_bytes + 2.0 * cfg.vocab * cfg.hidden;  // + output matrix
  json e2e = json::array();
  for (int mode : {0, 2, 4, 1, 3}) {  // (the kernels the H200 run measured first)
    // 0: batch-invariant GEMV, 1: cuBLAS above 8 tokens, 2: as 0 without CUDA graphs,
    // 3: batch-invariant tensor-core matmul (--cuda-tc-gemm), 4: as 0 without the fused
    // SiLU and RoPE + KV-write epilogues (TROUPE_CUDA_FUSE=0; decode only).
    const bool invariant = mode != 1;
    CudaBackendOptions o;
    o.batch_invariant = invariant;
    o.graph_max_tokens = mode == 2 ? 0 : 256;
    o.tc_gemm = mode == 3;
    if (mode == 4) setenv("TROUPE_CUDA_FUSE", "0", 1);
    auto be = make_cuda_backend(o);
    unsetenv("TROUPE_CUDA_FUSE");
    need(be);
    const double t0 = now();
    auto model = Model::build(cfg, src, **be, std::max(S.e2e_prefill, max_b));
    need(model);
    std::printf("  model on %s in %.1f s\n", (*be)->name().c_str(), now() - t0);
    const int32_t ctx = S.e2e_ctx, bs = 16, bps = ctx / bs;
    KvCacheShape ks{cfg.num_layers, max_b * bps + 128, bs, cfg.num_kv_heads, cfg.head_dim};
    auto cache = (*be)->make_kv_cache(ks);
    need(cache);
    const std::string mode_name = mode == 0   ? "batch-invariant GEMV, CUDA graphs"
                                  : mode == 1 ? "cuBLAS above 8 tokens, CUDA graphs"
                                  : mode == 2 ? "batch-invariant GEMV, no CUDA graphs"
                                  : mode == 3 ? "batch-invariant tensor cores, CUDA graphs"
                                              : "batch-invariant GEMV, CUDA graphs, unfused epilogues";
    std::vector<float> logits;
    for (int32_t B : S.e2e_batches) {
      if ((mode == 2 || mode == 4) && B > 8) break;
      std::vector<int32_t> ids(B, 7), pos(B, ctx - 1), slots, qs, cl(B, ctx), bt, rows_;
      for (int32_t s = 0; s < B; ++s) {
        for (int32_t b = 0; b < bps; ++b) bt.push_back(s * bps + b);
        slots.push_back(bt[size_t(s) * bps + (ctx - 1) / bs] * bs + (ctx - 1) % bs);
        qs.push_back(s);
        rows_.push_back(s);
      }
      qs.push_back(B);
      StepInputs st{B, B, ids.data(), pos.data(), qs.data(), cl.data(), slots.data(), bt.data(), bps};
      logits.resize(size_t(B) * cfg.vocab);
      auto step = [&] {
        auto r = (*model)->forward(st, **cache, rows_.data(), B, logits.data());
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.error().message.c_str());
          std::exit(1);
        }
      };
      step();
      const double ms = time_ms(**be, step);
      const double tps = B / (ms * 1e-3);
      Row r{"decode Llama-3-8B dummy bf16, " + mode_name,
            "batch " + std::to_string(B) + ", ctx 1024",
            ms,
            tps,
            "tok/s",
            -1,
            ""};
      if (B == 1) {
        const double ideal_ms = step_bytes / (copy_gbs * 1e9) * 1e3;
        r.pct = 100.0 * ideal_ms / ms;
        r.of = "bandwidth roofline";
      }
      add(r);
    }
    std::printf("  %s\n", (*be)->stats().c_str());
    if (mode != 2 && mode != 4) {
      const int32_t n = S.e2e_prefill, pb = n / bs;
      std::vector<int32_t> ids(n, 7), pos(n), slots(n), qs = {0, n}, cl = {n}, bt, row = {n - 1};
      for (int32_t b = 0; b < pb; ++b) bt.push_back(b);
      for (int32_t p = 0; p < n; ++p) {
        pos[p] = p;
        slots[p] = p;
      }
      StepInputs st{n, 1, ids.data(), pos.data(), qs.data(), cl.data(), slots.data(), bt.data(), pb};
      logits.resize(cfg.vocab);
      auto step = [&] {
        auto r = (*model)->forward(st, **cache, row.data(), 1, logits.data());
        if (!r.ok()) {
          std::fprintf(stderr, "%s\n", r.error().message.c_str());
          std::exit(1);
        }
      };
      const double ms = time_ms(**be, step);
      add({"prefill Llama-3-8B dummy bf16, " + mode_name, "2048 tokens", ms, n / (ms * 1e-3), "tok/s", -1, ""});
    }
  }
}

}  // namespace gpu_bench
