#include "actors/tokenizer_actor.h"

#include "runtime/chat/chat_encode.h"

namespace troupe::actors {

tokenizer_actor::behavior_type tokenizer_fn(tokenizer_actor::stateful_pointer<TokenizerState> self,
                                            std::shared_ptr<const Tokenizer> tok,
                                            std::shared_ptr<const ChatTemplate> tmpl) {
  self->state.tok = std::move(tok);
  self->state.tmpl = std::move(tmpl);
  return {
      [=](const EncodeText& e) -> EncodeResult {
        return {self->state.tok->encode(e.text, e.add_special, e.parse_special), {}};
      },
      [=](const EncodeChat& e) -> EncodeResult {
        const auto& st = self->state;
        if (!st.tmpl) return {{}, "this model has no chat template; use /v1/completions"};
        if (e.roles.size() != e.contents.size()) return {{}, "chat roles and contents differ in count"};
        std::vector<ChatMessage> msgs;
        for (size_t i = 0; i < e.roles.size(); ++i) msgs.push_back({e.roles[i], e.contents[i]});
        auto ids = encode_chat(*st.tok, *st.tmpl, msgs, e.add_generation_prompt);
        if (!ids) return {{}, ids.error().message};
        return {std::move(*ids), {}};
      },
      [=](const DecodeTokens& d) -> std::string { return self->state.tok->decode(d.ids, false); },
  };
}

}  // namespace troupe::actors
