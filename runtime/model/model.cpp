#include "runtime/model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_ref.h"
#include "runtime/model/ffn.h"

namespace troupe {
namespace {

// Finds a 2-D tensor [rows, cols] (GGUF order: shape = {cols, rows}).
Result<const TensorRef*> matrix(const WeightSource& src, const std::string& name, int64_t rows, int64_t cols) {
  return find_matrix(src, name, rows, cols);
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
                                            int32_t max_batch_tokens, const ProgressFn& progress, LayerRange range,
                                            bool routed_experts) {
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
  m->routed_experts_ = routed_experts || !cfg.moe.enabled();
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
    for (auto* r : {&q, &k, &v, &o})
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
    if (!cfg.moe.enabled()) {
      TROUPE_TRY(build_dense_ffn(backend, src, p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight", H,
                                 cfg.ffn, p + "ffn_", L.ffn));
    } else {
      const MoeConfig& mc = cfg.moe;
      auto moe = std::make_unique<MoeLayer>();
      auto router = matrix(src, p + "ffn_gate_inp.weight", mc.num_experts, H);
      if (!router) return router.error();
      {  // (a NaN router weight would make every routing decision meaningless)
        const auto rb = row_bytes((*router)->type, static_cast<uint64_t>(H));
        if (!rb) return make_error("tensor '" + p + "ffn_gate_inp.weight' has an unsupported row size");
        std::vector<float> row(static_cast<size_t>(H));
        for (int32_t e = 0; e < mc.num_experts; ++e) {
          if (!cpu::dequantize_row_ref((*router)->type, static_cast<const uint8_t*>((*router)->data) + *rb * e,
                                       row.data(), H))
            return make_error("tensor '" + p + "ffn_gate_inp.weight' has an unsupported type");
          for (float f : row)
            if (!std::isfinite(f))
              return make_error("tensor '" + p + "ffn_gate_inp.weight' (the router) holds a non-finite value");
        }
      }
      auto wr = wrap(mk(*router, mc.num_experts), p + "ffn_gate_inp");
      if (!wr) return wr.error();
      moe->router = std::move(*wr);
      moe->experts.resize(static_cast<size_t>(mc.num_experts));
      const int64_t F = mc.expert_ffn;
      if (routed_experts)  // (else expert workers hold them: Model::set_expert_dispatcher)
        for (int32_t e = 0; e < mc.num_experts; ++e)
          TROUPE_TRY(build_expert_ffn(backend, src, i, e, mc.num_experts, H, F, moe->experts[e]));
      if (mc.shared_ffn > 0) {
        const int64_t S = mc.shared_ffn;
        TROUPE_TRY(build_dense_ffn(backend, src, p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight",
                                   p + "ffn_down_shexp.weight", H, S, p + "ffn_shexp_", moe->shared));
        if (mc.shared_gate) {
          // GGUF stores the shared expert's gate as a vector [hidden], HF as a matrix [1, hidden].
          const std::string gn = p + "ffn_gate_inp_shexp.weight";
          const TensorRef* t = src.find(gn);
          if (!t) return make_error("missing tensor '" + gn + "'");
          if (!((t->shape.size() == 1 && t->shape[0] == H) ||
                (t->shape.size() == 2 && t->shape[0] == H && t->shape[1] == 1)))
            return make_error("tensor '" + gn + "' has shape " + shape_str(t->shape) + ", expected [" +
                              std::to_string(H) + "]");
          auto w = wrap(backend.make_weight(t->type, H, {{t->data, 1}}), p + "ffn_gate_inp_shexp");
          if (!w) return w.error();
          moe->shared_gate = std::move(*w);
        }
      }
      L.moe = std::move(moe);
    }
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
    if (cfg.qk_norm != ModelConfig::QkNorm::None) {
      const bool per_head = cfg.qk_norm == ModelConfig::QkNorm::PerHead;
      auto qn = vector_f32(src, p + "attn_q_norm.weight", per_head ? cfg.head_dim : q_rows);
      if (!qn) return qn.error();
      auto kn = vector_f32(src, p + "attn_k_norm.weight", per_head ? cfg.head_dim : kv_rows);
      if (!kn) return kn.error();
      L.q_norm = backend.upload(*qn);
      L.k_norm = backend.upload(*kn);
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
  const int64_t F = std::max<int64_t>({cfg.ffn, cfg.moe.expert_ffn, cfg.moe.shared_ffn});
  m->gu_ = backend.alloc(T * 2 * F);
  m->act_ = backend.alloc(T * F);
  if (cfg.moe.enabled()) {
    const size_t slots = T * static_cast<size_t>(cfg.moe.experts_per_tok + 1);
    m->router_ = backend.alloc(T * cfg.moe.num_experts);
    m->moe_x_ = backend.alloc(slots * H);
    m->moe_y_ = backend.alloc(slots * H);
    m->moe_ffns_.reserve(static_cast<size_t>(cfg.moe.num_experts));
    m->moe_group_counts_.reserve(static_cast<size_t>(cfg.moe.num_experts));
    if (backend.groups_matmuls()) {  // every routed row's gate/up and activation at once
      const size_t routed = T * static_cast<size_t>(cfg.moe.experts_per_tok);
      m->moe_gu_ = backend.alloc(routed * 2 * static_cast<size_t>(cfg.moe.expert_ffn));
      m->moe_act_ = backend.alloc(routed * static_cast<size_t>(cfg.moe.expert_ffn));
    }
    m->shared_gate_ = backend.alloc(T);
    m->router_host_.resize(T * cfg.moe.num_experts);
    m->shared_gate_host_.resize(T);
    m->moe_weights_.resize(slots);
    m->moe_rows_.resize(slots);
    m->moe_src_.resize(slots);
    m->moe_count_.resize(static_cast<size_t>(cfg.moe.num_experts));
    m->moe_offset_.resize(static_cast<size_t>(cfg.moe.num_experts) + 1);
    m->moe_cursor_.resize(static_cast<size_t>(cfg.moe.num_experts));
    m->moe_combine_src_.resize(slots);
  }
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

void Model::run_ffn(const Ffn& f, const float* x, int64_t n, int64_t ffn, float* y) {
  troupe::run_ffn(*backend_, f, x, n, ffn, cfg_.hidden, gu_, act_, y);
}

// The MoE block: router logits come back to the host, which picks each token's experts
// (softmax, top-k with ties to the lower id, renormalised if the config says so) and groups
// the tokens by expert; each expert then runs once over its gathered rows, and the combine
// sums a token's expert outputs in its top-k order (then the gated shared expert), so the
// bits do not depend on which other tokens share the step.
void Model::set_expert_dispatcher(ExpertDispatcher* d) {
  dispatcher_ = d;
  if (d && cfg_.moe.enabled() && !backend_->is_host_memory()) {
    const size_t rows = static_cast<size_t>(max_tokens_) * static_cast<size_t>(cfg_.moe.experts_per_tok);
    moe_x_host_.resize(rows * static_cast<size_t>(cfg_.hidden));
    moe_y_host_.resize(rows * static_cast<size_t>(cfg_.hidden));
  }
}

Status Model::run_moe(const MoeLayer& m, int32_t layer, int64_t n) {
  Backend& be = *backend_;
  const MoeConfig& mc = cfg_.moe;
  const int64_t H = cfg_.hidden, E = mc.num_experts;
  const int32_t k = mc.experts_per_tok;
  const bool shared = m.shared.down != nullptr;
  const int32_t slots = k + (shared ? 1 : 0);
  be.matmul(*m.router, h_, n, router_, E);
  if (m.shared_gate) be.matmul(*m.shared_gate, h_, n, shared_gate_, 1);
  be.copy_out(router_host_.data(), router_, static_cast<size_t>(n * E));
  if (m.shared_gate) be.copy_out(shared_gate_host_.data(), shared_gate_, static_cast<size_t>(n));
  std::fill(moe_count_.begin(), moe_count_.end(), 0);
  std::vector<int32_t>& sel = moe_src_;  // first the chosen expert ids [n, k], then their rows
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = router_host_.data() + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e)
      if (std::isfinite(lg[e])) mx = std::max(mx, lg[e]);
    // Softmax over all experts, then the top k; a NaN logit sorts last and weighs nothing.
    int32_t* ids = sel.data() + t * k;
    float* w = moe_weights_.data() + t * slots;
    double sum_all = 0;
    for (int64_t e = 0; e < E; ++e) sum_all += std::isfinite(lg[e]) ? std::exp(double(lg[e]) - mx) : 0.0;
    for (int32_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int32_t i = 0; i < j; ++i) taken |= ids[i] == e;
        if (taken) continue;
        if (best < 0 || (std::isfinite(lg[e]) && (!std::isfinite(lg[best]) || lg[e] > lg[best]))) best = e;
      }
      ids[j] = best;
      const float p =
          std::isfinite(lg[best]) && sum_all > 0 ? static_cast<float>(std::exp(double(lg[best]) - mx) / sum_all) : 0.0f;
      w[j] = p;
      ++moe_count_[best];
    }
    if (mc.norm_topk_prob) {
      float s = 0;
      for (int32_t j = 0; j < k; ++j) s += w[j];
      if (s > 0)
        for (int32_t j = 0; j < k; ++j) w[j] /= s;
    }
    if (shared) w[k] = m.shared_gate ? 1.0f / (1.0f + std::exp(-shared_gate_host_[t])) : 1.0f;
  }
  // Expert-major order: expert e's rows start at moe_offset_[e], tokens ascending.
  moe_offset_[0] = 0;
  for (int64_t e = 0; e < E; ++e) moe_offset_[e + 1] = moe_offset_[e] + moe_count_[e];
  std::vector<int32_t>& cursor = moe_cursor_;  // (scratch sized at build: no allocation per layer)
  std::copy(moe_offset_.begin(), moe_offset_.end() - 1, cursor.begin());
  for (int64_t t = 0; t < n; ++t)
    for (int32_t j = 0; j < k; ++j) {
      const int32_t e = sel[t * k + j];
      const int32_t r = cursor[e]++;
      moe_rows_[r] = static_cast<int32_t>(t);
      sel[t * k + j] = r;  // (now the row of the expert output)
    }
  // The combine's rows [n, slots]: routed rows, then the shared expert's row n k + t.
  std::vector<int32_t>& src = moe_combine_src_;
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t j = 0; j < k; ++j) src[t * slots + j] = sel[t * k + j];
    if (shared) src[t * slots + k] = static_cast<int32_t>(n * k + t);
  }
  be.gather_rows(h_, H, moe_rows_.data(), n * k, moe_x_);
  if (moe_stats_) moe_stats_->add_routing(layer, moe_count_.data());
  if (dispatcher_) {
    // Expert parallelism: the gathered rows go to the expert workers (through the host on a
    // device backend) and their outputs come back into the same rows.
    const bool host = be.is_host_memory();
    const size_t cnt = static_cast<size_t>(n * k * H);
    if (!host) be.copy_out(moe_x_host_.data(), moe_x_, cnt);
    TROUPE_TRY(be.sync());
    ExpertWork w{layer,
                 static_cast<int32_t>(E),
                 H,
                 moe_offset_.data(),
                 host ? moe_x_ : moe_x_host_.data(),
                 host ? moe_y_ : moe_y_host_.data()};
    TROUPE_TRY(dispatcher_->run(w));
    if (!host) be.copy_in(moe_y_, moe_y_host_.data(), cnt);
  } else {
    if (!routed_experts_) return make_error("this model was built without its routed experts and has no dispatcher");
    // The experts with rows, in id order: their rows follow each other from row 0.
    moe_ffns_.clear();
    moe_group_counts_.clear();
    for (int64_t e = 0; e < E; ++e)
      if (moe_count_[e] > 0) {
        moe_ffns_.push_back(&m.experts[e]);
        moe_group_counts_.push_back(moe_count_[e]);
      }
    run_ffn_group(be, moe_ffns_.data(), moe_group_counts_.data(), static_cast<int64_t>(moe_ffns_.size()), moe_x_,
                  mc.expert_ffn, H, moe_gu_ ? moe_gu_ : gu_, moe_gu_ ? moe_act_ : act_, moe_y_);
  }
  if (shared) run_ffn(m.shared, h_, n, mc.shared_ffn, moe_y_ + n * k * H);
  const auto t0 = std::chrono::steady_clock::now();
  be.moe_combine(moe_y_, H, src.data(), moe_weights_.data(), n, slots, h_);
  if (moe_stats_ && dispatcher_)
    moe_stats_->add_combine(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return {};
}

