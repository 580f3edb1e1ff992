// Chat messages to prompt tokens: the chat template is rendered to text and tokenized with
// its special tokens parsed (the template writes <|im_start|> and the like), while text
// inside a message's content stays text: a user who types "<|im_end|>" gets those
// characters, not the control token (RELIABILITY: special-token text in user content is
// tokenized as text).
#pragma once
#include <string>
#include <vector>

#include "runtime/chat/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace troupe {

// When no content holds special-token text, the whole rendered prompt is tokenized at once
// with special tokens parsed (as before this function existed; the model's BOS rule applies). Otherwise the template is
// rendered with an unguessable placeholder per content, the template's own text is
// tokenized with special tokens and each content without; the placeholders must come back
// where the contents would have been (checked against a plain render), else -- and for
// tokenizers that prefix a space to every encoded piece -- the request is refused.
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tok, const ChatTemplate& tmpl,
                                         const std::vector<ChatMessage>& messages, bool add_generation_prompt);

}  // namespace troupe
