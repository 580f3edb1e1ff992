// The forward pass on the tiny synthetic model: against a plain float reference written
// here from the Llama equations, and batch independence (bit-identical logits whether a
// sequence runs alone or packed with others, in one step or many).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "runtime/engine/sequence_runner.h"
#include "tests/runtime/tiny_model.h"

using namespace troupe;

namespace {

struct Tiny {
  std::vector<uint8_t> bytes;
  std::string path;
  ModelFiles files;
};

Tiny make_tiny(const test::TinyModelSpec& spec = {}) {
  Tiny t;
  auto w = test::tiny_model_writer(spec);
  t.path = "/tmp/troupe_tiny_" + std::to_string(::getpid()) + "_" + spec.arch + std::to_string(spec.experts) + ".gguf";
  REQUIRE(w.write(t.path).ok());
  auto f = open_gguf(t.path);
  if (!f) FAIL(f.error().message);
  t.files = std::move(*f);
  return t;
}

std::vector<float> deq(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.shape[0] * t.rows()));
  const size_t rb = *row_bytes(t.type, static_cast<uint64_t>(t.shape[0]));
  for (int64_t r = 0; r < t.rows(); ++r)
    cpu::dequantize_row_ref(t.type, static_cast<const uint8_t*>(t.data) + rb * r, v.data() + r * t.shape[0],
                            t.shape[0]);
  return v;
}

// y = W x for W [rows, cols] row-major.
std::vector<double> mv(const std::vector<float>& W, int64_t rows, int64_t cols, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t k = 0; k < cols; ++k) s += W[r * cols + k] * x[k];
    y[r] = s;
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

