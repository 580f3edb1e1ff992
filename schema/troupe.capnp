# Messages that cross a process boundary (the node link to a stage in another process).
# This file is the single definition of the wire; actors/codec.{h,cpp} converts between
# these and the actors' structs (actors/messages.h). Messages that stay inside one process
# are not here. docs/architecture.md: "Adding a message".
@0xb8f1c2d3e4a5f607;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct SamplingParams {
  temperature @0 :Float32 = 1.0;
  topK @1 :Int32;
  topP @2 :Float32 = 1.0;
  minP @3 :Float32;
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  seed @7 :UInt64;
  logprobs @8 :Int32;
  logitBias @9 :List(LogitBias);
  reportLogprob @10 :Bool = true;   # the chosen token's log-probability (off: skipped, reported as 0)
  jsonObject @11 :Bool;             # JSON mode: the output is one JSON object
  grammar @12 :Text;                # structured output: a GBNF grammar the output matches ("": none)
  struct LogitBias {
    token @0 :Int32;
    bias @1 :Float32;
  }
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

# The last stage's answer to a StageStep: one sampled token per logit row, or an error. A
# sequence verifying speculative drafts (several consecutive logit rows) has its emitted
# tokens consecutive here: the drafts its rows accepted, then the target's next token.
struct StepResult {
  stepId @0 :UInt64;
  sampled @1 :List(Sampled);
  error @2 :Text;
  computeSeconds @3 :Float64;
  struct Sampled {
    id @0 :Int64;
    token @1 :Int32;
    logprob @2 :Float32;
    top @3 :List(TokenLogprob);
  }
}

# A sequence's sampler state, sent to the last stage with the first step that samples it.
struct SeqSampling {
  seqId @0 :Int64;
  sampling @1 :SamplingParams;
  prompt @2 :List(Int32);
}

# Scheduler actor -> pipeline stages: one flattened step plan (runtime/engine/engine.h
# PlannedStep), sampler state for new sequences, and the activations between stages.
struct StageStep {
  stepNo @0 :UInt64;
  tokenIds @1 :List(Int32);
  positions @2 :List(Int32);
  queryStart @3 :List(Int32);
  contextLens @4 :List(Int32);
  slotMapping @5 :List(Int32);
  blockTables @6 :List(Int32);
  logitRows @7 :List(Int32);
  logitSeq @8 :List(Int64);
  maxBlocksPerSeq @9 :Int32;
  newSeqs @10 :List(SeqSampling);
  released @11 :List(Int64);
  hidden @12 :List(Float32);   # [numTokens, hidden] between stages; empty into the first
  computeSeconds @13 :Float64; # the earlier stages' layer time, summed
  sampling @14 :List(DeviceSample);  # last stage: one per logit row (Backend::sample)
}

# One logit row's sampler settings for sampling on the device (kernels/sample_params.h).
struct DeviceSample {
  temperature @0 :Float32;
  topK @1 :Int32;
  topP @2 :Float32;
  minP @3 :Float32;
  seed @4 :UInt64;
  counter @5 :UInt64;          # the draw's index
  wantLogprob @6 :Bool;
  onDevice @7 :Bool;           # sample this row on the backend when it can
}

# Node links (actors/node_link.h): the head's first message to a stage node after both
# sides have authenticated, naming what the node must run, and the node's answer.
struct NodeHello {
  version @0 :UInt32;
  model @1 :Text;            # the model's fingerprint (architecture, shape, weight bytes)
  layerFirst @2 :Int32;      # the stage's layers [layerFirst, layerLast)
  layerLast @3 :Int32;
  isLast @4 :Bool;           # the last stage samples and answers with step results
  kvBlocks @5 :Int32;        # the head's KV pool: blocks and tokens per block
  blockSize @6 :Int32;
  maxBatchTokens @7 :Int32;
  # Expert parallelism: a non-empty list makes the node an expert worker holding these
  # routed experts (no stage; the layer fields and the KV pool are unused).
  experts @8 :List(ExpertSet);
  maxExpertRows @9 :Int32;   # the most rows one dispatch carries
}

struct ExpertSet {
  layer @0 :Int32;
  experts @1 :List(Int32);
}

# Expert parallelism (actors/expert_actor.h): one MoE layer's rows for one expert worker,
# expert-major (experts[i] runs over the next counts[i] rows of `rows` [sum counts, hidden]),
# and the worker's answer: the experts' outputs in the same rows, or an error.
struct ExpertDispatch {
  id @0 :UInt64;           # the dispatcher's sequence number: the answer carries it back
  layer @1 :Int32;
  experts @2 :List(Int32);
  counts @3 :List(Int32);
  rows @4 :List(Float32);
}

struct ExpertResult {
  id @0 :UInt64;
  layer @1 :Int32;
  rows @2 :List(Float32);
  error @3 :Text;
  computeSeconds @4 :Float64;
}

struct NodeHelloReply {
  error @0 :Text;            # empty: the stage is ready
  model @1 :Text;            # the node's fingerprint
  device @2 :Text;           # what the stage runs on, for the head's log
}
