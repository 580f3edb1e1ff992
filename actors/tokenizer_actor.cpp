#include "actors/tokenizer_actor.h"

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
        const Tokenizer& t = *st.tok;
        const std::string bos = t.bos_id() >= 0 ? t.token_text(t.bos_id()) : "";
        const std::string eos = t.eos_id() >= 0 ? t.token_text(t.eos_id()) : "";
        auto text = st.tmpl->render(msgs, e.add_generation_prompt, bos, eos);
        if (!text) return {{}, "chat template: " + text.error().message};
        // The rendered text holds the template's special tokens, so they are parsed here.
        return {t.encode(*text, true, true), {}};
      },
      [=](const DecodeTokens& d) -> std::string { return self->state.tok->decode(d.ids, false); },
  };
}

}  // namespace troupe::actors