// Logits of the last token of `tokens`, computed naively in double.
std::vector<double> reference_logits(const ModelFiles& m, const std::vector<int32_t>& tokens) {
  const auto& c = m.config;
  const auto& W = *m.weights;
  const int64_t H = c.hidden, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  auto emb = deq(*W.find("token_embd.weight"));
  const size_t T = tokens.size();
  std::vector<std::vector<double>> x(T, std::vector<double>(static_cast<size_t>(H)));
  for (size_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) x[t][j] = emb[tokens[t] * H + j];
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double th = pos * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
        const bool neox = c.rope_kind == RopeKind::Neox;  // pairs (i, i + hd/2) instead of (2i, 2i + 1)
        double& a = v[h * hd + (neox ? i : 2 * i)];
        double& b = v[h * hd + (neox ? i + hd / 2 : 2 * i + 1)];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(th) - b0 * std::sin(th);
        b = a0 * std::sin(th) + b0 * std::cos(th);
      }
  };
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto an = deq(*W.find(p + "attn_norm.weight")), fn = deq(*W.find(p + "ffn_norm.weight"));
    auto wq = deq(*W.find(p + "attn_q.weight")), wk = deq(*W.find(p + "attn_k.weight")),
         wv = deq(*W.find(p + "attn_v.weight"));
    auto wo = deq(*W.find(p + "attn_output.weight"));
    const bool moe = c.moe.enabled();
    const int64_t E = c.moe.num_experts, F = moe ? c.moe.expert_ffn : c.ffn, S = c.moe.shared_ffn;
    // Dense: the FFN; MoE: the experts stacked [experts][F rows] as llama.cpp writes them.
    auto wg = deq(*W.find(p + (moe ? "ffn_gate_exps.weight" : "ffn_gate.weight"))),
         wu = deq(*W.find(p + (moe ? "ffn_up_exps.weight" : "ffn_up.weight"))),
         wd = deq(*W.find(p + (moe ? "ffn_down_exps.weight" : "ffn_down.weight")));
    std::vector<float> wr, sg, su, sd, sgate;
    if (moe) wr = deq(*W.find(p + "ffn_gate_inp.weight"));
    if (S > 0) {
      sg = deq(*W.find(p + "ffn_gate_shexp.weight"));
      su = deq(*W.find(p + "ffn_up_shexp.weight"));
      sd = deq(*W.find(p + "ffn_down_shexp.weight"));
      sgate = deq(*W.find(p + "ffn_gate_inp_shexp.weight"));
    }
    auto swiglu = [&](const float* g_w, const float* u_w, const float* d_w, int64_t ff, const std::vector<double>& h) {
      std::vector<float> G(g_w, g_w + ff * H), U(u_w, u_w + ff * H), D(d_w, d_w + H * ff);
      auto g = mv(G, ff, H, h), u = mv(U, ff, H, h);
      for (int64_t j = 0; j < ff; ++j) g[j] = g[j] / (1 + std::exp(-g[j])) * u[j];
      return mv(D, H, ff, g);
    };
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto h = rmsnorm(x[t], an, c.rms_eps);
      q[t] = mv(wq, nh * hd, H, h);
      k[t] = mv(wk, nkv * hd, H, h);
      v[t] = mv(wv, nkv * hd, H, h);
      if (c.qkv_bias) {
        auto bq = deq(*W.find(p + "attn_q.bias")), bk = deq(*W.find(p + "attn_k.bias")),
             bv = deq(*W.find(p + "attn_v.bias"));
        for (int64_t i = 0; i < nh * hd; ++i) q[t][i] += bq[i];
        for (int64_t i = 0; i < nkv * hd; ++i) k[t][i] += bk[i], v[t][i] += bv[i];
      }
      rope(q[t], nh, static_cast<int64_t>(t));
      rope(k[t], nkv, static_cast<int64_t>(t));
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(nh * hd), 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / (nh / nkv);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][kh * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) {
          e = std::exp(e - mx);
          z += e;
        }
        for (size_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) att[h * hd + i] += s[j] / z * v[j][kh * hd + i];
      }
      auto o = mv(wo, H, nh * hd, att);
      for (int64_t j = 0; j < H; ++j) x[t][j] += o[j];
      auto h = rmsnorm(x[t], fn, c.rms_eps);
      std::vector<double> d(static_cast<size_t>(H), 0.0);
      if (!moe) {
        d = swiglu(wg.data(), wu.data(), wd.data(), F, h);
      } else {
        // softmax over the experts, the top k, renormalised when the config says so
        auto lg = mv(wr, E, H, h);
        const double mx = *std::max_element(lg.begin(), lg.end());
        double z = 0;
        for (auto& v : lg) z += std::exp(v - mx);
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] > lg[b]; });
        double wsum = 0;
        for (int j = 0; j < c.moe.experts_per_tok; ++j) wsum += std::exp(lg[order[j]] - mx) / z;
        for (int j = 0; j < c.moe.experts_per_tok; ++j) {
          const int e = order[j];
          double wt = std::exp(lg[e] - mx) / z;
          if (c.moe.norm_topk_prob) wt /= wsum;
          auto y = swiglu(wg.data() + e * F * H, wu.data() + e * F * H, wd.data() + e * H * F, F, h);
          for (int64_t i = 0; i < H; ++i) d[i] += wt * y[i];
        }
        if (S > 0) {
          double gl = 0;
          for (int64_t i = 0; i < H; ++i) gl += sgate[i] * h[i];
          auto y = swiglu(sg.data(), su.data(), sd.data(), S, h);
          for (int64_t i = 0; i < H; ++i) d[i] += y[i] / (1 + std::exp(-gl));
        }
      }
      for (int64_t j = 0; j < H; ++j) x[t][j] += d[j];
    }
  }
  auto on = deq(*W.find("output_norm.weight"));
  auto out = deq(*W.find(W.find("output.weight") ? "output.weight" : "token_embd.weight"));
  return mv(out, c.vocab, H, rmsnorm(x[T - 1], on, c.rms_eps));
}

std::vector<int32_t> tokens_for(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 5) % test::tiny_vocab_size();
  return t;
}

}  // namespace