Status Model::forward(const StepInputs& s, KvCache& cache, const int32_t* rows, int32_t num_logits, float* logits,
                      const DeviceSampling* sampling) {
  if (!is_first_stage() || !is_last_stage()) return make_error("forward() needs the whole model; use forward_stage()");
  return forward_stage(s, cache, nullptr, nullptr, rows, num_logits, logits, sampling);
}

Status Model::forward_stage(const StepInputs& s, KvCache& cache, const float* hidden_in, float* hidden_out,
                            const int32_t* rows, int32_t num_logits, float* logits, const DeviceSampling* sampling) {
  return run(s, cache, hidden_in, hidden_out, rows, num_logits, logits, sampling, num_stage_layers());
}

Status Model::forward_draft(const StepInputs& s, KvCache& cache, int32_t layers, const int32_t* rows,
                            int32_t num_logits, float* logits) {
  if (!is_first_stage() || !is_last_stage()) return make_error("a self-draft needs the whole model in one stage");
  if (layers < 1 || layers > num_stage_layers())
    return make_error("a self-draft runs 1.." + std::to_string(num_stage_layers()) + " layers, not " +
                      std::to_string(layers));
  if (num_logits > 0 && !logits) return make_error("forward_draft(): a logits buffer is needed");
  return run(s, cache, nullptr, nullptr, rows, num_logits, logits, nullptr, layers);
}

