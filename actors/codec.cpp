#include "actors/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "troupe.capnp.h"

namespace troupe::codec {
namespace {

Bytes to_bytes(capnp::MessageBuilder& m) {
  auto words = capnp::messageToFlatArray(m);
  auto bytes = words.asBytes();
  return Bytes(bytes.begin(), bytes.end());
}

// Runs `fn(reader)` over untrusted bytes with traversal limits; any Cap'n Proto failure
// becomes an error naming the message type.
template <typename T, typename Fn>
auto read(const Bytes& b, const char* what, Fn fn) -> decltype(fn(std::declval<typename T::Reader>())) {
  if (b.empty() || b.size() % sizeof(capnp::word) != 0 || b.size() > (64u << 20))
    return make_error(std::string(what) + ": message of " + std::to_string(b.size()) + " bytes is malformed");
  std::vector<capnp::word> words(b.size() / sizeof(capnp::word));
  std::memcpy(words.data(), b.data(), b.size());
  // The traversal budget grows with the message: Cap'n Proto charges each element of a
  // list of empty structs one word although it occupies none, so under a fixed budget a
  // 56-byte message could decode into millions of elements (hundreds of MB). Our encoders
  // write every struct whole, so a real message traverses about its own size (a decoder
  // may read a pointer twice); four times it, plus slack for tiny messages, bounds what a
  // message decodes into by its size.
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = 4 * words.size() + 1024;
  opts.nestingLimit = 16;
  try {
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.data(), words.size()), opts);
    return fn(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    return make_error(std::string(what) + ": malformed message: " + e.getDescription().cStr());
  }
}

void write_sampling(schema::SamplingParams::Builder s, const SamplingParams& sp) {
  s.setTemperature(sp.temperature);
  s.setTopK(sp.top_k);
  s.setTopP(sp.top_p);
  s.setMinP(sp.min_p);
  s.setRepetitionPenalty(sp.repetition_penalty);
  s.setPresencePenalty(sp.presence_penalty);
  s.setFrequencyPenalty(sp.frequency_penalty);
  s.setSeed(sp.seed);
  s.setLogprobs(sp.logprobs);
  s.setReportLogprob(sp.report_logprob);
  s.setJsonObject(sp.json_object);
  // In token order: the map's own order depends on its history, and the same parameters
  // must always encode to the same bytes.
  std::vector<std::pair<int32_t, float>> bias(sp.logit_bias.begin(), sp.logit_bias.end());
  std::sort(bias.begin(), bias.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  auto lb = s.initLogitBias(static_cast<unsigned>(bias.size()));
  for (unsigned i = 0; i < bias.size(); ++i) {
    lb[i].setToken(bias[i].first);
    lb[i].setBias(bias[i].second);
  }
}

SamplingParams read_sampling(schema::SamplingParams::Reader s) {
  SamplingParams sp;
  sp.temperature = s.getTemperature();
  sp.top_k = s.getTopK();
  sp.top_p = s.getTopP();
  sp.min_p = s.getMinP();
  sp.repetition_penalty = s.getRepetitionPenalty();
  sp.presence_penalty = s.getPresencePenalty();
  sp.frequency_penalty = s.getFrequencyPenalty();
  sp.seed = s.getSeed();
  sp.logprobs = s.getLogprobs();
  sp.report_logprob = s.getReportLogprob();
  sp.json_object = s.getJsonObject();
  for (auto e : s.getLogitBias()) sp.logit_bias[e.getToken()] = e.getBias();
  return sp;
}

template <typename L, typename V>
void put(L list, const V& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, v[i]);
}

template <typename T, typename L>
std::vector<T> get(L list) {
  std::vector<T> v;
  v.reserve(list.size());
  for (T x : list) v.push_back(x);
  return v;
}

template <typename L>
void put_top(L list, const std::vector<TokenLogprob>& top) {
  for (unsigned i = 0; i < top.size(); ++i) {
    list[i].setToken(top[i].token);
    list[i].setLogprob(top[i].logprob);
  }
}

template <typename L>
std::vector<TokenLogprob> get_top(L list) {
  std::vector<TokenLogprob> top;
  for (auto t : list) top.push_back({t.getToken(), t.getLogprob()});
  return top;
}

unsigned n(size_t x) { return static_cast<unsigned>(x); }

// A text field as sent, all its bytes: through a C string it would end at an embedded NUL
// (an error text "\0..." read as no error at all).
std::string text(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }
capnp::Text::Reader wire_text(const std::string& s) { return capnp::Text::Reader(s.c_str(), s.size()); }

}  // namespace

