#include "runtime/sample/json_constraint.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace troupe {
namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
constexpr int kMaxNumberBytes = 64;

}  // namespace

bool JsonPrefix::value_start(uint8_t c) {
  switch (c) {
    case '"':
      key_ = false;
      st_ = St::Str;
      return true;
    case '{':
    case '[':
      if (static_cast<int>(stack_.size()) >= kMaxDepth) return false;
      stack_.push_back(static_cast<char>(c));
      st_ = c == '{' ? St::ObjKeyOrEnd : St::ArrValueOrEnd;
      return true;
    case 't':
      lit_ = "true";
      break;
    case 'f':
      lit_ = "false";
      break;
    case 'n':
      lit_ = "null";
      break;
    default:
      if (c != '-' && !is_digit(c)) return false;
      st_ = St::Num;
      num_ = c == '-' ? Num::Minus : c == '0' ? Num::Zero : Num::Int;
      lit_pos_ = 1;  // (bytes of the number so far)
      return true;
  }
  st_ = St::Lit;
  lit_pos_ = 1;
  return true;
}

bool JsonPrefix::after_value(uint8_t c) {
  if (c == ',') {
    st_ = stack_.back() == '{' ? St::ObjKey : St::Value;
    return true;
  }
  if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
    stack_.pop_back();
    st_ = stack_.empty() ? St::Done : St::AfterValue;
    return true;
  }
  return false;
}

bool JsonPrefix::end_number_and(uint8_t c) {
  st_ = St::AfterValue;
  if (is_ws(c)) {
    spaces_ = 1;
    return true;
  }
  spaces_ = 0;
  return after_value(c);
}

// A UTF-8 lead byte (RFC 3629): how many continuation bytes follow, and the range of the
// first (no overlong forms, no surrogates, nothing past U+10FFFF).
bool JsonPrefix::utf8_lead(uint8_t c) {
  utf8_lo_ = 0x80;
  utf8_hi_ = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;
  } else {
    return false;
  }
  return true;
}

