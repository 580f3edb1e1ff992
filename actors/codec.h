// The one codec between schema/troupe.capnp messages and runtime structs. Messages travel
// as flat Cap'n Proto byte arrays; decoding untrusted bytes never throws: malformed input
// (bad size, bad pointers, too deep, too large) is an error value.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <variant>

#include "actors/messages.h"
#include "kernels/result.h"
#include "runtime/kv_ledger.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace troupe::codec {

using Bytes = std::vector<uint8_t>;

Bytes encode_submit(const SchedRequest& r, const SamplingParams& sampling);
Result<std::pair<SchedRequest, SamplingParams>> decode_submit(const Bytes& b);

Bytes encode_step_plan(const StepPlan& p, uint64_t step_id);
Result<std::pair<StepPlan, uint64_t>> decode_step_plan(const Bytes& b);

Bytes encode_cancel(int64_t id);
Result<int64_t> decode_cancel(const Bytes& b);

// The actor messages (actors/messages.h), as they would cross a process boundary.
Bytes encode(const actors::SubmitSeq& m);
Result<actors::SubmitSeq> decode_submit_seq(const Bytes& b);
Bytes encode(const actors::CancelSeqs& m);
Result<actors::CancelSeqs> decode_cancel_seqs(const Bytes& b);
Bytes encode(const actors::SeqEvent& m);
Result<actors::SeqEvent> decode_seq_event(const Bytes& b);
Bytes encode(const actors::StageStep& m);
Result<actors::StageStep> decode_stage_step(const Bytes& b);
Bytes encode(const actors::LayersDone& m);
Result<actors::LayersDone> decode_layers_done(const Bytes& b);
Bytes encode(const actors::StepDone& m);
Bytes encode(const actors::StepFailed& m);
Result<std::variant<actors::StepDone, actors::StepFailed>> decode_step_result(const Bytes& b);
Bytes encode(const actors::EngineStats& m);
Result<actors::EngineStats> decode_engine_stats(const Bytes& b);
Bytes encode(const actors::NodeHello& m);
Result<actors::NodeHello> decode_node_hello(const Bytes& b);
Bytes encode(const actors::NodeHelloReply& m);
Result<actors::NodeHelloReply> decode_node_hello_reply(const Bytes& b);
// Scheduler actor <-> KV-block-manager actor (runtime/kv_ledger.h).
Bytes encode(const KvOpsRequest& m);
Result<KvOpsRequest> decode_kv_ops_request(const Bytes& b);
Bytes encode(const KvOpsReply& m);
Result<KvOpsReply> decode_kv_ops_reply(const Bytes& b);

}  // namespace troupe::codec