Bytes encode_submit(const SchedRequest& r, const SamplingParams& sp) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::SubmitRequest>();
  msg.setId(r.id);
  auto toks = msg.initPromptTokens(static_cast<unsigned>(r.prompt.size()));
  for (unsigned i = 0; i < r.prompt.size(); ++i) toks.set(i, r.prompt[i]);
  msg.setMaxNewTokens(r.max_new_tokens);
  msg.setPriority(r.priority);
  write_sampling(msg.initSampling(), sp);
  return to_bytes(m);
}

Result<std::pair<SchedRequest, SamplingParams>> decode_submit(const Bytes& b) {
  return read<schema::SubmitRequest>(b, "SubmitRequest", [](schema::SubmitRequest::Reader msg)
                                         -> Result<std::pair<SchedRequest, SamplingParams>> {
    SchedRequest r;
    r.id = msg.getId();
    for (int32_t t : msg.getPromptTokens()) r.prompt.push_back(t);
    r.max_new_tokens = msg.getMaxNewTokens();
    r.priority = msg.getPriority();
    SamplingParams sp = read_sampling(msg.getSampling());
    return std::make_pair(std::move(r), std::move(sp));
  });
}

Bytes encode_step_plan(const StepPlan& p, uint64_t step_id) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::StepPlan>();
  msg.setStepId(step_id);
  auto seqs = msg.initSeqs(static_cast<unsigned>(p.seqs.size()));
  for (unsigned i = 0; i < p.seqs.size(); ++i) {
    seqs[i].setId(p.seqs[i].id);
    seqs[i].setNumComputed(p.seqs[i].num_computed);
    seqs[i].setNumNew(p.seqs[i].num_new);
    seqs[i].setSamples(p.seqs[i].samples);
  }
  auto pre = msg.initPreempted(static_cast<unsigned>(p.preempted.size()));
  for (unsigned i = 0; i < p.preempted.size(); ++i) pre.set(i, p.preempted[i]);
  auto copies = msg.initCopies(static_cast<unsigned>(p.copies.size()));
  for (unsigned i = 0; i < p.copies.size(); ++i) {
    copies[i].setSrc(p.copies[i].src);
    copies[i].setDst(p.copies[i].dst);
  }
  return to_bytes(m);
}

Result<std::pair<StepPlan, uint64_t>> decode_step_plan(const Bytes& b) {
  return read<schema::StepPlan>(b, "StepPlan", [](schema::StepPlan::Reader msg) -> Result<std::pair<StepPlan, uint64_t>> {
    StepPlan p;
    int64_t tokens = 0;  // (summed wide: the sequences' counts may add up past int32)
    for (auto s : msg.getSeqs()) {
      if (s.getNumComputed() < 0 || s.getNumNew() < 0)
        return make_error("StepPlan: negative token counts for sequence " + std::to_string(s.getId()));
      tokens += s.getNumNew();
      if (tokens > std::numeric_limits<int32_t>::max())
        return make_error("StepPlan: the sequences' new tokens add up to more than " +
                          std::to_string(std::numeric_limits<int32_t>::max()));
      p.seqs.push_back({s.getId(), s.getNumComputed(), s.getNumNew(), s.getSamples()});
    }
    p.num_tokens = static_cast<int32_t>(tokens);
    for (int64_t id : msg.getPreempted()) p.preempted.push_back(id);
    for (auto c : msg.getCopies()) p.copies.push_back({c.getSrc(), c.getDst()});
    return std::make_pair(std::move(p), msg.getStepId());
  });
}

Bytes encode_cancel(int64_t id) {
  capnp::MallocMessageBuilder m;
  m.initRoot<schema::Cancel>().setId(id);
  return to_bytes(m);
}

Result<int64_t> decode_cancel(const Bytes& b) {
  return read<schema::Cancel>(b, "Cancel", [](schema::Cancel::Reader msg) -> Result<int64_t> { return msg.getId(); });
}