// The dense tiny model, a Mixtral (top-2 of 4, renormalised) and a Qwen2-MoE (top-2 of 6, not
// renormalised, gated shared expert, q/k/v biases, NeoX RoPE).
test::TinyModelSpec spec_named(const std::string& which) {
  test::TinyModelSpec s;
  if (which == "mixtral") {
    s.experts = 4;
    s.experts_used = 2;
    s.seed = 21;
  } else if (which == "qwen2moe") {
    s.arch = "qwen2moe";
    s.experts = 6;
    s.experts_used = 2;
    s.expert_ffn = 64;
    s.shared_ffn = 96;
    s.seed = 23;
  }
  return s;
}

TEST_CASE("tiny model forward matches a plain double-precision reference", "[model]") {
  const std::string which = GENERATE(as<std::string>{}, "dense", "mixtral", "qwen2moe");
  INFO("model " << which);
  Tiny t = make_tiny(spec_named(which));
  if (which == "qwen2moe") {
    REQUIRE(t.files.config.moe.shared_gate);
    REQUIRE_FALSE(t.files.config.moe.norm_topk_prob);
  }
  if (which == "mixtral") REQUIRE(t.files.config.moe.norm_topk_prob);
  auto backend = make_cpu_backend({2});
  auto model = Model::build(t.files.config, *t.files.weights, *backend, 64);
  REQUIRE(model.ok());
  for (int n : {1, 6, 23}) {
    auto runner = SequenceRunner::create(**model, *backend, 128);
    REQUIRE(runner.ok());
    auto toks = tokens_for(n, n);
    auto logits = (*runner)->feed(toks);
    REQUIRE(logits.ok());
    auto ref = reference_logits(t.files, toks);
    // Tolerance: activations are quantized to int8 per 32 values (0.4% step) before every
    // quantized matmul and K/V are stored as f16; over two layers this stays well under
    // 5% of the logit range. An indexing or RoPE mistake moves logits by O(range).
    double range = 0, max_err = 0;
    for (double v : ref) range = std::max(range, std::fabs(v));
    for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs((*logits)[i] - ref[i]));
    INFO("tokens " << n << " max error " << max_err << " logit range " << range);
    REQUIRE(max_err < 0.05 * range);
    const auto best = std::max_element(ref.begin(), ref.end()) - ref.begin();
    const auto got = std::max_element(*logits, *logits + ref.size()) - *logits;
    REQUIRE(best == got);
  }
  std::remove(t.path.c_str());
}

