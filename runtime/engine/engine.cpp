#include "runtime/engine/engine.h"

#include <algorithm>

#include "runtime/sample/speculative.h"

namespace troupe {

StepInputs PlannedStep::inputs() const {
  StepInputs s;
  s.num_tokens = static_cast<int32_t>(token_ids.size());
  s.num_seqs = static_cast<int32_t>(context_lens.size());
  s.token_ids = token_ids.data();
  s.positions = positions.data();
  s.query_start = query_start.data();
  s.context_lens = context_lens.data();
  s.slot_mapping = slot_mapping.data();
  s.block_tables = block_tables.data();
  s.max_blocks_per_seq = max_blocks_per_seq;
  return s;
}

Result<PlannedStep> plan_step(const StepPlan& plan, const Scheduler& sched, const KvBlockManager& kv) {
  return plan_step(plan, sched, kv.config().block_size, [&](int64_t id) { return kv.block_table(id); });
}

Result<PlannedStep> plan_step(const StepPlan& plan, const Scheduler& sched, int32_t bs, const BlockTableFn& table) {
  PlannedStep p;
  if (bs <= 0) return make_error("block size must be positive");
  for (const auto& q : plan.seqs) {
    const auto* bt = table(q.id);
    if (!bt) return make_error("step plan names unknown sequence " + std::to_string(q.id));
    p.max_blocks_per_seq = std::max(p.max_blocks_per_seq, static_cast<int32_t>(bt->size()));
  }
  p.query_start.push_back(0);
  for (const auto& q : plan.seqs) {
    const SchedState* s = sched.state(q.id);
    const auto* bt = table(q.id);
    const int32_t known = s ? static_cast<int32_t>(s->tokens.size()) : 0;
    const int32_t drafts = static_cast<int32_t>(q.drafts.size());
    // (drafts follow the last known token, in the same step)
    if (!s || q.num_computed < 0 || q.num_new < 1 + drafts || q.num_computed + q.num_new > known + drafts ||
        (drafts > 0 && (!q.samples || q.num_computed + q.num_new != known + drafts)) ||
        blocks_for_tokens(q.num_computed + q.num_new, bs) > static_cast<int32_t>(bt->size()))
      return make_error("step plan for sequence " + std::to_string(q.id) + " does not match its state");
    for (int32_t i = 0; i < q.num_new; ++i) {
      const int32_t pos = q.num_computed + i;
      p.token_ids.push_back(pos < known ? s->tokens[pos] : q.drafts[pos - known]);
      p.positions.push_back(pos);
      p.slot_mapping.push_back((*bt)[pos / bs] * bs + pos % bs);
    }
    p.query_start.push_back(static_cast<int32_t>(p.token_ids.size()));
    p.context_lens.push_back(q.num_computed + q.num_new);
    for (int32_t b = 0; b < p.max_blocks_per_seq; ++b)
      p.block_tables.push_back(b < static_cast<int32_t>(bt->size()) ? (*bt)[b] : 0);
    for (int32_t r = q.logit_rows(); r > 0; --r) {  // the last token's row, then one per draft
      p.logit_rows.push_back(p.query_start.back() - r);
      p.logit_seq.push_back(q.id);
    }
  }
  return p;
}

Result<std::unique_ptr<Engine>> Engine::create(Model& model, Backend& backend, const EngineConfig& cfg,
                                               SchedulingPolicy policy, std::function<bool(int32_t)> is_stop) {
  const ModelConfig& c = model.config();
  if (cfg.scheduler.max_batched_tokens > model.max_batch_tokens())
    return make_error("token budget " + std::to_string(cfg.scheduler.max_batched_tokens) +
                      " exceeds the model's max batch of " + std::to_string(model.max_batch_tokens()));
  auto e = std::unique_ptr<Engine>(new Engine());
  e->model_ = &model;
  KvCacheShape shape{c.num_layers, cfg.kv.num_blocks, cfg.kv.block_size, c.num_kv_heads, c.head_dim};
  auto cache = backend.make_kv_cache(shape);
  if (!cache) return cache.error();
  e->cache_ = std::move(*cache);
  e->kv_ = std::make_unique<KvBlockManager>(cfg.kv);
  e->sched_ = std::make_unique<Scheduler>(cfg.scheduler, *e->kv_, std::move(policy));
  e->is_stop_ = std::move(is_stop);
  return e;
}

Status Engine::add(SeqRequest r) {
  const int32_t vocab = model_->config().vocab;
  TROUPE_TRY(r.validate(vocab, model_->config().max_context));
  Sampler s(r.sampling, vocab);
  s.add_prompt(r.prompt);
  const int64_t id = r.id;
  TROUPE_TRY(sched_->add(std::move(r)));
  samplers_.emplace(id, std::move(s));
  return {};
}

void Engine::abort(int64_t id) {
  sched_->abort(id);
  samplers_.erase(id);
}

Result<std::vector<EngineEvent>> Engine::step() {
  last_plan_ = sched_->schedule();
  const StepPlan& plan = last_plan_;
  std::vector<EngineEvent> events;
  if (plan.seqs.empty()) return events;
  if (!plan.copies.empty()) return make_error("block copies are not supported by this engine yet");
  auto ps = plan_step(plan, *sched_, *kv_);
  if (!ps) return ps.error();
  if (draft_ && draft_->self_draft_layers() > 0 && SelfDrafter::wants_drafts(ps->inputs()))
    TROUPE_TRY(drafter_.fill(*model_, *cache_, draft_->self_draft_layers(), ps->inputs(), ps->token_ids.data()));
  const int32_t vocab = model_->config().vocab;
  const size_t rows = ps->logit_rows.size();
  logits_.resize(rows * static_cast<size_t>(vocab));
  // Rows whose sampler allows it are sampled on the device when the backend can.
  std::vector<DeviceSampleParams> dev_params;
  std::vector<int32_t> dev_tokens(rows, -1);
  std::vector<float> dev_logprobs(rows, 0.0f);
  DeviceSampling ds;
  if (model_->samples_on_device()) {
    // (a sequence verifying drafts has several rows: its sampler draws them in turn, here)
    for (size_t i = 0; i < rows; ++i)
      dev_params.push_back(verifies_drafts(ps->logit_seq, i) ? DeviceSampleParams{}
                                                             : samplers_.at(ps->logit_seq[i]).device_params());
    ds = DeviceSampling{dev_params.data(), dev_tokens.data(), dev_logprobs.data()};
  }
  TROUPE_TRY(model_->forward(ps->inputs(), *cache_, ps->logit_rows.data(), static_cast<int32_t>(rows), logits_.data(),
                             dev_params.empty() ? nullptr : &ds));
  std::vector<int32_t> sampled, counts;
  std::vector<std::pair<int64_t, SampleResult>> emitted;
  for (size_t i = 0; i < rows;) {
    const int64_t id = ps->logit_seq[i];
    const size_t n = sequence_rows(ps->logit_seq, i);  // this sequence's rows: 1 + its drafts
    Sampler& s = samplers_.at(id);
    std::vector<SampleResult> got;
    if (n > 1) {
      auto drafts = drafts_after_rows(ps->logit_rows, ps->token_ids, i, n);
      if (!drafts) return drafts.error();
      got = verify_drafts(s, *drafts, [&](size_t j) { return logits_.data() + (i + j) * vocab; });
    } else if (dev_tokens[i] >= 0) {
      auto d = s.device_draw(dev_tokens[i], dev_logprobs[i]);
      if (!d) return d.error();
      s.accept(d->token);
      got.push_back(std::move(*d));
    } else {
      got.push_back(s.sample(logits_.data() + i * vocab));
      s.accept(got.back().token);
    }
    counts.push_back(static_cast<int32_t>(got.size()));
    for (auto& r : got) {
      sampled.push_back(r.token);
      emitted.emplace_back(id, std::move(r));
    }
    i += n;
  }
  auto stop = [&](int64_t id, int32_t t) {
    const SeqRequest& r = sched_->state(id)->req;  // (still scheduled while update() asks)
    if (!r.ignore_eos && is_stop_ && is_stop_(t)) return true;
    return std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) != r.stop_token_ids.end();
  };
  auto finished = sched_->update(plan, sampled, stop, &counts);
  // One event per token the scheduler kept: a sequence that finished inside a run of
  // accepted drafts ends at its stop token or length, the tokens after it are dropped.
  std::map<int64_t, size_t> left;  // tokens each finished sequence still emits
  for (const auto& f : finished) left[f.id] = static_cast<size_t>(f.step_tokens);
  for (auto& [id, r] : emitted) {
    EngineEvent ev;
    ev.id = id;
    ev.token = r.token;
    ev.logprob = r.logprob;
    if (auto lf = left.find(id); lf != left.end()) {
      if (lf->second == 0) continue;  // past the end of a finished sequence
      if (--lf->second == 0) {
        ev.finished = true;
        for (const auto& f : finished)
          if (f.id == id) ev.hit_stop = f.hit_stop;
        samplers_.erase(id);
      }
    }
    events.push_back(ev);
  }
  return events;
}

}  // namespace troupe
