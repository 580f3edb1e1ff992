// UTF-8 validation/repair and the incremental detokenizer.
#include <algorithm>

#include "runtime/tokenizer/tokenizer.h"

namespace troupe {

namespace {
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid. When `incomplete` is given, it is
// set when the bytes are a valid but truncated prefix that ends at the end of `s`.
size_t valid_sequence_len(std::string_view s, size_t i, bool* incomplete = nullptr) {
  if (incomplete) *incomplete = false;
  auto c0 = static_cast<uint8_t>(s[i]);
  if (c0 < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;  // no overlongs
    if (c0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      if (incomplete) *incomplete = true;
      return 0;
    }
    auto c = static_cast<uint8_t>(s[i + k]);
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return 0;
  }
  return len;
}
}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = valid_sequence_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = valid_sequence_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Replace the maximal subpart: the lead byte plus the continuation bytes that were still valid.
    out += kReplacement;
    size_t j = i + 1;
    auto c0 = static_cast<uint8_t>(s[i]);
    if (c0 >= 0xC2 && c0 <= 0xF4) {
      std::string_view probe = s.substr(i, std::min<size_t>(4, s.size() - i));
      for (size_t k = 2; k <= probe.size(); ++k) {  // longest prefix that is still a valid prefix
        bool incomplete = false;
        valid_sequence_len(probe.substr(0, k), 0, &incomplete);
        if (!incomplete) break;
        j = i + k;
      }
    }
    i = j;
  }
  return out;
}

namespace {
// Bytes at the end of `s` that form a valid but unfinished UTF-8 sequence (0..3).
size_t incomplete_tail(std::string_view s) {
  size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    auto c = static_cast<uint8_t>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    bool incomplete = false;
    valid_sequence_len(s, n - k, &incomplete);
    return incomplete ? k : 0;
  }
  return 0;
}
}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (id < 0 || id >= tok_.vocab_size()) return {};
  if (skip_special_ && tok_.is_special(id)) return {};
  std::string piece = tok_.token_text(id);
  if (is_first_ && !piece.empty()) {
    is_first_ = false;
    if (tok_.strips_leading_space() && piece[0] == ' ') piece.erase(0, 1);
  }
  pending_ += piece;
  size_t keep = incomplete_tail(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace troupe
