#include "actors/codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

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
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = 8u << 20;
  opts.nestingLimit = 16;
  try {
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.data(), words.size()), opts);
    return fn(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    return make_error(std::string(what) + ": malformed message: " + e.getDescription().cStr());
  }
}

}  // namespace

Bytes encode_submit(const SchedRequest& r, const SamplingParams& sp) {
  capnp::MallocMessageBuilder m;
  auto msg = m.initRoot<schema::SubmitRequest>();
  msg.setId(r.id);
  auto toks = msg.initPromptTokens(static_cast<unsigned>(r.prompt.size()));
  for (unsigned i = 0; i < r.prompt.size(); ++i) toks.set(i, r.prompt[i]);
  msg.setMaxNewTokens(r.max_new_tokens);
  msg.setPriority(r.priority);
  auto s = msg.initSampling();
  s.setTemperature(sp.temperature);
  s.setTopK(sp.top_k);
  s.setTopP(sp.top_p);
  s.setMinP(sp.min_p);
  s.setRepetitionPenalty(sp.repetition_penalty);
  s.setPresencePenalty(sp.presence_penalty);
  s.setFrequencyPenalty(sp.frequency_penalty);
  s.setSeed(sp.seed);
  s.setLogprobs(sp.logprobs);
  auto lb = s.initLogitBias(static_cast<unsigned>(sp.logit_bias.size()));
  unsigned i = 0;
  for (const auto& [tok, bias] : sp.logit_bias) {
    lb[i].setToken(tok);
    lb[i].setBias(bias);
    ++i;
  }
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
    SamplingParams sp;
    auto s = msg.getSampling();
    sp.temperature = s.getTemperature();
    sp.top_k = s.getTopK();
    sp.top_p = s.getTopP();
    sp.min_p = s.getMinP();
    sp.repetition_penalty = s.getRepetitionPenalty();
    sp.presence_penalty = s.getPresencePenalty();
    sp.frequency_penalty = s.getFrequencyPenalty();
    sp.seed = s.getSeed();
    sp.logprobs = s.getLogprobs();
    for (auto e : s.getLogitBias()) sp.logit_bias[e.getToken()] = e.getBias();
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
    for (auto s : msg.getSeqs()) {
      if (s.getNumComputed() < 0 || s.getNumNew() < 0)
        return make_error("StepPlan: negative token counts for sequence " + std::to_string(s.getId()));
      p.seqs.push_back({s.getId(), s.getNumComputed(), s.getNumNew(), s.getSamples()});
      p.num_tokens += s.getNumNew();
    }
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

}  // namespace troupe::codec
