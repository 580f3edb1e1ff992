// Request actor: one per API request. It has the prompts encoded by the tokenizer pool,
// checks that they fit, submits one sequence per choice (n per prompt) to the scheduler,
// and turns the scheduler's token events into text deltas: incremental UTF-8-safe
// detokenization, stop strings (text held back while it could still become a stop string)
// and stop tokens, logprobs, finish reasons and usage. A cancel (client gone) aborts every
// sequence of the request at the scheduler, which frees their KV blocks at once.
//
// Results leave through a process-local callback (the HTTP session posts them to its own
// thread); nothing in the actor's messages refers to process memory.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/tokenizer_actor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace troupe::actors {

struct PromptInput {
  std::optional<std::string> text;  // else token ids
  std::vector<int32_t> ids;
};

struct RequestSpec {
  std::string request_id;  // for logs ("cmpl-...")
  bool is_chat = false;
  std::vector<PromptInput> prompts;          // completions
  std::vector<std::string> roles, contents;  // chat
  std::optional<int32_t> max_tokens;         // nullopt: the rest of the context
  int32_t n = 1;
  // What every choice's SeqRequest starts from: sampling, stop tokens, ignore_eos, priority
  // (its id, prompt and max_new_tokens are set per choice, its seed is seed + choice).
  SeqRequest seq;
  bool has_seed = false;  // choice i uses seed + i
  std::vector<std::string> stop;
  bool echo = false;
  bool want_logprobs = false;
  int32_t max_context = 0;
};

struct TokenOut {
  int32_t id = -1;
  std::string text;  // the token's bytes (may be part of a UTF-8 sequence)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

struct RequestUpdate {
  enum class Kind { started, delta, finished, failed, done } kind = Kind::delta;
  // started: tokens per prompt and the prompt texts (for echo)
  std::vector<int32_t> prompt_tokens;
  std::vector<std::string> prompt_texts;
  // delta / finished: one choice
  int32_t index = 0;
  std::string text;
  std::vector<TokenOut> tokens;
  std::string finish_reason;  // finished: "stop" | "length"
  // failed: an API error (status 400 with param, or 500/503)
  int status = 0;
  std::string message, param;
  // done: usage and timings for logs and metrics
  int64_t prompt_total = 0, completion_total = 0;
  // Speculative drafts the target accepted and rejected for this request (both 0 without).
  int64_t drafts_accepted = 0, drafts_rejected = 0;
  double ttft = 0, e2e = 0, queue = 0;
  std::vector<double> itl;  // seconds between tokens of choice 0
};

using UpdateFn = std::function<void(RequestUpdate)>;

struct RequestContext {
  scheduler_actor scheduler;
  std::shared_ptr<TokenizerPool> tokenizers;
  std::shared_ptr<const Tokenizer> tokenizer;  // detokenization
  std::shared_ptr<std::atomic<int64_t>> next_seq_id;
};

struct ChoiceState;

struct RequestState {
  RequestContext ctx;
  RequestSpec spec;
  UpdateFn emit;
  std::vector<std::vector<int32_t>> prompts;  // encoded
  std::vector<std::shared_ptr<ChoiceState>> choices;
  int64_t first_seq = 0;
  int32_t num_open = 0;
  int64_t completion_tokens = 0;
  int64_t drafts_accepted = 0, drafts_rejected = 0;
  bool closed = false;
  std::chrono::steady_clock::time_point start, first_token, last_token;
  bool has_first = false, has_last0 = false;
  double queue = 0;
  std::vector<double> itl;
  static inline const char* name = "request";
};

request_actor::behavior_type request_fn(request_actor::stateful_pointer<RequestState> self, RequestContext ctx,
                                        RequestSpec spec, UpdateFn emit);

}  // namespace troupe::actors
