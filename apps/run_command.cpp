// `troupe run`: generate from a prompt, or chat interactively with the model's template.
// Sequences go through the same engine `troupe serve` runs (apps/local_engine.h); only
// --draft-max (prompt lookup) still feeds one sequence directly until speculation moves
// into the scheduler.
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <random>

#include "apps/common.h"
#include "apps/local_engine.h"
#include "apps/subcommands.h"
#include "runtime/chat/chat_template.h"
#include "runtime/engine/lookup_decoder.h"
#include "runtime/sample/sampler.h"
#include "runtime/engine/sequence_runner.h"

namespace troupe::app {
namespace {

int g_exit_code = 0;

struct RunFlags {
  ModelFlags model;
  ExpertFlags experts;
  std::string prompt;
  bool chat = false;
  bool raw = false;
  int max_tokens = 256;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int top_k = 40;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int64_t seed = -1;
  std::string system;
  bool ignore_eos = false;
  bool prompt_given = false;
  int draft_max = 0;  // prompt-lookup drafts per step (0: off)
};

using Clock = std::chrono::steady_clock;

struct Stats {
  int prompt_tokens = 0, gen_tokens = 0;
  double prompt_s = 0, gen_s = 0;
  bool lookup = false;
  LookupStats drafts;
  void print() const {
    std::fprintf(stderr, "\n[prompt: %d tokens, %.1f tok/s | decode: %d tokens, %.1f tok/s", prompt_tokens,
                 prompt_s > 0 ? prompt_tokens / prompt_s : 0.0, gen_tokens, gen_s > 0 ? gen_tokens / gen_s : 0.0);
    if (lookup)
      std::fprintf(stderr, " | %lld steps, %lld of %lld drafts accepted", static_cast<long long>(drafts.steps),
                   static_cast<long long>(drafts.accepted), static_cast<long long>(drafts.drafted));
    std::fprintf(stderr, "]\n");
  }
};

// Feeds `tokens`, then samples until EOS or max_tokens, streaming text to stdout.
// Appends every token whose KV the cache keeps to `fed` (when given), so a chat knows
// what the cache holds. With draft_max > 0, prompt-lookup drafts (runtime/engine/lookup_decoder.h):
// the same tokens, in fewer steps when the text repeats earlier text.
Status generate(SequenceRunner& runner, const Tokenizer& tok, Sampler& sampler, const std::vector<int32_t>& tokens,
                int max_tokens, bool ignore_eos, int draft_max, Stats& stats, std::string* reply,
                std::vector<int32_t>* fed = nullptr) {
  auto t0 = Clock::now();
  sampler.add_prompt(tokens);
  LookupDecoder decoder(runner, sampler, draft_max, fed ? *fed : std::vector<int32_t>{}, fed);
  struct Finish {  // the cache keeps only what was accepted, however this returns
    LookupDecoder& d;
    ~Finish() { d.finish(); }
  } finish{decoder};
  // Each feed also draws the next token (on the device when the backend can).
  auto next = decoder.prefill(tokens);
  if (!next) return next.error();
  stats.lookup = draft_max > 0;
  stats.prompt_tokens = static_cast<int>(tokens.size());
  stats.prompt_s = std::chrono::duration<double>(Clock::now() - t0).count();
  IncrementalDecoder dec(tok);
  auto t1 = Clock::now();
  stats.gen_tokens = 0;
  for (int i = 0; i < max_tokens; ++i) {
    const SampleResult s = *next;
    sampler.accept(s.token);
    ++stats.gen_tokens;
    if (!ignore_eos && tok.is_eog(s.token)) break;
    const std::string piece = dec.push(s.token);
    std::cout << piece << std::flush;
    if (reply) *reply += piece;
    if (i + 1 == max_tokens) break;
    if (decoder.kept_length() >= runner.context()) {
      spdlog::warn("context of {} tokens is full; stopping", runner.context());
      break;
    }
    next = decoder.next(s, max_tokens - i - 2);
    if (!next) return next.error();
  }
  stats.drafts = decoder.stats();
  const std::string rest = dec.flush();
  std::cout << rest << std::flush;
  if (reply) *reply += rest;
  stats.gen_s = std::chrono::duration<double>(Clock::now() - t1).count();
  return {};
}

// Through the engine: submits `tokens` (the whole prompt or conversation; a chat's earlier
// turns are found in the prefix cache), streams the sampled text to stdout until EOS or
// max_tokens.
Status generate_engine(LocalEngine& engine, const Tokenizer& tok, const SamplingParams& sp,
                       const std::vector<int32_t>& tokens, int max_tokens, bool ignore_eos, Stats& stats,
                       std::string* reply) {
  const int ctx = engine.files().config.max_context;
  const int room = ctx - static_cast<int>(tokens.size());
  SeqRequest r;
  r.id = engine.next_id();
  r.prompt = tokens;
  r.sampling = sp;
  r.ignore_eos = ignore_eos;
  r.max_new_tokens = std::min(max_tokens, room);
  stats.prompt_tokens = static_cast<int>(tokens.size());
  stats.gen_tokens = 0;
  if (r.max_new_tokens <= 0) return {};
  IncrementalDecoder dec(tok);
  const auto t0 = Clock::now();
  auto t1 = t0;
  auto st = engine.run_seq(std::move(r), [&](const actors::SeqEvent& ev) {
    const auto now = Clock::now();
    if (stats.gen_tokens++ == 0) {
      stats.prompt_s = std::chrono::duration<double>(now - t0).count();
      t1 = now;
    }
    stats.gen_s = std::chrono::duration<double>(now - t1).count();
    if (ev.hit_stop) return true;  // (a stop token's text is not printed)
    const std::string piece = dec.push(ev.token);
    std::cout << piece << std::flush;
    if (reply) *reply += piece;
    return true;
  });
  const std::string rest = dec.flush();
  std::cout << rest << std::flush;
  if (reply) *reply += rest;
  if (st && room < max_tokens && stats.gen_tokens == room) spdlog::warn("context of {} tokens is full; stopping", ctx);
  return st;
}

// The sequence loop with prompt-lookup drafts (--draft-max): one sequence fed directly
// through a SequenceRunner, a chat's cache reused by keeping the common prefix.
struct LookupRun {
  LoadedEngine engine;
  std::unique_ptr<SequenceRunner> runner;
  std::vector<int32_t> fed;  // what the cache holds
};

int run(const RunFlags& f) {
  if (!f.prompt.empty() && !is_valid_utf8(f.prompt)) {
    spdlog::error("the prompt is not valid UTF-8");
    return 2;
  }
  if (f.prompt_given && f.prompt.empty()) {
    spdlog::error("the prompt is empty");
    return 2;
  }
  if (f.max_tokens < 0) {
    spdlog::error("-n must be >= 0");
    return 2;
  }
  std::unique_ptr<LocalEngine> engine;
  std::optional<LookupRun> lookup;
  const ModelFiles* files = nullptr;
  if (f.draft_max == 0) {
    LocalEngineOptions eo;
    eo.kv_tokens = f.model.ctx + 16;
    eo.require_tokenizer = false;
    eo.experts = f.experts;
    auto e = LocalEngine::start(f.model, eo);
    if (!e) {
      spdlog::error("{}", e.error().message);
      return 1;
    }
    engine = std::move(*e);
    files = &engine->files();
  } else {
    if (f.experts.enabled()) {
      spdlog::error("--draft-max runs without the actors: it cannot take --expert-parallel/--expert-placement");
      return 2;
    }
    auto e = load_engine(f.model);
    if (!e) {
      spdlog::error("{}", e.error().message);
      return 1;
    }
    lookup.emplace();
    lookup->engine = std::move(*e);
    files = &lookup->engine.files;
  }
  if (!files->tokenizer) {
    spdlog::error("this model has no tokenizer (dummy weights): use `troupe bench` instead");
    return 2;
  }
  const Tokenizer& tok = *files->tokenizer;
  const int ctx = std::min(f.model.ctx, files->config.max_context);
  if (lookup) {
    auto runner = SequenceRunner::create(*lookup->engine.model, *lookup->engine.backend, ctx);
    if (!runner) {
      spdlog::error("{}", runner.error().message);
      return 2;
    }
    lookup->runner = std::move(*runner);
  }
  SamplingParams sp;
  sp.temperature = f.temperature;
  sp.top_p = f.top_p;
  sp.top_k = f.top_k;
  sp.min_p = f.min_p;
  sp.repetition_penalty = f.repeat_penalty;
  sp.seed = f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  if (auto st = sp.validate(tok.vocab_size()); !st) {
    spdlog::error("{}", st.error().message);
    return 2;
  }
  spdlog::debug("seed {}", sp.seed);
  // One reply to `all` (the prompt, or the whole conversation so far).
  auto reply_to = [&](const std::vector<int32_t>& all, bool ignore_eos, Stats& stats, std::string* reply) -> Status {
    if (engine) return generate_engine(*engine, tok, sp, all, f.max_tokens, ignore_eos, stats, reply);
    // Only the tokens beyond what the cache already holds are fed.
    std::vector<int32_t>& fed = lookup->fed;
    size_t common = 0;
    while (common < fed.size() && common < all.size() && fed[common] == all[common]) ++common;
    if (common < fed.size()) {  // the history differs from the cache after `common`
      lookup->runner->truncate(static_cast<int32_t>(common));
      fed.resize(common);
    }
    std::vector<int32_t> fresh(all.begin() + static_cast<long>(common), all.end());
    if (fresh.empty()) return {};
    Sampler sampler(sp, tok.vocab_size());
    return generate(*lookup->runner, tok, sampler, fresh, f.max_tokens, ignore_eos, f.draft_max, stats, reply, &fed);
  };

  std::optional<ChatTemplate> tmpl;
  const bool use_template = !f.raw && !files->chat_template.empty();
  if (use_template) {
    auto t = ChatTemplate::parse(files->chat_template);
    if (!t) {
      spdlog::error("chat template: {}", t.error().message);
      return 1;
    }
    tmpl = std::move(*t);
  }
  const std::string bos = tok.bos_id() >= 0 ? tok.token_text(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.token_text(tok.eos_id()) : "";
  std::vector<ChatMessage> messages;
  if (!f.system.empty()) messages.push_back({"system", f.system});

  if (!f.chat) {
    if (f.prompt.empty()) {
      spdlog::error("the prompt is empty");
      return 2;
    }
    // A plain prompt is completed as text (like llama.cpp's -p without -cnv).
    std::vector<int32_t> tokens = tok.encode(f.prompt, true, true);
    if (tokens.empty()) {
      spdlog::error("the prompt produced no tokens");
      return 2;
    }
    if (static_cast<int>(tokens.size()) >= ctx) {
      spdlog::error("the prompt has {} tokens, more than the context of {} allows", tokens.size(), ctx);
      return 2;
    }
    Stats stats;
    std::cout << f.prompt << std::flush;
    if (auto st = reply_to(tokens, f.ignore_eos, stats, nullptr); !st) {
      spdlog::error("{}", st.error().message);
      return 1;
    }
    std::cout << "\n";
    stats.print();
    return 0;
  }

  // Interactive chat: the whole conversation is re-rendered each turn; what the KV cache
  // already holds of it is not computed again.
  std::fprintf(stderr, "chat with %s; an empty line or Ctrl-D ends\n", files->config.name.c_str());
  std::string line = f.prompt;
  bool first = true;
  for (;;) {
    if (!first || line.empty()) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line) || line.empty()) break;
    }
    first = false;
    if (!is_valid_utf8(line)) {
      spdlog::error("input is not valid UTF-8; try again");
      line.clear();
      continue;
    }
    messages.push_back({"user", line});
    std::string text;
    if (tmpl) {
      auto r = tmpl->render(messages, true, bos, eos);
      if (!r) {
        spdlog::error("chat template: {}", r.error().message);
        return 1;
      }
      text = std::move(*r);
    } else {
      text = line + "\n";
    }
    std::vector<int32_t> all = tok.encode(text, true, true);
    if (static_cast<int>(all.size()) + f.max_tokens > ctx) {
      spdlog::error("the conversation ({} tokens) no longer fits the context of {}", all.size(), ctx);
      return 2;
    }
    Stats stats;
    std::string reply;
    if (auto st = reply_to(all, false, stats, &reply); !st) {
      spdlog::error("{}", st.error().message);
      return 1;
    }
    std::cout << "\n";
    stats.print();
    messages.push_back({"assistant", reply});
  }
  return 0;
}

}  // namespace

