# Messages that cross an actor boundary. This file is the single definition of the wire;
# actors/codec.{h,cpp} converts between these and the in-process structs of runtime/.
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
  struct LogitBias {
    token @0 :Int32;
    bias @1 :Float32;
  }
}

# Client request, after tokenization.
struct SubmitRequest {
  id @0 :Int64;
  promptTokens @1 :List(Int32);
  maxNewTokens @2 :Int32;
  priority @3 :Int32;
  sampling @4 :SamplingParams;
  stopTokenIds @5 :List(Int32);
  stopStrings @6 :List(Text);
  ignoreEos @7 :Bool;
}

struct Cancel {
  id @0 :Int64;
  ids @1 :List(Int64);   # several sequences at once (a request's n choices)
}

enum FinishReason {
  none @0;
  stop @1;
  length @2;
  aborted @3;
  error @4;
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

# One streamed piece of a request's output.
struct StreamChunk {
  id @0 :Int64;
  tokens @1 :List(Int32);
  text @2 :Text;
  logprobs @3 :List(TokenLogprob);
  finish @4 :FinishReason;
  promptTokens @5 :Int32;
  completionTokens @6 :Int32;
}

# What the scheduler asks the pipeline to compute in one step.
struct StepPlan {
  stepId @0 :UInt64;
  seqs @1 :List(Seq);
  preempted @2 :List(Int64);
  copies @3 :List(BlockCopy);
  struct Seq {
    id @0 :Int64;
    numComputed @1 :Int32;
    numNew @2 :Int32;
    samples @3 :Bool;
    tokens @4 :List(Int32);       # the numNew token ids
    blockTable @5 :List(Int32);
  }
  struct BlockCopy {
    src @0 :Int32;
    dst @1 :Int32;
  }
}

# The last stage's answer to a StageStep: one sampled token per logit row, or an error.
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

# Scheduler actor -> request actor: one sampled token of one sequence, or its end.
struct SeqEvent {
  seqId @0 :Int64;
  token @1 :Int32;
  logprob @2 :Float32;
  top @3 :List(TokenLogprob);
  finished @4 :Bool;
  hitStop @5 :Bool;
  queueSeconds @6 :Float64;
  error @7 :Text;
}

# A sequence's sampler state, sent to the last stage with the first step that samples it.
struct SeqSampling {
  seqId @0 :Int64;
  sampling @1 :SamplingParams;
  prompt @2 :List(Int32);
}

# Scheduler actor -> pipeline stages: one flattened step plan (runtime/engine.h
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

# A worker actor's answer to a StageStep: the step back with this stage's activations in
# `hidden` (middle stages), or the logits of its logit rows (last stage), or an error.
struct LayersDone {
  step @0 :StageStep;
  logits @1 :List(Float32);    # [logitRows, vocab]; empty when every row was sampled on the device
  computeSeconds @2 :Float64;
  error @3 :Text;
  deviceTokens @4 :List(Int32);     # per logit row: the backend's sample, -1 for host rows
  deviceLogprobs @5 :List(Float32);
}

# The scheduler actor's published state (health and metrics).
struct EngineStats {
  numRunning @0 :Int64;
  numWaiting @1 :Int64;
  kvBlocks @2 :Int32;
  kvFree @3 :Int32;
  prefixQueries @4 :UInt64;
  prefixHits @5 :UInt64;
  promptTokens @6 :UInt64;
  generationTokens @7 :UInt64;
  computedPromptTokens @8 :UInt64;
  preemptions @9 :UInt64;
  steps @10 :UInt64;
  heartbeatAgeSeconds @11 :Float64;
  failure @12 :Text;
  mostPlansInFlight @13 :UInt64;
  stepSeconds @14 :Float64;
  computeSeconds @15 :Float64;
  kvSeconds @16 :Float64;
  oldestStepSeconds @17 :Float64;
  cappedSteps @18 :UInt64;
  stepFixedSeconds @19 :Float64;
  stepTokenSeconds @20 :Float64;
  stepRowSeconds @21 :Float64;
  stepPairSeconds @22 :Float64;
}

struct KvStats {
  numBlocks @0 :Int32;
  numFree @1 :Int32;
  prefixQueries @2 :UInt64;
  prefixHits @3 :UInt64;
  numCachedFree @4 :Int32;
}

# Scheduler actor -> KV-block-manager actor: one step's block operations, applied in order
# (runtime/kv_ledger.h), the waiting sequences whose prefix hits the next plan wants to
# know, and the sequences whose block tables the step needs.
struct KvOpsRequest {
  batch @0 :UInt64;
  ops @1 :List(KvOp);
  probes @2 :List(KvProbe);
  tables @3 :List(Int64);
  dropCached @4 :Bool;   # first forget the free list's cached content (a stage's KV was lost)
}

struct KvOp {
  kind @0 :Kind;
  seq @1 :Int64;
  cached @2 :Int32;      # admit: prompt tokens the plan takes from the prefix cache
  numTokens @3 :Int32;   # admit: tokens computed after them; reserve: tokens held in all
  allowance @4 :Int32;   # admit: free blocks the plan counted for it
  whole @5 :Bool;        # admit: the step must reach the end of the tokens
  tokens @6 :List(Int32);
  enum Kind {
    admit @0;
    reserve @1;
    free @2;
  }
}

struct KvProbe {
  seq @0 :Int64;
  tokens @1 :List(Int32);
}

# KV-block-manager actor -> scheduler actor: what was applied, and the state after it.
struct KvOpsReply {
  batch @0 :UInt64;
  results @1 :List(KvOpResult);
  copies @2 :List(StepPlan.BlockCopy);
  tables @3 :List(KvTable);
  snapshot @4 :KvSnapshot;
}

struct KvOpResult {
  ok @0 :Bool;
  cached @1 :Int32;      # admit: tokens taken from the prefix cache
  numNew @2 :Int32;      # admit: tokens to compute this step
}

struct KvTable {
  seq @0 :Int64;
  blocks @1 :List(Int32);
}

struct KvSnapshot {
  numFree @0 :Int32;
  seqs @1 :List(KvSeqBlocks);
  hints @2 :List(KvHint);
  stats @3 :KvStats;
}

struct KvSeqBlocks {
  seq @0 :Int64;
  held @1 :Int32;
  exclusive @2 :Int32;
}

struct KvHint {
  seq @0 :Int64;
  cachedBlocks @1 :Int32;
  freeListed @2 :Int32;   # how many of them sit in the free list
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
}

struct NodeHelloReply {
  error @0 :Text;            # empty: the stage is ready
  model @1 :Text;            # the node's fingerprint
  device @2 :Text;           # what the stage runs on, for the head's log
}