Bytes encode(const actors::SubmitSeq& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::SubmitRequest>();
  msg.setId(x.seq_id);
  put(msg.initPromptTokens(n(x.prompt.size())), x.prompt);
  msg.setMaxNewTokens(x.max_new_tokens);
  msg.setPriority(x.priority);
  write_sampling(msg.initSampling(), x.sampling);
  put(msg.initStopTokenIds(n(x.stop_token_ids.size())), x.stop_token_ids);
  msg.setIgnoreEos(x.ignore_eos);
  return to_bytes(m);
}

Result<actors::SubmitSeq> decode_submit_seq(const Bytes& b) {
  return read<schema::SubmitRequest>(b, "SubmitRequest", [](schema::SubmitRequest::Reader msg) -> Result<actors::SubmitSeq> {
    actors::SubmitSeq x;
    x.seq_id = msg.getId();
    x.prompt = get<int32_t>(msg.getPromptTokens());
    x.max_new_tokens = msg.getMaxNewTokens();
    x.priority = msg.getPriority();
    x.sampling = read_sampling(msg.getSampling());
    x.stop_token_ids = get<int32_t>(msg.getStopTokenIds());
    x.ignore_eos = msg.getIgnoreEos();
    return x;
  });
}

Bytes encode(const actors::CancelSeqs& x) {
  capnp::MallocMessageBuilder m;
  put(m.initRoot<schema::Cancel>().initIds(n(x.seq_ids.size())), x.seq_ids);
  return to_bytes(m);
}

Result<actors::CancelSeqs> decode_cancel_seqs(const Bytes& b) {
  return read<schema::Cancel>(b, "Cancel", [](schema::Cancel::Reader msg) -> Result<actors::CancelSeqs> {
    return actors::CancelSeqs{get<int64_t>(msg.getIds())};
  });
}

Bytes encode(const actors::SeqEvent& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::SeqEvent>();
  msg.setSeqId(x.seq_id);
  msg.setToken(x.token);
  msg.setLogprob(x.logprob);
  put_top(msg.initTop(n(x.top.size())), x.top);
  msg.setFinished(x.finished);
  msg.setHitStop(x.hit_stop);
  msg.setQueueSeconds(x.queue_seconds);
  msg.setError(wire_text(x.error));
  return to_bytes(m);
}

Result<actors::SeqEvent> decode_seq_event(const Bytes& b) {
  return read<schema::SeqEvent>(b, "SeqEvent", [](schema::SeqEvent::Reader msg) -> Result<actors::SeqEvent> {
    actors::SeqEvent x;
    x.seq_id = msg.getSeqId();
    x.token = msg.getToken();
    x.logprob = msg.getLogprob();
    x.top = get_top(msg.getTop());
    x.finished = msg.getFinished();
    x.hit_stop = msg.getHitStop();
    x.queue_seconds = msg.getQueueSeconds();
    x.error = text(msg.getError());
    return x;
  });
}

void write_stage_step(schema::StageStep::Builder msg, const actors::StageStep& x) {
  msg.setStepNo(x.step_no);
  put(msg.initTokenIds(n(x.token_ids.size())), x.token_ids);
  put(msg.initPositions(n(x.positions.size())), x.positions);
  put(msg.initQueryStart(n(x.query_start.size())), x.query_start);
  put(msg.initContextLens(n(x.context_lens.size())), x.context_lens);
  put(msg.initSlotMapping(n(x.slot_mapping.size())), x.slot_mapping);
  put(msg.initBlockTables(n(x.block_tables.size())), x.block_tables);
  put(msg.initLogitRows(n(x.logit_rows.size())), x.logit_rows);
  put(msg.initLogitSeq(n(x.logit_seq.size())), x.logit_seq);
  msg.setMaxBlocksPerSeq(x.max_blocks_per_seq);
  auto ns = msg.initNewSeqs(n(x.new_seqs.size()));
  for (unsigned i = 0; i < x.new_seqs.size(); ++i) {
    ns[i].setSeqId(x.new_seqs[i].seq_id);
    write_sampling(ns[i].initSampling(), x.new_seqs[i].sampling);
    put(ns[i].initPrompt(n(x.new_seqs[i].prompt.size())), x.new_seqs[i].prompt);
  }
  put(msg.initReleased(n(x.released.size())), x.released);
  put(msg.initHidden(n(x.hidden.size())), x.hidden);
  msg.setComputeSeconds(x.compute_seconds);
  auto sp = msg.initSampling(n(x.sampling.size()));
  for (unsigned i = 0; i < x.sampling.size(); ++i) {
    const DeviceSampleParams& d = x.sampling[i];
    sp[i].setTemperature(d.temperature);
    sp[i].setTopK(d.top_k);
    sp[i].setTopP(d.top_p);
    sp[i].setMinP(d.min_p);
    sp[i].setSeed(d.seed);
    sp[i].setCounter(d.counter);
    sp[i].setWantLogprob(d.want_logprob != 0);
    sp[i].setOnDevice(d.on_device != 0);
  }
}