Status Model::run(const StepInputs& s, KvCache& cache, const float* hidden_in, float* hidden_out, const int32_t* rows,
                  int32_t num_logits, float* logits, const DeviceSampling* sampling, int32_t num_layers) {
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
  for (int32_t l = 0; l < num_layers; ++l) {
    Layer& L = layers_[l];
    // (each norm names the matmul that reads its output next: see Backend::rms_norm)
    const Weight* attn_in = L.qkv ? L.qkv.get() : L.q.get();
    if (l == 0)
      be.rms_norm(x_, L.attn_norm, cfg_.rms_eps, n, H, h_, attn_in);
    else
      be.add_rms_norm(x_, h_, L.attn_norm, cfg_.rms_eps, n, H, h_, attn_in);
    if (L.qkv && !L.qkv_bias && !L.q_norm) {
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
      if (L.q_norm) {
        const bool per_head = cfg_.qk_norm == ModelConfig::QkNorm::PerHead;
        be.rms_norm_strided(qkv_, qkv_ld, n, per_head ? cfg_.num_heads : 1, per_head ? hd : q_rows, L.q_norm,
                            cfg_.rms_eps);
        be.rms_norm_strided(qkv_ + q_rows, qkv_ld, n, per_head ? cfg_.num_kv_heads : 1, per_head ? hd : kv_rows,
                            L.k_norm, cfg_.rms_eps);
      }
      be.rope_kv_write(cache, l, qkv_, qkv_ld, n, cfg_.num_heads, cfg_.num_kv_heads, hd, cos_sin_, cfg_.rope_kind);
    }
    be.attention(cache, l, qkv_, qkv_ld, cfg_.num_heads, scale, attn_, L.o.get());
    be.matmul(*L.o, attn_, n, h_, H);
    if (L.moe) {
      be.add_rms_norm(x_, h_, L.ffn_norm, cfg_.rms_eps, n, H, h_, nullptr);
      TROUPE_TRY(run_moe(*L.moe, first_layer_ + l, n));
    } else {
      be.add_rms_norm(x_, h_, L.ffn_norm, cfg_.rms_eps, n, H, h_,
                      L.ffn.gate_up ? L.ffn.gate_up.get() : L.ffn.gate.get());
      run_ffn(L.ffn, h_, n, cfg_.ffn, h_);
    }
  }
  if (num_layers > 0) be.add(x_, h_, n * H);
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
