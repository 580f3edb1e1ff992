#include "runtime/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_ref.h"

namespace troupe {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Finds a 2-D tensor [rows, cols] (GGUF order: shape = {cols, rows}).
Result<const TensorRef*> matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols) {
  const TensorRef* t = src.find(name);
  if (!t) return make_error("missing tensor '" + name + "'");
  if (t->shape.size() != 2 || t->shape[0] != cols || t->shape[1] != rows)
    return make_error("tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected [" + std::to_string(cols) +
                      ", " + std::to_string(rows) + "]");
  return t;
}

Result<std::vector<float>> vector_f32(const WeightSource& src, const std::string& name, int64_t n) {
  const TensorRef* t = src.find(name);
  if (!t) return make_error("missing tensor '" + name + "'");
  if (t->shape.size() != 1 || t->shape[0] != n)
    return make_error("tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected [" + std::to_string(n) +
                      "]");
  std::vector<float> v(static_cast<size_t>(n));
  if (!cpu::dequantize_row_ref(t->type, t->data, v.data(), n))
    return make_error("tensor '" + name + "' has an unsupported type for a vector");
  for (float f : v)
    if (!std::isfinite(f)) return make_error("tensor '" + name + "' holds a non-finite value");
  return v;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::build(const ModelConfig& cfg, const WeightSource& src, Backend& backend,
                                            int32_t max_batch_tokens, const ProgressFn& progress, LayerRange range) {
  TROUPE_TRY(cfg.validate());
  if (range.last < 0) range.last = cfg.num_layers;
  if (range.first < 0 || range.first >= range.last || range.last > cfg.num_layers)
    return make_error("layer range [" + std::to_string(range.first) + ", " + std::to_string(range.last) +
                      ") is not inside the model's " + std::to_string(cfg.num_layers) + " layers");
  if (max_batch_tokens <= 0 || max_batch_tokens > (1 << 20))
    return make_error("max batch tokens " + std::to_string(max_batch_tokens) + " is out of range");
  auto m = std::unique_ptr<Model>(new Model());
  m->cfg_ = cfg;
  m->backend_ = &backend;
  m->max_tokens_ = max_batch_tokens;
  m->first_layer_ = range.first;
  m->last_layer_ = range.last;
  const int64_t H = cfg.hidden, hd = cfg.head_dim;
  const int64_t q_rows = int64_t{cfg.num_heads} * hd, kv_rows = int64_t{cfg.num_kv_heads} * hd;
  const size_t total = static_cast<size_t>(range.last - range.first) + 2;
  const bool first_stage = range.first == 0, last_stage = range.last == cfg.num_layers;
  const bool has_output = src.find("output.weight") != nullptr;
  size_t done = 0;
  auto tick = [&] {
    if (progress) progress(++done, total);
  };

  auto mk = [&](const TensorRef* t, int64_t rows) {
    return backend.make_weight(t->type, t->shape[0], {{t->data, rows}});
  };
  // The embedding table: the first stage gathers from it, a tied last stage multiplies by it.
  if (first_stage || (last_stage && cfg.tied_embeddings && !has_output)) {
    auto emb = matrix(src, "token_embd.weight", cfg.vocab, H);
    if (!emb) return emb.error();
    auto e = mk(*emb, cfg.vocab);
    if (!e) return make_error("token_embd.weight: " + e.error().message);
    m->embed_ = std::move(*e);
  }
  tick();

  for (int32_t i = range.first; i < range.last; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    Layer L;
    auto q = matrix(src, p + "attn_q.weight", q_rows, H);
    auto k = matrix(src, p + "attn_k.weight", kv_rows, H);
    auto v = matrix(src, p + "attn_v.weight", kv_rows, H);
    auto o = matrix(src, p + "attn_output.weight", H, q_rows);
    auto g = matrix(src, p + "ffn_gate.weight", cfg.ffn, H);
    auto u = matrix(src, p + "ffn_up.weight", cfg.ffn, H);
    auto d = matrix(src, p + "ffn_down.weight", H, cfg.ffn);
    for (auto* r : {&q, &k, &v, &o, &g, &u, &d})
      if (!*r) return r->error();
    auto wrap = [&](Result<std::unique_ptr<Weight>> r, const std::string& n) -> Result<std::unique_ptr<Weight>> {
      if (!r) return make_error(n + ": " + r.error().message);
      return r;
    };
    if ((*q)->type == (*k)->type && (*q)->type == (*v)->type) {
      auto w =
          wrap(backend.make_weight((*q)->type, H, {{(*q)->data, q_rows}, {(*k)->data, kv_rows}, {(*v)->data, kv_rows}}),
               p + "attn_qkv");
      if (!w) return w.error();
      L.qkv = std::move(*w);
    } else {
      auto wq = wrap(mk(*q, q_rows), p + "attn_q"), wk = wrap(mk(*k, kv_rows), p + "attn_k"),
           wv = wrap(mk(*v, kv_rows), p + "attn_v");
      if (!wq) return wq.error();
      if (!wk) return wk.error();
      if (!wv) return wv.error();
      L.q = std::move(*wq);
      L.k = std::move(*wk);
      L.v = std::move(*wv);
    }
    auto wo = wrap(mk(*o, H), p + "attn_output");
    if (!wo) return wo.error();
    L.o = std::move(*wo);
    if ((*g)->type == (*u)->type) {
      auto w =
          wrap(backend.make_weight((*g)->type, H, {{(*g)->data, cfg.ffn}, {(*u)->data, cfg.ffn}}), p + "ffn_gate_up");
      if (!w) return w.error();
      L.gate_up = std::move(*w);
    } else {
      auto wg = wrap(mk(*g, cfg.ffn), p + "ffn_gate"), wu = wrap(mk(*u, cfg.ffn), p + "ffn_up");
      if (!wg) return wg.error();
      if (!wu) return wu.error();
      L.gate = std::move(*wg);
      L.up = std::move(*wu);
    }
    auto wd = wrap(mk(*d, H), p + "ffn_down");
    if (!wd) return wd.error();
    L.down = std::move(*wd);
    auto an = vector_f32(src, p + "attn_norm.weight", H);
    if (!an) return an.error();
    auto fn = vector_f32(src, p + "ffn_norm.weight", H);
    if (!fn) return fn.error();
    L.attn_norm = backend.upload(*an);
    L.ffn_norm = backend.upload(*fn);
    if (cfg.qkv_bias) {
      auto bq = vector_f32(src, p + "attn_q.bias", q_rows);
      auto bk = vector_f32(src, p + "attn_k.bias", kv_rows);
      auto bv = vector_f32(src, p + "attn_v.bias", kv_rows);
      if (!bq) return bq.error();
      if (!bk) return bk.error();
      if (!bv) return bv.error();
      std::vector<float> bias = std::move(*bq);
      bias.insert(bias.end(), bk->begin(), bk->end());
      bias.insert(bias.end(), bv->begin(), bv->end());
      L.qkv_bias = backend.upload(bias);
    }
    m->layers_.push_back(std::move(L));
    tick();
  }

  if (last_stage) {
    auto on = vector_f32(src, "output_norm.weight", H);
    if (!on) return on.error();
    m->output_norm_ = backend.upload(*on);
  }
  if (last_stage && (!cfg.tied_embeddings || has_output)) {
    auto out = matrix(src, "output.weight", cfg.vocab, H);
    if (!out) return out.error();
    auto w = mk(*out, cfg.vocab);
    if (!w) return make_error("output.weight: " + w.error().message);
    m->output_ = std::move(*w);
  }
  tick();

  m->inv_freq_ = cfg.rope_inv_freq();
  const size_t T = static_cast<size_t>(max_batch_tokens);
  m->x_ = backend.alloc(T * H);
  m->h_ = backend.alloc(T * std::max<int64_t>(H, q_rows));
  m->qkv_ = backend.alloc(T * (q_rows + 2 * kv_rows));
  m->attn_ = backend.alloc(T * q_rows);
  m->gu_ = backend.alloc(T * 2 * cfg.ffn);
  m->act_ = backend.alloc(T * cfg.ffn);
  m->cos_sin_ = backend.alloc(T * hd);
  m->last_ = backend.alloc(T * H);
  m->cos_sin_host_.resize(T * hd);
  if (last_stage && !backend.is_host_memory())
    m->logits_dev_ = backend.alloc(static_cast<size_t>(std::min(max_batch_tokens, kLogitChunk)) * cfg.vocab);
  TROUPE_TRY(backend.sync());  // a failed device allocation surfaces here
  return m;
}

Status Model::validate_step(const StepInputs& s, const KvCache& cache, const int32_t* rows, int32_t n) const {
  const KvCacheShape& ks = cache.shape();
  if (ks.num_layers != num_stage_layers() || ks.num_kv_heads != cfg_.num_kv_heads || ks.head_dim != cfg_.head_dim)
    return make_error("KV cache shape does not match the model");
  if (s.num_tokens <= 0 || s.num_tokens > max_tokens_)
    return make_error("step has " + std::to_string(s.num_tokens) + " tokens (limit " + std::to_string(max_tokens_) +
                      ")");
  if (s.num_seqs <= 0 || s.num_seqs > s.num_tokens || s.query_start[0] != 0 ||
      s.query_start[s.num_seqs] != s.num_tokens)
    return make_error("step sequence offsets are inconsistent");
  if (n < 0 || n > s.num_tokens) return make_error("bad number of logit rows");
  for (int32_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= s.num_tokens) return make_error("logit row out of range");
  const int64_t num_slots = int64_t{ks.num_blocks} * ks.block_size;
  for (int32_t q = 0; q < s.num_seqs; ++q) {
    if (s.query_start[q + 1] <= s.query_start[q]) return make_error("sequence with no tokens in step");
    const int32_t ctx = s.context_lens[q];
    if (ctx <= 0 || ctx > cfg_.max_context)
      return make_error("context length " + std::to_string(ctx) + " exceeds the model's " +
                        std::to_string(cfg_.max_context));
    const int32_t nblocks = (ctx + ks.block_size - 1) / ks.block_size;
    if (nblocks > s.max_blocks_per_seq) return make_error("block table too short for the context");
    const int32_t* bt = s.block_tables + int64_t{q} * s.max_blocks_per_seq;
    for (int32_t b = 0; b < nblocks; ++b)
      if (bt[b] < 0 || bt[b] >= ks.num_blocks) return make_error("block id " + std::to_string(bt[b]) + " out of range");
    for (int32_t t = s.query_start[q]; t < s.query_start[q + 1]; ++t) {
      if (s.token_ids[t] < 0 || s.token_ids[t] >= cfg_.vocab)
        return make_error("token id " + std::to_string(s.token_ids[t]) + " is outside the vocabulary");
      if (s.positions[t] < 0 || s.positions[t] >= ctx) return make_error("token position outside its context");
      if (s.slot_mapping[t] < 0 || s.slot_mapping[t] >= num_slots) return make_error("KV slot out of range");
      const int32_t expect = bt[s.positions[t] / ks.block_size] * ks.block_size + s.positions[t] % ks.block_size;
      if (s.slot_mapping[t] != expect) return make_error("KV slot does not match the block table");
    }
  }
  return {};
}

Status Model::forward(const StepInputs& s, KvCache& cache, const int32_t* rows, int32_t num_logits, float* logits,
                      const DeviceSampling* sampling) {
  if (!is_first_stage() || !is_last_stage()) return make_error("forward() needs the whole model; use forward_stage()");
  return forward_stage(s, cache, nullptr, nullptr, rows, num_logits, logits, sampling);
}

Status Model::forward_stage(const StepInputs& s, KvCache& cache, const float* hidden_in, float* hidden_out,
                            const int32_t* rows, int32_t num_logits, float* logits, const DeviceSampling* sampling) {
  TROUPE_TRY(validate_step(s, cache, rows, num_logits));
  const bool dev_sample =
      sampling && sampling->params && sampling->tokens && sampling->logprobs && backend_->can_sample();
  auto on_device = [&](int32_t i) { return dev_sample && sampling->params[i].on_device != 0; };
  for (int32_t i = 0; i < num_logits; ++i)
    if (!on_device(i) && !logits)
      return make_error("forward(): a logits buffer is needed for rows sampled on the host");
  if (!is_first_stage() && !hidden_in)
    return make_error("a later pipeline stage needs the previous stage's activations");
  if (!is_last_stage() && !hidden_out) return make_error("a pipeline stage before the last needs an activation buffer");
  Backend& be = *backend_;
  const int64_t n = s.num_tokens, H = cfg_.hidden, hd = cfg_.head_dim;
  const int64_t q_rows = int64_t{cfg_.num_heads} * hd, kv_rows = int64_t{cfg_.num_kv_heads} * hd;
  const int64_t qkv_ld = q_rows + 2 * kv_rows;
  be.begin_step(s);
  // RoPE angles once per step, shared by every layer. Unscaled RoPE steps theta by a
  // float ratio as GGML does (bit-compatible angles); scaled RoPE uses the table.
  const bool plain = cfg_.rope_scaling.type.empty() && cfg_.rope_freq_factors.empty();
  const float ratio = std::pow(cfg_.rope_theta, -2.0f / static_cast<float>(hd));
  for (int64_t t = 0; t < n; ++t) {
    float theta = static_cast<float>(s.positions[t]);
    for (int64_t i = 0; i < hd / 2; ++i) {
      const float th = plain ? theta : static_cast<float>(s.positions[t]) * inv_freq_[i];
      cos_sin_host_[t * hd + 2 * i] = std::cos(th);
      cos_sin_host_[t * hd + 2 * i + 1] = std::sin(th);
      theta *= ratio;
    }
  }
  be.copy_in(cos_sin_, cos_sin_host_.data(), static_cast<size_t>(n * hd));
  if (is_first_stage())
    be.embed(*embed_, s.token_ids, n, x_);
  else
    be.copy_in(x_, hidden_in, static_cast<size_t>(n * H));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Each residual add is fused into the norm that follows it; h_ holds the previous
  // layer's FFN output until the next layer's attention norm (or the end) adds it.
  for (int32_t l = 0; l < num_stage_layers(); ++l) {
    Layer& L = layers_[l];
    // (each norm names the matmul that reads its output next: see Backend::rms_norm)
    const Weight* attn_in = L.qkv ? L.qkv.get() : L.q.get();
    if (l == 0)
      be.rms_norm(x_, L.attn_norm, cfg_.rms_eps, n, H, h_, attn_in);
    else
      be.add_rms_norm(x_, h_, L.attn_norm, cfg_.rms_eps, n, H, h_, attn_in);
    if (L.qkv && !L.qkv_bias) {
      be.matmul_rope_kv_write(*L.qkv, h_, cache, l, qkv_, qkv_ld, n, cfg_.num_heads, cfg_.num_kv_heads, hd, cos_sin_,
                              cfg_.rope_kind);
    } else {
      if (L.qkv) {
        be.matmul(*L.qkv, h_, n, qkv_, qkv_ld);
      } else {
        be.matmul(*L.q, h_, n, qkv_, qkv_ld);
        be.matmul(*L.k, h_, n, qkv_ + q_rows, qkv_ld);
        be.matmul(*L.v, h_, n, qkv_ + q_rows + kv_rows, qkv_ld);
      }
      if (L.qkv_bias) be.add_bias(qkv_, qkv_ld, L.qkv_bias, n, qkv_ld);
      be.rope_kv_write(cache, l, qkv_, qkv_ld, n, cfg_.num_heads, cfg_.num_kv_heads, hd, cos_sin_, cfg_.rope_kind);
    }
    be.attention(cache, l, qkv_, qkv_ld, cfg_.num_heads, scale, attn_, L.o.get());
    be.matmul(*L.o, attn_, n, h_, H);
    be.add_rms_norm(x_, h_, L.ffn_norm, cfg_.rms_eps, n, H, h_, L.gate_up ? L.gate_up.get() : L.gate.get());
    if (L.gate_up) {
      be.matmul_silu(*L.gate_up, h_, n, cfg_.ffn, gu_, act_, L.down.get());
    } else {
      be.matmul(*L.gate, h_, n, gu_, 2 * cfg_.ffn);
      be.matmul(*L.up, h_, n, gu_ + cfg_.ffn, 2 * cfg_.ffn);
      be.silu_mul(gu_, n, cfg_.ffn, act_, L.down.get());
    }
    be.matmul(*L.down, act_, n, h_, H);
  }
  if (num_stage_layers() > 0) be.add(x_, h_, n * H);
  if (!is_last_stage()) {
    be.copy_out(hidden_out, x_, static_cast<size_t>(n * H));
    return be.sync();
  }
  if (num_logits == 0) return be.sync();
  be.gather_rows(x_, H, rows, num_logits, last_);
  const Weight& out_w = output_ ? *output_ : *embed_;
  // (the logits' matmul reads h_ in chunks on the device: only one chunk can use the hint)
  be.rms_norm(last_, output_norm_, cfg_.rms_eps, num_logits, H, h_, num_logits <= kLogitChunk ? &out_w : nullptr);
  if (sampling && sampling->tokens) std::fill(sampling->tokens, sampling->tokens + num_logits, -1);
  if (be.is_host_memory()) {
    be.matmul(out_w, h_, num_logits, logits, cfg_.vocab);
  } else {
    // Logits come back in chunks so the device buffer stays small for large vocabularies;
    // a chunk's rows sampled on the device send back only their tokens.
    for (int32_t r = 0; r < num_logits; r += kLogitChunk) {
      const int32_t cnt = std::min(kLogitChunk, num_logits - r);
      be.matmul(out_w, h_ + int64_t{r} * H, cnt, logits_dev_, cfg_.vocab);
      bool any_dev = false, any_host = false;
      for (int32_t i = r; i < r + cnt; ++i) (on_device(i) ? any_dev : any_host) = true;
      if (any_dev) {
        // Rows the host samples ride along as cheap greedy rows, their results dropped.
        chunk_params_.assign(sampling->params + r, sampling->params + r + cnt);
        for (int32_t i = 0; i < cnt; ++i)
          if (!on_device(r + i)) chunk_params_[i] = DeviceSampleParams{};
        TROUPE_TRY(be.sample(logits_dev_, cnt, cfg_.vocab, chunk_params_.data(), sampling->tokens + r,
                             sampling->logprobs + r));
        for (int32_t i = r; i < r + cnt; ++i)
          if (!on_device(i)) sampling->tokens[i] = -1;
      }
      if (any_host) be.copy_out(logits + int64_t{r} * cfg_.vocab, logits_dev_, static_cast<size_t>(cnt) * cfg_.vocab);
    }
  }
  return be.sync();
}

}  // namespace troupe
