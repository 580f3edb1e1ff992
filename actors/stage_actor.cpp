#include "actors/stage_actor.h"

#include <chrono>

namespace troupe::actors {

Result<std::shared_ptr<StageWorker>> StageWorker::create(std::unique_ptr<Backend> backend, std::unique_ptr<Model> model,
                                                         const KvBlockConfig& kv) {
  const ModelConfig& c = model->config();
  KvCacheShape shape{model->num_stage_layers(), kv.num_blocks, kv.block_size, c.num_kv_heads, c.head_dim};
  auto cache = backend->make_kv_cache(shape);
  if (!cache) return cache.error();
  auto w = std::make_shared<StageWorker>();
  w->backend = std::move(backend);
  w->model = std::move(model);
  w->cache = std::move(*cache);
  return w;
}

Status check_step_shape(const StageStep& s, int32_t hidden, bool needs_hidden) {
  const size_t n = s.token_ids.size();
  if (n == 0 || s.positions.size() != n || s.slot_mapping.size() != n)
    return make_error("step arrays have inconsistent token counts");
  if (s.query_start.size() < 2 || s.context_lens.size() != s.query_start.size() - 1)
    return make_error("step arrays have inconsistent sequence counts");
  if (s.max_blocks_per_seq <= 0 || s.block_tables.size() != s.context_lens.size() * static_cast<size_t>(s.max_blocks_per_seq))
    return make_error("step block tables have the wrong size");
  if (s.logit_rows.size() != s.logit_seq.size()) return make_error("step logit rows and sequences differ in count");
  if (needs_hidden && s.hidden.size() != n * static_cast<size_t>(hidden))
    return make_error("step activations have the wrong size");
  return {};
}

namespace {

StepInputs inputs_of(const StageStep& s) {
  StepInputs in;
  in.num_tokens = static_cast<int32_t>(s.token_ids.size());
  in.num_seqs = static_cast<int32_t>(s.context_lens.size());
  in.token_ids = s.token_ids.data();
  in.positions = s.positions.data();
  in.query_start = s.query_start.data();
  in.context_lens = s.context_lens.data();
  in.slot_mapping = s.slot_mapping.data();
  in.block_tables = s.block_tables.data();
  in.max_blocks_per_seq = s.max_blocks_per_seq;
  return in;
}

// Last stage: logits for the logit rows, then each sequence's own sampler.
Result<StepDone> run_last(StageState& st, StageStep& s) {
  Model& m = *st.worker->model;
  const int32_t vocab = m.config().vocab;
  for (int64_t id : s.released) st.samplers.erase(id);
  for (auto& ns : s.new_seqs) {
    Sampler smp(ns.sampling, vocab);
    smp.add_prompt(ns.prompt);
    st.samplers.insert_or_assign(ns.seq_id, std::move(smp));
  }
  for (int64_t id : s.logit_seq)
    if (!st.samplers.count(id)) return make_error("step samples sequence " + std::to_string(id) + " with no sampler state");
  const int32_t rows = static_cast<int32_t>(s.logit_rows.size());
  st.logits.resize(static_cast<size_t>(rows) * vocab);
  TROUPE_TRY(m.forward_stage(inputs_of(s), *st.worker->cache, s.hidden.empty() ? nullptr : s.hidden.data(), nullptr,
                             s.logit_rows.data(), rows, st.logits.data()));
  StepDone done;
  done.step_no = s.step_no;
  for (int32_t i = 0; i < rows; ++i) {
    Sampler& smp = st.samplers.at(s.logit_seq[i]);
    SampleResult r = smp.sample(st.logits.data() + static_cast<size_t>(i) * vocab);
    smp.accept(r.token);
    done.sampled.push_back({s.logit_seq[i], std::move(r)});
  }
  return done;
}

}  // namespace

stage_actor::behavior_type stage_fn(stage_actor::stateful_pointer<StageState> self, std::shared_ptr<StageWorker> worker,
                                    stage_actor next) {
  self->state.worker = std::move(worker);
  self->state.next = std::move(next);
  return {
      [=](StageStep& s, step_sink_actor sink) {
        auto& st = self->state;
        Model& m = *st.worker->model;
        const auto t0 = std::chrono::steady_clock::now();
        if (auto ok = check_step_shape(s, m.config().hidden, !m.is_first_stage()); !ok) {
          self->send(sink, StepFailed{s.step_no, ok.error().message});
          return;
        }
        if (m.is_last_stage()) {
          auto done = run_last(st, s);
          if (!done) {
            self->send(sink, StepFailed{s.step_no, done.error().message});
            return;
          }
          done->compute_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          self->send(sink, std::move(*done));
          return;
        }
        st.hidden_out.resize(s.token_ids.size() * static_cast<size_t>(m.config().hidden));
        auto ok = m.forward_stage(inputs_of(s), *st.worker->cache, s.hidden.empty() ? nullptr : s.hidden.data(),
                                  st.hidden_out.data(), nullptr, 0, nullptr);
        if (!ok) {
          self->send(sink, StepFailed{s.step_no, ok.error().message});
          return;
        }
        s.hidden.swap(st.hidden_out);
        self->send(st.next, std::move(s), sink);
      },
  };
}

}  // namespace troupe::actors
