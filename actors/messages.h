// The messages that travel between Troupe's actors, and the actors' typed interfaces.
//
// Every message is a value: ids, token ids, numbers and float activations, never a pointer
// into another actor's memory, so a stage can later live in another process (the wire form
// is schema/troupe.capnp through actors/codec.h). The interfaces are declared here, first,
// so that each actor file only implements one of them.
#pragma once
#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kv_ledger.h"
#include "runtime/sampler.h"

namespace troupe::actors {

// ---- request actor ⇄ scheduler actor -------------------------------------------------

// One sequence to generate (a request with n choices submits n of them).
struct SubmitSeq {
  int64_t seq_id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 16;
  int32_t priority = 0;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};

struct CancelSeqs {
  std::vector<int64_t> seq_ids;
};

// One sampled token of one sequence, or the sequence's end (error non-empty: refused or failed).
struct SeqEvent {
  int64_t seq_id = 0;
  int32_t token = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
  bool finished = false;
  bool hit_stop = false;       // finished on a stop token (else length)
  double queue_seconds = 0;    // first event: submission to first scheduled step
  std::string error;
};

// ---- scheduler actor ⇄ pipeline stages -------------------------------------------------

// A sequence the last stage has not seen yet: its sampler state starts here.
struct NewSeqSampling {
  int64_t seq_id = 0;
  SamplingParams sampling;
  std::vector<int32_t> prompt;  // for the repetition penalty
};

// One step plan, flattened (runtime/engine.h PlannedStep) plus what the last stage needs to
// sample. `hidden` carries the activations [num_tokens, hidden] between stages.
struct StageStep {
  uint64_t step_no = 0;
  std::vector<int32_t> token_ids, positions, query_start, context_lens, slot_mapping, block_tables, logit_rows;
  std::vector<int64_t> logit_seq;  // sequence of each logit row
  int32_t max_blocks_per_seq = 0;
  std::vector<NewSeqSampling> new_seqs;
  std::vector<int64_t> released;   // sequences whose sampler state can go
  std::vector<float> hidden;
  double compute_seconds = 0;      // the earlier stages' layers, summed
  // Last stage: one per logit row, set by the stage actor from its samplers; rows with
  // on_device are sampled by the worker's backend when it can (Backend::sample).
  std::vector<DeviceSampleParams> sampling;
};

// A worker's answer to a StageStep: the step back, carrying this stage's activations in
// `hidden` (middle stages), or the logits of its logit rows (last stage), or an error.
struct LayersDone {
  StageStep step;
  std::vector<float> logits;  // [logit rows, vocab], last stage only
  double compute_seconds = 0;
  std::string error;
  // Rows the backend sampled (one per logit row, -1 where the host samples); empty when
  // none was. logits is empty when every row was sampled on the device.
  std::vector<int32_t> device_tokens;
  std::vector<float> device_logprobs;
};

struct SampledToken {
  int64_t seq_id = 0;
  SampleResult result;
};

struct StepDone {
  uint64_t step_no = 0;
  std::vector<SampledToken> sampled;  // one per logit row, in order
  double compute_seconds = 0;         // summed over the stages
};

// Node links (actors/node_link.h): the head's first message to a stage node after both
// sides authenticated, and the node's answer (schema NodeHello, NodeHelloReply).
struct NodeHello {
  uint32_t version = 1;
  std::string model;  // model_fingerprint() of the head's model
  int32_t layer_first = 0, layer_last = 0;
  bool is_last = true;
  int32_t kv_blocks = 0, block_size = 16, max_batch_tokens = 512;
};

struct NodeHelloReply {
  std::string error;  // empty: ready
  std::string model;
  std::string device;
};

struct StepFailed {
  uint64_t step_no = 0;
  std::string error;
};

// ---- stats -------------------------------------------------------------------------------

struct EngineStats {
  int64_t num_running = 0, num_waiting = 0;
  int32_t kv_blocks = 0, kv_free = 0;
  uint64_t prefix_queries = 0, prefix_hits = 0;  // in blocks
  uint64_t prompt_tokens = 0, generation_tokens = 0, computed_prompt_tokens = 0;
  uint64_t preemptions = 0, steps = 0;
  uint64_t most_plans_in_flight = 0;  // pipeline: the most step plans in flight at once so far
  double heartbeat_age_seconds = 0;
  std::string failure;  // non-empty once a step has failed
  // Summed over finished steps: wall time from sending the plan to its result, and the time
  // spent computing (every stage's layers, and the sampling). With one stage and one plan in
  // flight the difference is what the actor hops cost.
  double step_seconds = 0, compute_seconds = 0;
  double kv_seconds = 0;  // KV-block-manager round trips (block operations sent to answer), summed
  // How long the oldest step in flight has run so far (0: none in flight). A step that never
  // ends (a hung device) shows here while the scheduler itself keeps beating.
  double oldest_step_seconds = 0;
  // The latency target (--itl-target-ms): steps whose token budget it lowered, and the
  // step-time model behind it (all 0 until the model has seen steps of different sizes).
  uint64_t capped_steps = 0;
  double step_fixed_seconds = 0, step_token_seconds = 0, step_row_seconds = 0, step_pair_seconds = 0;
};

struct StatsQuery {};

// ---- tokenizer actor -------------------------------------------------------------------

struct EncodeText {
  std::string text;
  bool add_special = true;    // BOS/EOS as the model's tokenizer adds them
  bool parse_special = false; // special-token text in user input stays text
};

struct EncodeChat {
  std::vector<std::string> roles, contents;
  bool add_generation_prompt = true;
};

struct DecodeTokens {
  std::vector<int32_t> ids;
};

struct EncodeResult {
  std::vector<int32_t> ids;
  std::string error;  // non-empty: the input could not be encoded (template error, ...)
};

// ---- typed interfaces ----------------------------------------------------------------

// The scheduler actor sends itself one of these every second: the engine's heartbeat.
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;

using request_sink_actor = caf::typed_actor<caf::reacts_to<SeqEvent>>;

using step_sink_actor = caf::typed_actor<caf::reacts_to<StepDone>, caf::reacts_to<StepFailed>>;

using stage_actor = caf::typed_actor<caf::reacts_to<StageStep, step_sink_actor>>;

using worker_actor = caf::typed_actor<caf::replies_to<StageStep>::with<LayersDone>>;

// A remote stage's link is gone (actors/remote_stage.h): the engine fails with the text
// (running requests end with it, /health says it), also when no step was in flight.
using stage_down_atom = caf::atom_constant<caf::atom("stagedown")>;
// The link is back: the engine failure it caused (the same text) ends, and the prefix cache
// forgets what the lost stage held.
using stage_rejoined_atom = caf::atom_constant<caf::atom("rejoined")>;

using scheduler_actor =
    caf::typed_actor<caf::reacts_to<SubmitSeq, request_sink_actor>, caf::reacts_to<CancelSeqs>,
                     caf::reacts_to<StepDone>, caf::reacts_to<StepFailed>,
                     caf::replies_to<StatsQuery>::with<EngineStats>, caf::reacts_to<heartbeat_atom>,
                     caf::reacts_to<stage_down_atom, std::string>, caf::reacts_to<stage_rejoined_atom, std::string>>;

// ---- scheduler actor ⇄ KV-block-manager actor: runtime/kv_ledger.h's KvOpsRequest (one
// step's block operations) answered by a KvOpsReply.
using kv_block_actor = caf::typed_actor<caf::replies_to<KvOpsRequest>::with<KvOpsReply>>;

using tokenizer_actor = caf::typed_actor<caf::replies_to<EncodeText>::with<EncodeResult>,
                                         caf::replies_to<EncodeChat>::with<EncodeResult>,
                                         caf::replies_to<DecodeTokens>::with<std::string>>;

// A request actor also takes a cancel (its client went away).
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using request_actor = request_sink_actor::extend<caf::reacts_to<cancel_atom>>;

// ---- inspect overloads (CAF 0.17 shape): what a networked mailbox would serialize ----

#define TROUPE_INSPECT(T, ...)                                                  \
  template <class Inspector>                                                    \
  typename Inspector::result_type inspect(Inspector& f, T& x) {                 \
    return f(caf::meta::type_name("troupe." #T), __VA_ARGS__);                 \
  }

}  // namespace troupe::actors

// The runtime structs inside messages (found by ADL in namespace troupe).
namespace troupe {
TROUPE_INSPECT(TokenLogprob, x.token, x.logprob)
TROUPE_INSPECT(SampleResult, x.token, x.logprob, x.top)
TROUPE_INSPECT(BlockCopy, x.src, x.dst)
TROUPE_INSPECT(KvBlockStats, x.num_blocks, x.num_free, x.num_cached_free, x.prefix_queries, x.prefix_hits)
TROUPE_INSPECT(KvSeqBlocks, x.seq, x.held, x.exclusive)
TROUPE_INSPECT(KvOp, x.kind, x.seq, x.cached, x.num_tokens, x.allowance, x.whole, x.tokens)
TROUPE_INSPECT(KvOpResult, x.ok, x.cached, x.num_new)
TROUPE_INSPECT(KvProbe, x.seq, x.tokens)
TROUPE_INSPECT(KvHint, x.seq, x.cached_blocks, x.free_listed)
TROUPE_INSPECT(KvTable, x.seq, x.blocks)
TROUPE_INSPECT(KvSnapshot, x.num_free, x.seqs, x.hints, x.stats)
TROUPE_INSPECT(KvOpsRequest, x.batch, x.ops, x.probes, x.tables, x.drop_cached)
TROUPE_INSPECT(KvOpsReply, x.batch, x.results, x.copies, x.tables, x.snapshot)
TROUPE_INSPECT(DeviceSampleParams, x.temperature, x.top_k, x.top_p, x.min_p, x.seed, x.counter, x.want_logprob,
               x.on_device)
TROUPE_INSPECT(SamplingParams, x.temperature, x.top_k, x.top_p, x.min_p, x.repetition_penalty, x.presence_penalty,
               x.frequency_penalty, x.logit_bias, x.seed, x.logprobs, x.report_logprob, x.json_object)
}  // namespace troupe

namespace troupe::actors {

TROUPE_INSPECT(SubmitSeq, x.seq_id, x.prompt, x.max_new_tokens, x.priority, x.sampling, x.stop_token_ids, x.ignore_eos)
TROUPE_INSPECT(CancelSeqs, x.seq_ids)
TROUPE_INSPECT(SeqEvent, x.seq_id, x.token, x.logprob, x.top, x.finished, x.hit_stop, x.queue_seconds, x.error)
TROUPE_INSPECT(NewSeqSampling, x.seq_id, x.sampling, x.prompt)
TROUPE_INSPECT(StageStep, x.step_no, x.token_ids, x.positions, x.query_start, x.context_lens, x.slot_mapping,
               x.block_tables, x.logit_rows, x.logit_seq, x.max_blocks_per_seq, x.new_seqs, x.released, x.hidden,
               x.compute_seconds, x.sampling)
TROUPE_INSPECT(LayersDone, x.step, x.logits, x.compute_seconds, x.error, x.device_tokens, x.device_logprobs)
TROUPE_INSPECT(SampledToken, x.seq_id, x.result)
TROUPE_INSPECT(StepDone, x.step_no, x.sampled, x.compute_seconds)
TROUPE_INSPECT(StepFailed, x.step_no, x.error)
TROUPE_INSPECT(EngineStats, x.num_running, x.num_waiting, x.kv_blocks, x.kv_free, x.prefix_queries, x.prefix_hits,
               x.prompt_tokens, x.generation_tokens, x.computed_prompt_tokens, x.preemptions, x.steps,
               x.most_plans_in_flight, x.heartbeat_age_seconds, x.failure, x.step_seconds, x.compute_seconds,
               x.kv_seconds, x.oldest_step_seconds, x.capped_steps, x.step_fixed_seconds, x.step_token_seconds,
               x.step_row_seconds, x.step_pair_seconds)
TROUPE_INSPECT(EncodeText, x.text, x.add_special, x.parse_special)
TROUPE_INSPECT(EncodeChat, x.roles, x.contents, x.add_generation_prompt)
TROUPE_INSPECT(DecodeTokens, x.ids)
TROUPE_INSPECT(EncodeResult, x.ids, x.error)

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StatsQuery&) {
  return f(caf::meta::type_name("troupe.StatsQuery"));
}

#undef TROUPE_INSPECT

}  // namespace troupe::actors
