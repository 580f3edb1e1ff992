// The one codec between schema/troupe.capnp messages and the actors' structs. Messages travel
// as flat Cap'n Proto byte arrays; decoding untrusted bytes never throws: malformed input
// (bad size, bad pointers, too deep, too large) is an error value.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <variant>

#include "actors/messages.h"
#include "common/result.h"

namespace troupe::codec {

using Bytes = std::vector<uint8_t>;

// The messages that cross a process boundary (the node link, actors/node_link.h): a step to
// a stage in another process, its result, and the link's handshake. Messages that stay in
// one process have no codec (actors/messages.h). docs/architecture.md: "Adding a message".
Bytes encode(const actors::StageStep& m);
Result<actors::StageStep> decode_stage_step(const Bytes& b);
Bytes encode(const actors::StepDone& m);
Bytes encode(const actors::StepFailed& m);
Result<std::variant<actors::StepDone, actors::StepFailed>> decode_step_result(const Bytes& b);
Bytes encode(const actors::NodeHello& m);
Result<actors::NodeHello> decode_node_hello(const Bytes& b);
Bytes encode(const actors::NodeHelloReply& m);
Result<actors::NodeHelloReply> decode_node_hello_reply(const Bytes& b);
Bytes encode(const actors::ExpertDispatch& m);
Result<actors::ExpertDispatch> decode_expert_dispatch(const Bytes& b);
Bytes encode(const actors::ExpertResult& m);
Result<actors::ExpertResult> decode_expert_result(const Bytes& b);

}  // namespace troupe::codec
