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
  s.setGrammar(sp.grammar);
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
  sp.grammar = s.getGrammar();
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
  return read<schema::StageStep>(
      b, "StageStep", [](schema::StageStep::Reader msg) -> Result<actors::StageStep> { return read_stage_step(msg); });
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
    if (msg.hasError() && msg.getError().size() > 0)
      return R{actors::StepFailed{msg.getStepId(), text(msg.getError())}};
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
  auto ex = msg.initExperts(n(x.experts.size()));
  unsigned i = 0;
  for (const auto& [layer, ids] : x.experts) {
    ex[i].setLayer(layer);
    put(ex[i].initExperts(n(ids.size())), ids);
    ++i;
  }
  msg.setMaxExpertRows(x.max_expert_rows);
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
    for (auto e : msg.getExperts()) {
      if (x.experts.count(e.getLayer()))
        return make_error("NodeHello: layer " + std::to_string(e.getLayer()) + " has two expert sets");
      x.experts[e.getLayer()] = get<int32_t>(e.getExperts());
    }
    x.max_expert_rows = msg.getMaxExpertRows();
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
  return read<schema::NodeHelloReply>(
      b, "NodeHelloReply", [](schema::NodeHelloReply::Reader msg) -> Result<actors::NodeHelloReply> {
        return actors::NodeHelloReply{text(msg.getError()), text(msg.getModel()), text(msg.getDevice())};
      });
}

Bytes encode(const actors::ExpertDispatch& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::ExpertDispatch>();
  msg.setId(x.id);
  msg.setLayer(x.layer);
  put(msg.initExperts(n(x.experts.size())), x.experts);
  put(msg.initCounts(n(x.counts.size())), x.counts);
  put(msg.initRows(n(x.rows.size())), x.rows);
  return to_bytes(m);
}

Result<actors::ExpertDispatch> decode_expert_dispatch(const Bytes& b) {
  return read<schema::ExpertDispatch>(b, "ExpertDispatch",
                                      [](schema::ExpertDispatch::Reader msg) -> Result<actors::ExpertDispatch> {
                                        actors::ExpertDispatch x;
                                        x.id = msg.getId();
                                        x.layer = msg.getLayer();
                                        x.experts = get<int32_t>(msg.getExperts());
                                        x.counts = get<int32_t>(msg.getCounts());
                                        x.rows = get<float>(msg.getRows());
                                        return x;
                                      });
}

Bytes encode(const actors::ExpertResult& x) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::ExpertResult>();
  msg.setId(x.id);
  msg.setLayer(x.layer);
  put(msg.initRows(n(x.rows.size())), x.rows);
  msg.setError(wire_text(x.error));
  msg.setComputeSeconds(x.compute_seconds);
  return to_bytes(m);
}

Result<actors::ExpertResult> decode_expert_result(const Bytes& b) {
  return read<schema::ExpertResult>(b, "ExpertResult",
                                    [](schema::ExpertResult::Reader msg) -> Result<actors::ExpertResult> {
                                      actors::ExpertResult x;
                                      x.id = msg.getId();
                                      x.layer = msg.getLayer();
                                      x.rows = get<float>(msg.getRows());
                                      x.error = text(msg.getError());
                                      x.compute_seconds = msg.getComputeSeconds();
                                      return x;
                                    });
}

}  // namespace troupe::codec