bool JsonPrefix::feed(uint8_t c) {
  switch (st_) {
    case St::Str:
      if (utf8_left_ > 0) {  // a continuation byte, in the range the sequence allows here
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80;
        utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        st_ = key_ ? St::Colon : St::AfterValue;
        spaces_ = 0;
        return true;
      }
      if (c == '\\') st_ = St::StrEsc;
      if (c < 0x80) return c >= 0x20;
      return utf8_lead(c);
    case St::StrEsc:
      if (c == 'u') {
        st_ = St::StrHex;
        hex_left_ = 4;
        hex_val_ = 0;
        return true;
      }
      st_ = St::Str;
      return c != 0 && std::strchr("\"\\/bfnrt", c) != nullptr;
    case St::StrHex: {
      if (!is_hex(c)) return false;
      const int v = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      hex_val_ = static_cast<uint16_t>(hex_val_ * 16 + v);
      if (--hex_left_ > 0) return true;
      const bool high = hex_val_ >= 0xD800 && hex_val_ <= 0xDBFF, low = hex_val_ >= 0xDC00 && hex_val_ <= 0xDFFF;
      if (want_low_) {  // the second half of a pair
        want_low_ = false;
        st_ = St::Str;
        return low;
      }
      if (low) return false;  // a low surrogate alone
      want_low_ = high;
      st_ = high ? St::StrLowEsc : St::Str;
      return true;
    }
    case St::StrLowEsc:
      st_ = St::StrLowU;
      return c == '\\';
    case St::StrLowU:
      st_ = St::StrHex;
      hex_left_ = 4;
      hex_val_ = 0;
      return c == 'u';
    case St::Lit:
      if (c != static_cast<uint8_t>(lit_[lit_pos_])) return false;
      if (lit_[++lit_pos_] == '\0') {
        st_ = St::AfterValue;
        spaces_ = 0;
      }
      return true;
    case St::Num: {
      const bool d = is_digit(c);
      if (d || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')
        if (++lit_pos_ > kMaxNumberBytes) return false;
      switch (num_) {
        case Num::Minus:
          if (!d) return false;
          num_ = c == '0' ? Num::Zero : Num::Int;
          return true;
        case Num::Zero:
        case Num::Int:
        case Num::Frac:
          if (d && num_ != Num::Zero) return true;
          if (c == '.' && num_ != Num::Frac) {
            num_ = Num::Dot;
            return true;
          }
          if (c == 'e' || c == 'E') {
            num_ = Num::Exp;
            return true;
          }
          if (d) return false;  // a digit after a leading 0
          return end_number_and(c);
        case Num::Dot:
          if (!d) return false;
          num_ = Num::Frac;
          return true;
        case Num::Exp:
          if (c == '+' || c == '-') {
            num_ = Num::ExpSign;
            return true;
          }
          [[fallthrough]];
        case Num::ExpSign:
          if (!d) return false;
          num_ = Num::ExpInt;
          return true;
        case Num::ExpInt:
          if (d) return true;
          return end_number_and(c);
      }
      return false;
    }
    case St::Done:
      return false;
    default:
      break;
  }
  if (is_ws(c)) return st_ != St::Start && ++spaces_ <= kMaxSpaces;
  spaces_ = 0;
  switch (st_) {
    case St::Start:
      if (c != '{') return false;
      stack_.push_back('{');
      st_ = St::ObjKeyOrEnd;
      return true;
    case St::ObjKeyOrEnd:
      if (c == '}') return after_value(c);
      [[fallthrough]];
    case St::ObjKey:
      if (c != '"') return false;
      key_ = true;
      st_ = St::Str;
      return true;
    case St::Colon:
      if (c != ':') return false;
      st_ = St::Value;
      return true;
    case St::ArrValueOrEnd:
      if (c == ']') return after_value(c);
      return value_start(c);
    case St::Value:
      return value_start(c);
    case St::AfterValue:
      return after_value(c);
    default:
      return false;
  }
}

void TokenBytes::finish() {
  plain.assign(bytes.size(), 0);
  for (size_t t = 0; t < bytes.size(); ++t) {
    // plain: fed to a fresh string (after its opening quote) it leaves the string open,
    // with no escape or UTF-8 sequence pending
    bool ok = !bytes[t].empty();
    JsonPrefix p;
    ok = ok && p.feed(std::string_view("{\"", 2));
    for (char ch : bytes[t]) {
      const auto c = static_cast<uint8_t>(ch);
      if (!ok || c == '"' || c == '\\' || c < 0x20)
        ok = false;
      else
        ok = p.feed(c);
    }
    plain[t] = ok && p.in_plain_string() ? 1 : 0;
  }
  eog.resize(bytes.size(), 0);
}

bool JsonConstraint::allowed(int32_t t) const {
  if (t < 0 || static_cast<size_t>(t) >= tok_->bytes.size()) return false;
  if (tok_->eog[static_cast<size_t>(t)]) return prefix_.complete();
  const std::string& b = tok_->bytes[static_cast<size_t>(t)];
  if (b.empty() || prefix_.complete()) return false;
  if (prefix_.in_plain_string() && tok_->plain[static_cast<size_t>(t)]) return true;
  JsonPrefix p = prefix_;
  return p.feed(b);
}

void JsonConstraint::mask(float* logits, int32_t vocab) const {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Which first bytes can come next at all (256 steps of the reader): a token whose first
  // byte cannot is banned without running the reader over it -- between values most of
  // the vocabulary (words, spaces before letters) goes this way.
  bool first_ok[256];
  for (int b = 0; b < 256; ++b) {
    JsonPrefix p = prefix_;
    first_ok[b] = !prefix_.complete() && p.feed(static_cast<uint8_t>(b));
  }
  bool any = false;
  for (int32_t t = 0; t < vocab; ++t) {
    if (logits[t] == neg_inf) continue;
    const auto i = static_cast<size_t>(t);
    bool ok;
    if (i >= tok_->bytes.size())
      ok = false;
    else if (tok_->eog[i])
      ok = prefix_.complete();
    else if (tok_->bytes[i].empty() || !first_ok[static_cast<uint8_t>(tok_->bytes[i][0])])
      ok = false;
    else
      ok = allowed(t);
    if (ok)
      any = true;
    else
      logits[t] = neg_inf;
  }
  if (!any)  // no token continues the object (a vocabulary without one): let it end
    for (int32_t t = 0; t < vocab && static_cast<size_t>(t) < tok_->eog.size(); ++t)
      if (tok_->eog[static_cast<size_t>(t)]) logits[t] = 0.0f;
}

bool JsonConstraint::accept(int32_t token) {
  if (token < 0 || static_cast<size_t>(token) >= tok_->bytes.size()) return false;
  if (tok_->eog[static_cast<size_t>(token)]) return prefix_.complete();
  JsonPrefix p = prefix_;
  if (!p.feed(tok_->bytes[static_cast<size_t>(token)])) return false;
  prefix_ = std::move(p);
  return true;
}

}  // namespace troupe