int exit_code() { return g_exit_code; }
void set_exit_code(int code) { g_exit_code = code; }

void add_run_command(CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Generate text from a prompt (-p) or chat interactively (--chat, the default without -p)");
  flags->model.add_to(*cmd);
  flags->experts.add_to(*cmd, true);
  CLI::Option* prompt =
      cmd->add_option("-p,--prompt", flags->prompt, "prompt to complete (as plain text, without the chat template)");
  cmd->add_flag("--chat", flags->chat,
                "interactive chat using the model's chat template (default when no -p is given)");
  cmd->add_option("--system", flags->system, "system message for --chat");
  cmd->add_flag("--raw", flags->raw, "in --chat, send lines without the chat template");
  cmd->add_option("-n,--max-tokens", flags->max_tokens, "tokens to generate per reply")->capture_default_str();
  cmd->add_option("--temperature,--temp", flags->temperature, "sampling temperature; 0 is greedy")
      ->capture_default_str();
  cmd->add_option("--top-p", flags->top_p,
                  "nucleus sampling: keep the smallest set with this much probability (1: off)")
      ->capture_default_str();
  cmd->add_option("--top-k", flags->top_k, "keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--min-p", flags->min_p, "drop tokens below min-p times the top probability (0: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", flags->repeat_penalty, "divide logits of tokens already seen (1: off)")
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "sampling seed; the same seed gives the same output (-1: random)")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "keep generating after the end-of-sequence token");
  cmd->add_option(
         "--draft-max", flags->draft_max,
         "prompt-lookup speculative decoding: when the last tokens appeared earlier in the prompt or the reply, "
         "feed up to this many of the tokens that followed them as drafts in the same step, and keep those the "
         "model samples anyway (the output is the same as without; faster when the text repeats earlier text, "
         "slower on a CPU when the drafts miss); 0: off")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->callback([flags, prompt] {
    RunFlags f = *flags;
    f.prompt_given = prompt->count() > 0;
    if (!f.prompt_given) f.chat = true;
    set_exit_code(run(f));
  });
}

}  // namespace troupe::app
