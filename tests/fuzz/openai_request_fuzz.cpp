// libFuzzer target: the OpenAI request parser (apps/serve/openai_request.cpp) on arbitrary
// bodies, as /v1/completions, /v1/chat/completions, /tokenize and /detokenize would see
// them. Every outcome must be a parsed request within the limits or an error with an HTTP
// status and a message; error_json must always produce output.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "apps/serve/openai_request.h"
#include "runtime/grammar/grammar.h"

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  api::Limits lim;
  lim.vocab_size = 49152;
  lim.max_context = 2048;
  lim.model_names = {"m"};
  lim.num_speculative_tokens = (size & 1) ? 7 : 0;  // a speculating server and a plain one
  for (bool chat : {false, true}) {
    auto r = api::parse_generation(body, chat, lim);
    if (auto* e = std::get_if<api::ApiError>(&r)) {
      if (e->status < 400 || e->status > 599 || e->message.empty()) std::abort();
      if (api::error_json(*e).empty()) std::abort();
      continue;
    }
    const auto& g = std::get<api::GenerationRequest>(r);
    if (g.n < 1 || g.n > lim.max_n || g.stop.size() > static_cast<size_t>(lim.max_stop)) std::abort();
    if (g.top_logprobs < 0 || g.top_logprobs > lim.max_top_logprobs) std::abort();
    if (g.seq.num_speculative_tokens < -1 || g.seq.num_speculative_tokens > lim.num_speculative_tokens) std::abort();
    // a constraint the parser admits always compiles (the stage compiles it again)
    if (!g.seq.sampling.grammar.empty() && !Grammar::compile(g.seq.sampling.grammar).ok()) std::abort();
    for (const auto& p : g.prompts)
      for (int32_t t : p.token_ids)
        if (t < 0 || t >= lim.vocab_size) std::abort();
    auto fit = api::check_prompt_fits(size % 3000, g, lim);
    if (auto* m = std::get_if<int32_t>(&fit))
      if (*m < 1 || (size % 3000) + static_cast<size_t>(*m) > static_cast<size_t>(lim.max_context)) std::abort();
  }
  auto t = api::parse_tokenize(body, lim);
  (void)t;
  auto d = api::parse_detokenize(body, lim);
  if (auto* ids = std::get_if<std::vector<int32_t>>(&d))
    for (int32_t id : *ids)
      if (id < 0 || id >= lim.vocab_size) std::abort();
  return 0;
}
