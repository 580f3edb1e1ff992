// Tokenizer actor: encodes prompts (plain text, or chat messages through the model's chat
// template) and decodes token ids. Stateless apart from the immutable vocabulary, so a pool
// of them (TokenizerPool) spreads long prompts over threads.
#pragma once
#include <atomic>
#include <memory>
#include <optional>

#include "actors/messages.h"
#include "runtime/chat/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace troupe::actors {

struct TokenizerState {
  std::shared_ptr<const Tokenizer> tok;
  std::shared_ptr<const ChatTemplate> tmpl;  // null: the model has none
  static inline const char* name = "tokenizer";
};

tokenizer_actor::behavior_type tokenizer_fn(tokenizer_actor::stateful_pointer<TokenizerState> self,
                                            std::shared_ptr<const Tokenizer> tok,
                                            std::shared_ptr<const ChatTemplate> tmpl);

// Round-robin over N tokenizer actors (thread-safe pick).
class TokenizerPool {
 public:
  explicit TokenizerPool(std::vector<tokenizer_actor> actors) : actors_(std::move(actors)) {}
  tokenizer_actor pick() { return actors_[next_.fetch_add(1) % actors_.size()]; }
  const std::vector<tokenizer_actor>& actors() const { return actors_; }

 private:
  std::vector<tokenizer_actor> actors_;
  std::atomic<size_t> next_{0};
};

}  // namespace troupe::actors