actors::StageStep read_stage_step(schema::StageStep::Reader msg) {
  actors::StageStep x;
  x.step_no = msg.getStepNo();
  x.token_ids = get<int32_t>(msg.getTokenIds());
  x.positions = get<int32_t>(msg.getPositions());
  x.query_start = get<int32_t>(msg.getQueryStart());
  x.context_lens = get<int32_t>(msg.getContextLens());
  x.slot_mapping = get<int32_t>(msg.getSlotMapping());
  x.block_tables = get<int32_t>(msg.getBlockTables());
  x.logit_rows = get<int32_t>(msg.getLogitRows());
  x.logit_seq = get<int64_t>(msg.getLogitSeq());
  x.max_blocks_per_seq = msg.getMaxBlocksPerSeq();
  for (auto s : msg.getNewSeqs())
    x.new_seqs.push_back({s.getSeqId(), read_sampling(s.getSampling()), get<int32_t>(s.getPrompt())});
  x.released = get<int64_t>(msg.getReleased());
  x.hidden = get<float>(msg.getHidden());
  x.compute_seconds = msg.getComputeSeconds();
  for (auto d : msg.getSampling()) {
    DeviceSampleParams p;
    p.temperature = d.getTemperature();
    p.top_k = d.getTopK();
    p.top_p = d.getTopP();
    p.min_p = d.getMinP();
    p.seed = d.getSeed();
    p.counter = d.getCounter();
    p.want_logprob = d.getWantLogprob() ? 1 : 0;
    p.on_device = d.getOnDevice() ? 1 : 0;
    x.sampling.push_back(p);
  }
  return x;
}

Bytes encode(const actors::StageStep& x) {
  capnp::MallocMessageBuilder m;
  write_stage_step(m.initRoot<schema::StageStep>(), x);
  return to_bytes(m);
}

Result<actors::StageStep> decode_stage_step(const Bytes& b) {
  return read<schema::StageStep>(b, "StageStep",
                                 [](schema::StageStep::Reader msg) -> Result<actors::StageStep> { return read_stage_step(msg); });
}

Bytes encode(const actors::LayersDone& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::LayersDone>();
  write_stage_step(msg.initStep(), x.step);
  put(msg.initLogits(n(x.logits.size())), x.logits);
  msg.setComputeSeconds(x.compute_seconds);
  msg.setError(wire_text(x.error));
  put(msg.initDeviceTokens(n(x.device_tokens.size())), x.device_tokens);
  put(msg.initDeviceLogprobs(n(x.device_logprobs.size())), x.device_logprobs);
  return to_bytes(m);
}

Result<actors::LayersDone> decode_layers_done(const Bytes& b) {
  return read<schema::LayersDone>(b, "LayersDone", [](schema::LayersDone::Reader msg) -> Result<actors::LayersDone> {
    actors::LayersDone x;
    x.step = read_stage_step(msg.getStep());
    x.logits = get<float>(msg.getLogits());
    x.compute_seconds = msg.getComputeSeconds();
    x.error = text(msg.getError());
    x.device_tokens = get<int32_t>(msg.getDeviceTokens());
    x.device_logprobs = get<float>(msg.getDeviceLogprobs());
    return x;
  });
}

