// The messages that travel between Troupe's actors, and the actors' typed interfaces.
//
// Every message is a value: ids, token ids, numbers and float activations, never a pointer
// into another actor's memory, so a stage can later live in another process (the wire form
// is schema/troupe.capnp through actors/codec.h). The interfaces are declared here, first,
// so that each actor file only implements one of them.
#pragma once
#include <caf/all.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/sched/kv_ledger.h"
#include "runtime/sched/scheduler.h"  // SpecStats
#include "runtime/sample/sampler.h"

namespace troupe::actors {

// ---- request actor ⇄ scheduler actor -------------------------------------------------

// One sequence to generate goes to the scheduler actor as a SeqRequest
// (runtime/request/seq_request.h); a request with n choices sends n of them.

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
  bool hit_stop = false;     // finished on a stop token (else length)
  double queue_seconds = 0;  // first event: submission to first scheduled step
  // Speculative decoding: on the first event of a step that verified drafts, how many of
  // them the target accepted (the events of this step that follow) and rejected.
  int32_t drafts_accepted = 0, drafts_rejected = 0;
  std::string error;
};

// ---- scheduler actor ⇄ pipeline stages -------------------------------------------------

// A sequence the last stage has not seen yet: its sampler state starts here.
struct NewSeqSampling {
  int64_t seq_id = 0;
  SamplingParams sampling;
  std::vector<int32_t> prompt;  // for the repetition penalty
};

// One step plan, flattened (runtime/engine/engine.h PlannedStep) plus what the last stage needs to
// sample. `hidden` carries the activations [num_tokens, hidden] between stages.
struct StageStep {
  uint64_t step_no = 0;
  std::vector<int32_t> token_ids, positions, query_start, context_lens, slot_mapping, block_tables, logit_rows;
  std::vector<int64_t> logit_seq;  // sequence of each logit row
  int32_t max_blocks_per_seq = 0;
  std::vector<NewSeqSampling> new_seqs;
  std::vector<int64_t> released;  // sequences whose sampler state can go
  std::vector<float> hidden;
  double compute_seconds = 0;  // the earlier stages' layers, summed
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
  double draft_seconds = 0;  // of compute_seconds, the self-draft rounds (--speculative self:L)
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
  // One per logit row, in order; a sequence verifying drafts has its emitted tokens
  // consecutive (the accepted drafts, then the target's next token).
  std::vector<SampledToken> sampled;
  double compute_seconds = 0;  // summed over the stages
  double draft_seconds = 0;    // of it, the self-draft rounds
};

// Node links (actors/node_link.h): the head's first message to a stage node after both
// sides authenticated, and the node's answer (schema NodeHello, NodeHelloReply).
struct NodeHello {
  uint32_t version = 1;
  std::string model;  // model_fingerprint() of the head's model
  int32_t layer_first = 0, layer_last = 0;
  bool is_last = true;
  int32_t kv_blocks = 0, block_size = 16, max_batch_tokens = 512;
  // Expert parallelism: non-empty makes the node an expert worker (layer -> expert ids).
  std::map<int32_t, std::vector<int32_t>> experts;
  int32_t max_expert_rows = 0;
};

// ---- MoE stage ⇄ expert workers (actors/expert_actor.h) --------------------------------

// One MoE layer's rows for one expert worker, expert-major: experts[i] runs over the next
// counts[i] rows of `rows` [sum counts, hidden].
struct ExpertDispatch {
  uint64_t id = 0;  // the dispatcher's sequence number, echoed in the answer
  int32_t layer = 0;
  std::vector<int32_t> experts, counts;
  std::vector<float> rows;
};

struct ExpertResult {
  uint64_t id = 0;
  int32_t layer = 0;
  std::vector<float> rows;  // the experts' outputs, same rows
  std::string error;        // non-empty: failed (rows empty)
  double compute_seconds = 0;
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
  SpecStats spec;  // speculative decoding (--speculative): drafts fed and accepted
  double step_fixed_seconds = 0, step_token_seconds = 0, step_row_seconds = 0, step_pair_seconds = 0;
};

struct StatsQuery {};

// ---- tokenizer actor -------------------------------------------------------------------

struct EncodeText {
  std::string text;
  bool add_special = true;     // BOS/EOS as the model's tokenizer adds them
  bool parse_special = false;  // special-token text in user input stays text
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

using expert_actor = caf::typed_actor<caf::replies_to<ExpertDispatch>::with<ExpertResult>>;

// A remote stage's link is gone (actors/remote_stage.h): the engine fails with the text
// (running requests end with it, /health says it), also when no step was in flight.
using stage_down_atom = caf::atom_constant<caf::atom("stagedown")>;
// The link is back: the engine failure it caused (the same text) ends, and the prefix cache
// forgets what the lost stage held.
// (An expert worker's proxy sends its name: every failure it caused begins with it.)
using stage_rejoined_atom = caf::atom_constant<caf::atom("rejoined")>;

using scheduler_actor =
    caf::typed_actor<caf::reacts_to<SeqRequest, request_sink_actor>, caf::reacts_to<CancelSeqs>,
                     caf::reacts_to<StepDone>, caf::reacts_to<StepFailed>,
                     caf::replies_to<StatsQuery>::with<EngineStats>, caf::reacts_to<heartbeat_atom>,
                     caf::reacts_to<stage_down_atom, std::string>, caf::reacts_to<stage_rejoined_atom, std::string>>;

// ---- scheduler actor ⇄ KV-block-manager actor: runtime/sched/kv_ledger.h's KvOpsRequest (one
// step's block operations) answered by a KvOpsReply.
using kv_block_actor = caf::typed_actor<caf::replies_to<KvOpsRequest>::with<KvOpsReply>>;

using tokenizer_actor =
    caf::typed_actor<caf::replies_to<EncodeText>::with<EncodeResult>, caf::replies_to<EncodeChat>::with<EncodeResult>,
                     caf::replies_to<DecodeTokens>::with<std::string>>;

// A request actor also takes a cancel (its client went away).
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using request_actor = request_sink_actor::extend<caf::reacts_to<cancel_atom>>;

// ---- message types -----------------------------------------------------------------------
// These messages stay inside one process (CAF mailboxes, no CAF serialization): CAF is told
// so here instead of through inspect() field lists, so a new field is added to its struct
// alone. What crosses a process goes through the schema and actors/codec.h (the node link).

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::SeqRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::KvOpsRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::KvOpsReply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::CancelSeqs)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::SeqEvent)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StageStep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::LayersDone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepDone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepFailed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ExpertDispatch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ExpertResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::EngineStats)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StatsQuery)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::EncodeText)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::EncodeChat)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::DecodeTokens)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::EncodeResult)