TEST_CASE("a sequence's logits are bit-identical alone or packed with others", "[model][batch]") {
  const std::string which = GENERATE(as<std::string>{}, "dense", "mixtral", "qwen2moe");
  INFO("model " << which);
  Tiny t = make_tiny(spec_named(which));
  auto backend = make_cpu_backend({2});
  auto model = Model::build(t.files.config, *t.files.weights, *backend, 128);
  REQUIRE(model.ok());
  const auto& c = t.files.config;
  const int32_t bs = 16;
  KvCacheShape ks{c.num_layers, 32, bs, c.num_kv_heads, c.head_dim};
  const std::vector<int> lens = {7, 19, 1, 33};
  // Alone: each sequence prefilled by itself, logits of its last token.
  std::vector<std::vector<float>> alone;
  for (size_t s = 0; s < lens.size(); ++s) {
    auto runner = SequenceRunner::create(**model, *backend, 64, bs);
    REQUIRE(runner.ok());
    auto l = (*runner)->feed(tokens_for(lens[s], static_cast<int>(s)));
    REQUIRE(l.ok());
    alone.emplace_back(*l, *l + c.vocab);
  }
  // Packed: all four in one step over a shared paged cache with scattered blocks.
  auto cache = backend->make_kv_cache(ks);
  REQUIRE(cache.ok());
  std::vector<int32_t> ids, pos, slots, qstart{0}, ctx, rows;
  const int32_t mb = 4;
  std::vector<int32_t> tables(lens.size() * mb);
  int32_t next_block = 31;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int b = 0; b < mb; ++b) tables[s * mb + b] = next_block--;  // blocks in reverse order
    auto tk = tokens_for(lens[s], static_cast<int>(s));
    for (int i = 0; i < lens[s]; ++i) {
      ids.push_back(tk[i]);
      pos.push_back(i);
      slots.push_back(tables[s * mb + i / bs] * bs + i % bs);
    }
    qstart.push_back(static_cast<int32_t>(ids.size()));
    ctx.push_back(lens[s]);
    rows.push_back(qstart.back() - 1);
  }
  StepInputs st;
  st.num_tokens = static_cast<int32_t>(ids.size());
  st.num_seqs = static_cast<int32_t>(lens.size());
  st.token_ids = ids.data();
  st.positions = pos.data();
  st.query_start = qstart.data();
  st.context_lens = ctx.data();
  st.slot_mapping = slots.data();
  st.block_tables = tables.data();
  st.max_blocks_per_seq = mb;
  std::vector<float> logits(lens.size() * c.vocab);
  REQUIRE((*model)->forward(st, **cache, rows.data(), static_cast<int32_t>(rows.size()), logits.data()).ok());
  for (size_t s = 0; s < lens.size(); ++s) {
    INFO("sequence " << s);
    REQUIRE(std::memcmp(alone[s].data(), logits.data() + s * c.vocab, c.vocab * sizeof(float)) == 0);
  }

  // Decode step: each sequence gets one more token, packed together; compare with the
  // sequence decoded alone after its own prefill.
  std::vector<int32_t> ids2, pos2, slots2, qs2{0}, ctx2, rows2;
  for (size_t s = 0; s < lens.size(); ++s) {
    ids2.push_back(42 + static_cast<int32_t>(s));
    pos2.push_back(lens[s]);
    slots2.push_back(tables[s * mb + lens[s] / bs] * bs + lens[s] % bs);
    qs2.push_back(static_cast<int32_t>(s + 1));
    ctx2.push_back(lens[s] + 1);
    rows2.push_back(static_cast<int32_t>(s));
  }
  st.num_tokens = st.num_seqs;
  st.token_ids = ids2.data();
  st.positions = pos2.data();
  st.query_start = qs2.data();
  st.context_lens = ctx2.data();
  st.slot_mapping = slots2.data();
  REQUIRE((*model)->forward(st, **cache, rows2.data(), static_cast<int32_t>(rows2.size()), logits.data()).ok());
  for (size_t s = 0; s < lens.size(); ++s) {
    auto runner = SequenceRunner::create(**model, *backend, 64, bs);
    REQUIRE(runner.ok());
    REQUIRE((*runner)->feed(tokens_for(lens[s], static_cast<int>(s))).ok());
    auto l = (*runner)->feed({42 + static_cast<int32_t>(s)});
    REQUIRE(l.ok());
    INFO("decode sequence " << s);
    REQUIRE(std::memcmp(*l, logits.data() + s * c.vocab, c.vocab * sizeof(float)) == 0);
  }
  std::remove(t.path.c_str());
}

TEST_CASE("prefill in chunks gives the same logits as one batch", "[model][batch]") {
  const std::string which = GENERATE(as<std::string>{}, "dense", "mixtral", "qwen2moe");
  INFO("model " << which);
  Tiny t = make_tiny(spec_named(which));
  auto backend = make_cpu_backend({1});
  auto big = Model::build(t.files.config, *t.files.weights, *backend, 64);
  auto small = Model::build(t.files.config, *t.files.weights, *backend, 5);
  REQUIRE(big.ok());
  REQUIRE(small.ok());
  auto r1 = SequenceRunner::create(**big, *backend, 64);
  auto r2 = SequenceRunner::create(**small, *backend, 64);
  auto toks = tokens_for(29, 3);
  auto a = (*r1)->feed(toks);
  auto b = (*r2)->feed(toks);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(std::memcmp(*a, *b, t.files.config.vocab * sizeof(float)) == 0);
  std::remove(t.path.c_str());
}