Bytes encode(const actors::StepDone& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::StepResult>();
  msg.setStepId(x.step_no);
  msg.setComputeSeconds(x.compute_seconds);
  auto s = msg.initSampled(n(x.sampled.size()));
  for (unsigned i = 0; i < x.sampled.size(); ++i) {
    s[i].setId(x.sampled[i].seq_id);
    s[i].setToken(x.sampled[i].result.token);
    s[i].setLogprob(x.sampled[i].result.logprob);
    put_top(s[i].initTop(n(x.sampled[i].result.top.size())), x.sampled[i].result.top);
  }
  return to_bytes(m);
}

Bytes encode(const actors::StepFailed& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::StepResult>();
  msg.setStepId(x.step_no);
  msg.setError(x.error.empty() ? capnp::Text::Reader("unknown step failure") : wire_text(x.error));
  return to_bytes(m);
}

Result<std::variant<actors::StepDone, actors::StepFailed>> decode_step_result(const Bytes& b) {
  using R = std::variant<actors::StepDone, actors::StepFailed>;
  return read<schema::StepResult>(b, "StepResult", [](schema::StepResult::Reader msg) -> Result<R> {
    if (msg.hasError() && msg.getError().size() > 0) return R{actors::StepFailed{msg.getStepId(), text(msg.getError())}};
    actors::StepDone x;
    x.step_no = msg.getStepId();
    x.compute_seconds = msg.getComputeSeconds();
    for (auto s : msg.getSampled()) {
      SampleResult r;
      r.token = s.getToken();
      r.logprob = s.getLogprob();
      r.top = get_top(s.getTop());
      x.sampled.push_back({s.getId(), std::move(r)});
    }
    return R{std::move(x)};
  });
}

Bytes encode(const actors::NodeHello& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::NodeHello>();
  msg.setVersion(x.version);
  msg.setModel(wire_text(x.model));
  msg.setLayerFirst(x.layer_first);
  msg.setLayerLast(x.layer_last);
  msg.setIsLast(x.is_last);
  msg.setKvBlocks(x.kv_blocks);
  msg.setBlockSize(x.block_size);
  msg.setMaxBatchTokens(x.max_batch_tokens);
  return to_bytes(m);
}

Result<actors::NodeHello> decode_node_hello(const Bytes& b) {
  return read<schema::NodeHello>(b, "NodeHello", [](schema::NodeHello::Reader msg) -> Result<actors::NodeHello> {
    actors::NodeHello x;
    x.version = msg.getVersion();
    x.model = text(msg.getModel());
    x.layer_first = msg.getLayerFirst();
    x.layer_last = msg.getLayerLast();
    x.is_last = msg.getIsLast();
    x.kv_blocks = msg.getKvBlocks();
    x.block_size = msg.getBlockSize();
    x.max_batch_tokens = msg.getMaxBatchTokens();
    return x;
  });
}

Bytes encode(const actors::NodeHelloReply& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::NodeHelloReply>();
  msg.setError(wire_text(x.error));
  msg.setModel(wire_text(x.model));
  msg.setDevice(wire_text(x.device));
  return to_bytes(m);
}

Result<actors::NodeHelloReply> decode_node_hello_reply(const Bytes& b) {
  return read<schema::NodeHelloReply>(b, "NodeHelloReply",
                                      [](schema::NodeHelloReply::Reader msg) -> Result<actors::NodeHelloReply> {
                                        return actors::NodeHelloReply{text(msg.getError()), text(msg.getModel()),
                                                                      text(msg.getDevice())};
                                      });
}

Bytes encode(const actors::EngineStats& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::EngineStats>();
  msg.setNumRunning(x.num_running);
  msg.setNumWaiting(x.num_waiting);
  msg.setKvBlocks(x.kv_blocks);
  msg.setKvFree(x.kv_free);
  msg.setPrefixQueries(x.prefix_queries);
  msg.setPrefixHits(x.prefix_hits);
  msg.setPromptTokens(x.prompt_tokens);
  msg.setGenerationTokens(x.generation_tokens);
  msg.setComputedPromptTokens(x.computed_prompt_tokens);
  msg.setPreemptions(x.preemptions);
  msg.setMostPlansInFlight(x.most_plans_in_flight);
  msg.setSteps(x.steps);
  msg.setHeartbeatAgeSeconds(x.heartbeat_age_seconds);
  msg.setFailure(wire_text(x.failure));
  msg.setStepSeconds(x.step_seconds);
  msg.setComputeSeconds(x.compute_seconds);
  msg.setKvSeconds(x.kv_seconds);
  msg.setOldestStepSeconds(x.oldest_step_seconds);
  msg.setCappedSteps(x.capped_steps);
  msg.setStepFixedSeconds(x.step_fixed_seconds);
  msg.setStepTokenSeconds(x.step_token_seconds);
  msg.setStepRowSeconds(x.step_row_seconds);
  msg.setStepPairSeconds(x.step_pair_seconds);
  return to_bytes(m);
}

