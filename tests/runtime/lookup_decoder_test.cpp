// Prompt-lookup decoding (runtime/engine/lookup_decoder.h): the drafts proposed for a history,
// and, on the default model, the same tokens as one token a step -- greedy, seeded sampling
// with a repetition penalty -- in fewer steps when the text repeats itself; the cache then
// holds exactly the tokens recorded as fed.
#include <catch2/catch.hpp>

#include "kernels/backend.h"
#include "runtime/engine/lookup_decoder.h"
#include "runtime/model/model.h"
#include "runtime/model/model_files.h"
#include "tests/test_util.h"

using namespace troupe;

TEST_CASE("prompt lookup: drafts follow the latest earlier occurrence of the longest suffix", "[lookup]") {
  // ... 7 8 9 | 5 ... 7 8 9 | 6 ... 7 8 9 -> the latest "7 8 9" before the end is followed by 6 1 2
  const std::vector<int32_t> h = {7, 8, 9, 5, 3, 7, 8, 9, 6, 1, 2, 4, 7, 8, 9};
  CHECK(propose_lookup_drafts(h, 3, 2, 3) == std::vector<int32_t>{6, 1, 2});
  CHECK(propose_lookup_drafts(h, 3, 2, 1) == std::vector<int32_t>{6});
  // The drafts stop at the end of the history.
  CHECK(propose_lookup_drafts({1, 2, 3, 1, 2}, 3, 2, 8) == std::vector<int32_t>{3, 1, 2});
  // The longest suffix first: "2 3" matches at 1 (followed by 9), "3" alone later (followed by 5).
  CHECK(propose_lookup_drafts({4, 2, 3, 9, 3, 5, 2, 3}, 2, 1, 1) == std::vector<int32_t>{9});
  CHECK(propose_lookup_drafts({4, 2, 3, 9, 3, 5, 6, 3}, 2, 1, 2) == std::vector<int32_t>{5, 6});
  // No earlier occurrence, too short a history, no drafts wanted: nothing.
  CHECK(propose_lookup_drafts({1, 2, 3, 4, 5}, 3, 2, 4).empty());
  CHECK(propose_lookup_drafts({1}, 3, 1, 4).empty());
  CHECK(propose_lookup_drafts({}, 3, 1, 4).empty());
  CHECK(propose_lookup_drafts({1, 2, 1, 2}, 3, 2, 0).empty());
  // The suffix never matches itself: a run of one token drafts that token.
  CHECK(propose_lookup_drafts({5, 5, 5}, 2, 2, 4) == std::vector<int32_t>{5});
}

namespace {

struct Generation {
  std::vector<int32_t> tokens, fed;
  LookupStats stats;
  int32_t cache_length = 0;
};

Generation generate(Model& model, Backend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp, int drafts,
                    int n) {
  Generation g;
  auto runner = SequenceRunner::create(model, be, 512);
  REQUIRE(runner.ok());
  Sampler sampler(sp, model.config().vocab);
  sampler.add_prompt(prompt);
  LookupDecoder dec(**runner, sampler, drafts, {}, &g.fed);
  auto s = dec.prefill(prompt);
  REQUIRE(s.ok());
  for (int i = 0; i < n; ++i) {
    sampler.accept(s->token);
    g.tokens.push_back(s->token);
    if (i + 1 == n) break;
    s = dec.next(*s, n - i - 2);
    REQUIRE(s.ok());
  }
  dec.finish();
  g.stats = dec.stats();
  g.cache_length = (*runner)->length();
  return g;
}

}  // namespace

TEST_CASE("prompt lookup on the default model: the same tokens in fewer steps", "[lookup][default_model]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto files = open_gguf(path);
  REQUIRE(files.ok());
  auto backend = make_cpu_backend({2});
  auto model = Model::build(files->config, *files->weights, *backend, 64);
  REQUIRE(model.ok());
  const auto& tok = *files->tokenizer;
  // A text the model copies: its tokens recur, so the lookup finds drafts.
  const std::string passage =
      "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
      "How vexingly quick daft zebras jump!";
  const auto prompt = tok.encode(
      "Copy this text exactly.\nText: " + passage + "\nCopy: " + passage + "\nText: " + passage + "\nCopy:", true,
      true);
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams seeded;
  seeded.temperature = 0.7f;
  seeded.top_k = 40;
  seeded.top_p = 0.95f;
  seeded.repetition_penalty = 1.1f;
  seeded.seed = 1234;
  const int n = 48;
  for (const SamplingParams& sp : {greedy, seeded}) {
    INFO("temperature " << sp.temperature);
    const Generation plain = generate(**model, *backend, prompt, sp, 0, n);
    CHECK(plain.stats.drafted == 0);
    CHECK(plain.stats.steps == n - 1);
    for (int drafts : {1, 4, 8}) {
      INFO("drafts " << drafts);
      const Generation spec = generate(**model, *backend, prompt, sp, drafts, n);
      CHECK(spec.tokens == plain.tokens);
      INFO("steps " << spec.stats.steps << ", drafted " << spec.stats.drafted << ", accepted " << spec.stats.accepted);
      CHECK(spec.stats.accepted > 0);
      CHECK(spec.stats.steps + spec.stats.accepted == n - 1);  // every token a step or an accepted draft
      CHECK(spec.stats.accepted <= spec.stats.drafted);
      // The cache holds exactly the tokens recorded as fed: the prompt and every token but
      // the last (sampled, not fed); the rejected drafts' KV is forgotten.
      CHECK(spec.cache_length == static_cast<int32_t>(spec.fed.size()));
      std::vector<int32_t> want = prompt;
      want.insert(want.end(), spec.tokens.begin(), spec.tokens.end() - 1);
      CHECK(spec.fed == want);
    }
  }
  // Greedy copying is what the lookup is for: most of the steps go.
  const Generation g = generate(**model, *backend, prompt, greedy, 8, n);
  INFO("greedy, 8 drafts: " << g.stats.steps << " steps for " << n << " tokens, " << g.stats.accepted << " of "
                            << g.stats.drafted << " drafts accepted");
  CHECK(g.stats.steps < n / 2);
}