TEST_CASE("bad steps are refused before any kernel runs", "[model][badinput]") {
  Tiny t = make_tiny();
  auto backend = make_cpu_backend({1});
  auto model = Model::build(t.files.config, *t.files.weights, *backend, 16);
  REQUIRE(model.ok());
  auto runner = SequenceRunner::create(**model, *backend, 32);
  REQUIRE(runner.ok());
  auto r = (*runner)->feed({1, 2, 100000});
  REQUIRE_FALSE(r.ok());
  REQUIRE_THAT(r.error().message, Catch::Contains("outside the vocabulary"));
  auto r2 = (*runner)->feed(std::vector<int32_t>(40, 5));
  REQUIRE_FALSE(r2.ok());
  REQUIRE_THAT(r2.error().message, Catch::Contains("exceeds the context"));
  REQUIRE_FALSE(SequenceRunner::create(**model, *backend, 100000).ok());
  std::remove(t.path.c_str());
}

TEST_CASE("hostile mixture-of-experts files give one-line errors", "[model][moe][badinput]") {
  auto fails_with = [](test::TinyModelSpec s, const std::string& what) {
    const std::string path = "/tmp/troupe_tiny_bad_moe_" + std::to_string(::getpid()) + ".gguf";
    REQUIRE(test::tiny_model_writer(s).write(path).ok());
    std::string err;
    auto f = open_gguf(path);
    if (!f) {
      err = f.error().message;
    } else {
      auto backend = make_cpu_backend({1});
      auto m = Model::build(f->config, *f->weights, *backend, 16);
      REQUIRE_FALSE(m.ok());
      err = m.error().message;
    }
    std::remove(path.c_str());
    INFO(err);
    CHECK(err.find('\n') == std::string::npos);
    CHECK_THAT(err, Catch::Contains(what));
  };
  test::TinyModelSpec s = spec_named("mixtral");
  SECTION("top-k above the expert count") {
    s.experts_used = 5;
    fails_with(s, "experts per token 5 must be in [1, 4]");
  }
  SECTION("a huge expert count") {
    s.expert_count_meta = 1 << 20;
    fails_with(s, "expert count");
  }
  SECTION("a router that does not match the expert count") {
    s.expert_count_meta = 3;
    fails_with(s, "ffn_gate_inp.weight' has shape [256, 4], expected [256, 3]");
  }
  SECTION("stacked experts that do not match the expert width") {
    s.expert_ffn_meta = 96;
    fails_with(s, "ffn_gate_exps.weight' has shape [256, 128, 4], expected [256, 96, 4]");
  }
  SECTION("expert count 0 reads as dense, and the dense tensors are missing") {
    s.expert_count_meta = 0;
    fails_with(s, "missing tensor 'blk.0.ffn_gate.weight'");
  }
  SECTION("a NaN router weight") {
    s.nan_router = true;
    fails_with(s, "(the router) holds a non-finite value");
  }
}

TEST_CASE("the router decides: top-1 and top-2 of the same experts differ", "[model][moe]") {
  auto last_logits = [](const test::TinyModelSpec& s) {
    Tiny t = make_tiny(s);
    auto backend = make_cpu_backend({1});
    auto model = Model::build(t.files.config, *t.files.weights, *backend, 32);
    REQUIRE(model.ok());
    auto runner = SequenceRunner::create(**model, *backend, 64);
    REQUIRE(runner.ok());
    auto l = (*runner)->feed(tokens_for(9, 2));
    REQUIRE(l.ok());
    std::vector<float> v(*l, *l + t.files.config.vocab);
    std::remove(t.path.c_str());
    return v;
  };
  test::TinyModelSpec a = spec_named("mixtral"), b = a;
  b.experts_used = 1;
  const auto la = last_logits(a), lb = last_logits(b);
  double diff = 0, range = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(la[i] - lb[i])));
    range = std::max(range, static_cast<double>(std::fabs(la[i])));
  }
  INFO("max difference " << diff << " of range " << range);
  CHECK(diff > 0.05 * range);
}