Result<actors::EngineStats> decode_engine_stats(const Bytes& b) {
  return read<schema::EngineStats>(b, "EngineStats", [](schema::EngineStats::Reader msg) -> Result<actors::EngineStats> {
    actors::EngineStats x;
    x.num_running = msg.getNumRunning();
    x.num_waiting = msg.getNumWaiting();
    x.kv_blocks = msg.getKvBlocks();
    x.kv_free = msg.getKvFree();
    x.prefix_queries = msg.getPrefixQueries();
    x.prefix_hits = msg.getPrefixHits();
    x.prompt_tokens = msg.getPromptTokens();
    x.generation_tokens = msg.getGenerationTokens();
    x.computed_prompt_tokens = msg.getComputedPromptTokens();
    x.preemptions = msg.getPreemptions();
    x.most_plans_in_flight = msg.getMostPlansInFlight();
    x.steps = msg.getSteps();
    x.heartbeat_age_seconds = msg.getHeartbeatAgeSeconds();
    x.failure = text(msg.getFailure());
    x.step_seconds = msg.getStepSeconds();
    x.compute_seconds = msg.getComputeSeconds();
    x.kv_seconds = msg.getKvSeconds();
    x.oldest_step_seconds = msg.getOldestStepSeconds();
    x.capped_steps = msg.getCappedSteps();
    x.step_fixed_seconds = msg.getStepFixedSeconds();
    x.step_token_seconds = msg.getStepTokenSeconds();
    x.step_row_seconds = msg.getStepRowSeconds();
    x.step_pair_seconds = msg.getStepPairSeconds();
    return x;
  });
}

namespace {

void write_kv_stats(schema::KvStats::Builder b, const KvBlockStats& s) {
  b.setNumBlocks(s.num_blocks);
  b.setNumFree(s.num_free);
  b.setNumCachedFree(s.num_cached_free);
  b.setPrefixQueries(s.prefix_queries);
  b.setPrefixHits(s.prefix_hits);
}

KvBlockStats read_kv_stats(schema::KvStats::Reader r) {
  KvBlockStats s;
  s.num_blocks = r.getNumBlocks();
  s.num_free = r.getNumFree();
  s.num_cached_free = r.getNumCachedFree();
  s.prefix_queries = r.getPrefixQueries();
  s.prefix_hits = r.getPrefixHits();
  return s;
}

}  // namespace

Bytes encode(const KvOpsRequest& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::KvOpsRequest>();
  msg.setBatch(x.batch);
  auto ops = msg.initOps(n(x.ops.size()));
  for (unsigned i = 0; i < x.ops.size(); ++i) {
    const KvOp& o = x.ops[i];
    ops[i].setKind(static_cast<schema::KvOp::Kind>(static_cast<uint16_t>(o.kind)));
    ops[i].setSeq(o.seq);
    ops[i].setCached(o.cached);
    ops[i].setNumTokens(o.num_tokens);
    ops[i].setAllowance(o.allowance);
    ops[i].setWhole(o.whole);
    put(ops[i].initTokens(n(o.tokens.size())), o.tokens);
  }
  auto probes = msg.initProbes(n(x.probes.size()));
  for (unsigned i = 0; i < x.probes.size(); ++i) {
    probes[i].setSeq(x.probes[i].seq);
    put(probes[i].initTokens(n(x.probes[i].tokens.size())), x.probes[i].tokens);
  }
  put(msg.initTables(n(x.tables.size())), x.tables);
  msg.setDropCached(x.drop_cached);
  return to_bytes(m);
}

