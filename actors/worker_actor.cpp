#include "actors/worker_actor.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>

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
  if (s.max_blocks_per_seq <= 0 ||
      s.block_tables.size() != s.context_lens.size() * static_cast<size_t>(s.max_blocks_per_seq))
    return make_error("step block tables have the wrong size");
  if (s.logit_rows.size() != s.logit_seq.size()) return make_error("step logit rows and sequences differ in count");
  if (!s.sampling.empty() && s.sampling.size() != s.logit_rows.size())
    return make_error("step sampling settings and logit rows differ in count");
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

// This stage's layers over the step: activations into `out` (middle stages) or, on the
// last stage, the logits of the logit rows into done.logits -- or, for the rows the stage
// actor marked and when the backend samples on the device, their tokens into
// done.device_tokens (logits stay empty when every row was sampled there).
Status run_layers(WorkerState& st, StageStep& s, LayersDone& done) {
  Model& m = *st.device->model;
  TROUPE_TRY(check_step_shape(s, m.config().hidden, !m.is_first_stage()));
  if (SelfDrafter::wants_drafts(inputs_of(s))) {
    // (the drafts go into the step's tokens: the last stage's verifier reads them there)
    if (st.device->self_draft_layers <= 0)
      return make_error("the step carries self-draft placeholders but this worker does not self-draft");
    const auto t0 = std::chrono::steady_clock::now();
    TROUPE_TRY(st.drafter.fill(m, *st.device->cache, st.device->self_draft_layers, inputs_of(s), s.token_ids.data()));
    done.draft_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const float* in = s.hidden.empty() ? nullptr : s.hidden.data();
  if (m.is_last_stage()) {
    const int32_t rows = static_cast<int32_t>(s.logit_rows.size());
    const size_t vocab = static_cast<size_t>(m.config().vocab);
    if (!s.sampling.empty() && m.samples_on_device()) {
      bool all = true;
      for (const auto& p : s.sampling) all = all && p.on_device != 0;
      done.device_tokens.assign(static_cast<size_t>(rows), -1);
      done.device_logprobs.assign(static_cast<size_t>(rows), 0.0f);
      done.logits.resize(all ? 0 : static_cast<size_t>(rows) * vocab);
      DeviceSampling ds{s.sampling.data(), done.device_tokens.data(), done.device_logprobs.data()};
      return m.forward_stage(inputs_of(s), *st.device->cache, in, nullptr, s.logit_rows.data(), rows,
                             all ? nullptr : done.logits.data(), &ds);
    }
    done.logits.resize(static_cast<size_t>(rows) * vocab);
    return m.forward_stage(inputs_of(s), *st.device->cache, in, nullptr, s.logit_rows.data(), rows, done.logits.data());
  }
  st.out.resize(s.token_ids.size() * static_cast<size_t>(m.config().hidden));
  return m.forward_stage(inputs_of(s), *st.device->cache, in, st.out.data(), nullptr, 0, nullptr);
}

}  // namespace

namespace {
std::atomic<bool> g_hangs_released{false};  // (--debug-hang-step: set once, at shutdown)
}  // namespace

void release_injected_hangs() { g_hangs_released.store(true); }

worker_actor::behavior_type worker_fn(worker_actor::stateful_pointer<WorkerState> self,
                                      std::shared_ptr<StageWorker> device) {
  self->state.device = std::move(device);
  return {
      [=](StageStep& s) -> LayersDone {
        auto& st = self->state;
        const auto t0 = std::chrono::steady_clock::now();
        LayersDone done;
        Status ok;
        try {
          if (st.device->fail_step != 0 && s.step_no == st.device->fail_step) {
            ok = make_error("injected fault: step " + std::to_string(s.step_no) + " fails (--debug-fail-step)");
          } else if (st.device->hang_step != 0 && s.step_no == st.device->hang_step) {
            while (!g_hangs_released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            ok = make_error("injected hang: step " + std::to_string(s.step_no) +
                            " released at shutdown (--debug-hang-step)");
          } else {
            ok = run_layers(st, s, done);
          }
        } catch (const std::exception& e) {  // (bad_alloc, ...): this step fails, the worker lives on
          ok = make_error(std::string("worker: ") + e.what());
        }
        if (!ok) {
          done.error = ok.error().message;
          done.logits.clear();
          done.device_tokens.clear();
          done.device_logprobs.clear();
        } else if (!st.device->model->is_last_stage()) {
          s.hidden.swap(st.out);  // the step travels on with this stage's activations
        } else {
          s.hidden.clear();  // the last stage's answer carries logits, not the activations back
        }
        done.compute_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        done.step = std::move(s);
        return done;
      },
  };
}

}  // namespace troupe::actors