Result<KvOpsRequest> decode_kv_ops_request(const Bytes& b) {
  return read<schema::KvOpsRequest>(b, "KvOpsRequest", [](schema::KvOpsRequest::Reader msg) -> Result<KvOpsRequest> {
    KvOpsRequest x;
    x.batch = msg.getBatch();
    for (auto o : msg.getOps()) {
      KvOp op;
      const auto kind = static_cast<uint16_t>(o.getKind());
      if (kind > static_cast<uint16_t>(KvOp::Kind::Free))
        return make_error("KvOpsRequest: unknown block operation " + std::to_string(kind));
      op.kind = static_cast<KvOp::Kind>(kind);
      op.seq = o.getSeq();
      op.cached = o.getCached();
      op.num_tokens = o.getNumTokens();
      op.allowance = o.getAllowance();
      op.whole = o.getWhole();
      op.tokens = get<int32_t>(o.getTokens());
      x.ops.push_back(std::move(op));
    }
    for (auto p : msg.getProbes()) x.probes.push_back({p.getSeq(), get<int32_t>(p.getTokens())});
    x.tables = get<int64_t>(msg.getTables());
    x.drop_cached = msg.getDropCached();
    return x;
  });
}

Bytes encode(const KvOpsReply& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::KvOpsReply>();
  msg.setBatch(x.batch);
  auto res = msg.initResults(n(x.results.size()));
  for (unsigned i = 0; i < x.results.size(); ++i) {
    res[i].setOk(x.results[i].ok);
    res[i].setCached(x.results[i].cached);
    res[i].setNumNew(x.results[i].num_new);
  }
  auto copies = msg.initCopies(n(x.copies.size()));
  for (unsigned i = 0; i < x.copies.size(); ++i) {
    copies[i].setSrc(x.copies[i].src);
    copies[i].setDst(x.copies[i].dst);
  }
  auto tables = msg.initTables(n(x.tables.size()));
  for (unsigned i = 0; i < x.tables.size(); ++i) {
    tables[i].setSeq(x.tables[i].seq);
    put(tables[i].initBlocks(n(x.tables[i].blocks.size())), x.tables[i].blocks);
  }
  auto snap = msg.initSnapshot();
  snap.setNumFree(x.snapshot.num_free);
  auto seqs = snap.initSeqs(n(x.snapshot.seqs.size()));
  for (unsigned i = 0; i < x.snapshot.seqs.size(); ++i) {
    seqs[i].setSeq(x.snapshot.seqs[i].seq);
    seqs[i].setHeld(x.snapshot.seqs[i].held);
    seqs[i].setExclusive(x.snapshot.seqs[i].exclusive);
  }
  auto hints = snap.initHints(n(x.snapshot.hints.size()));
  for (unsigned i = 0; i < x.snapshot.hints.size(); ++i) {
    hints[i].setSeq(x.snapshot.hints[i].seq);
    hints[i].setCachedBlocks(x.snapshot.hints[i].cached_blocks);
    hints[i].setFreeListed(x.snapshot.hints[i].free_listed);
  }
  write_kv_stats(snap.initStats(), x.snapshot.stats);
  return to_bytes(m);
}

Result<KvOpsReply> decode_kv_ops_reply(const Bytes& b) {
  return read<schema::KvOpsReply>(b, "KvOpsReply", [](schema::KvOpsReply::Reader msg) -> Result<KvOpsReply> {
    KvOpsReply x;
    x.batch = msg.getBatch();
    for (auto r : msg.getResults()) x.results.push_back({r.getOk(), r.getCached(), r.getNumNew()});
    for (auto c : msg.getCopies()) x.copies.push_back({c.getSrc(), c.getDst()});
    for (auto t : msg.getTables()) x.tables.push_back({t.getSeq(), get<int32_t>(t.getBlocks())});
    auto snap = msg.getSnapshot();
    x.snapshot.num_free = snap.getNumFree();
    for (auto s : snap.getSeqs()) x.snapshot.seqs.push_back({s.getSeq(), s.getHeld(), s.getExclusive()});
    for (auto h : snap.getHints()) x.snapshot.hints.push_back({h.getSeq(), h.getCachedBlocks(), h.getFreeListed()});
    x.snapshot.stats = read_kv_stats(snap.getStats());
    return x;
  });
}

}  // namespace troupe::codec
