// regex_to_gbnf and choice_to_gbnf of runtime/grammar/json_schema.h: a recursive-descent
// reader of the regex subset that writes GBNF as it goes. Character classes are resolved to
// code point ranges here (so \d, \w, negation and, inside a JSON string, the characters the
// string must escape are all handled in one place) and written as GBNF classes of escapes.
#include <algorithm>
#include <cstdio>

#include "common/utf8.h"
#include "runtime/grammar/json_schema.h"

namespace troupe {

std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (char ch : bytes) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalised(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges inverted(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalised(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return out;
}

Ranges minus(const Ranges& a, const Ranges& b) {
  Ranges inv = inverted(b), out;
  for (auto [alo, ahi] : normalised(a))
    for (auto [blo, bhi] : inv) {
      const uint32_t lo = std::max(alo, blo), hi = std::min(ahi, bhi);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  return out;
}

std::string escaped_cp(uint32_t c) {
  char buf[16];
  if (c < 0x80 && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
    return std::string(1, static_cast<char>(c));
  if (c <= 0xFF)
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
  else if (c <= 0xFFFF)
    std::snprintf(buf, sizeof buf, "\\u%04X", c);
  else
    std::snprintf(buf, sizeof buf, "\\U%08X", c);
  return buf;
}

std::string class_text(const Ranges& r) {
  std::string out = "[";
  for (auto [lo, hi] : normalised(r)) {
    out += escaped_cp(lo);
    if (hi != lo) out += "-" + escaped_cp(hi);
  }
  return out + "]";
}

std::string utf8(uint32_t c) {
  std::string s;
  append_utf8(s, c);
  return s;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
// What a JSON string holds raw (the rest must be escaped): not '"', '\' or a control.
const Ranges kJsonRaw = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};

class RegexWriter {
 public:
  RegexWriter(std::string_view re, bool json_string, int32_t max_repeat)
      : r_(re), json_(json_string), max_repeat_(max_repeat) {}

  Result<std::string> run(size_t begin, size_t end) {
    i_ = begin;
    end_ = end;
    std::string out = alternation();
    if (!err_.empty()) return make_error("regex: " + err_);
    if (i_ != end_) return make_error("regex: unbalanced ')' at offset " + std::to_string(i_));
    return out;
  }

 private:
  bool fail(const std::string& what) {
    if (err_.empty()) err_ = what + " at offset " + std::to_string(i_);
    return false;
  }
  bool more() const { return i_ < end_ && err_.empty(); }

  std::string alternation() {
    std::vector<std::string> alts{concat()};
    while (more() && r_[i_] == '|') {
      ++i_;
      alts.push_back(concat());
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
    return out + ")";
  }

  std::string concat() {
    std::string out;
    while (more() && r_[i_] != '|' && r_[i_] != ')') {
      std::string atom_text = atom();
      if (!err_.empty()) return "";
      while (more() && (r_[i_] == '*' || r_[i_] == '+' || r_[i_] == '?' || r_[i_] == '{')) {
        std::string q = quantifier();
        if (!err_.empty()) return "";
        if (q.empty()) break;  // a '{' that is a literal
        atom_text = "(" + atom_text + ")" + q;
      }
      out += (out.empty() ? "" : " ") + atom_text;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string quantifier() {
    const char c = r_[i_];
    std::string q;
    if (c == '{') {
      size_t j = i_ + 1;
      auto num = [&](long& v) {
        const size_t b = j;
        v = 0;
        while (j < end_ && r_[j] >= '0' && r_[j] <= '9') v = std::min<long>(v * 10 + (r_[j++] - '0'), 1L << 40);
        return j > b;
      };
      long lo, hi = -2;
      if (!num(lo)) return "";  // not a quantifier: '{' is a literal
      if (j < end_ && r_[j] == ',') {
        ++j;
        if (!num(hi)) hi = -1;
      }
      if (j >= end_ || r_[j] != '}') return "";
      if (lo > max_repeat_ || hi > max_repeat_) {
        fail("repetition over the limit of " + std::to_string(max_repeat_));
        return "";
      }
      if (hi >= 0 && hi < lo) {
        fail("repetition {m,n} with n < m");
        return "";
      }
      i_ = j + 1;
      q = "{" + std::to_string(lo) + (hi == -2 ? "" : hi == -1 ? "," : "," + std::to_string(hi)) + "}";
    } else {
      ++i_;
      q = std::string(1, c);
    }
    if (more() && r_[i_] == '?') ++i_;  // lazy: the same strings
    if (more() && r_[i_] == '+') fail("possessive quantifiers are not supported");
    return q;
  }

  // One code point of the regex source (raw UTF-8).
  uint32_t code_point() {
    const auto c = static_cast<uint8_t>(r_[i_]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i_ + static_cast<size_t>(len) > end_) {
      fail("invalid UTF-8");
      return 0;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(r_[i_ + static_cast<size_t>(k)]) & 0x3Fu);
    i_ += static_cast<size_t>(len);
    return cp;
  }

  // After a '\': a class (set) or one code point; false on an unsupported escape.
  bool escape(Ranges& set, bool& is_set, uint32_t& cp) {
    if (i_ >= end_) return fail("trailing '\\'");
    const char e = r_[i_++];
    is_set = true;
    switch (e) {
      case 'd':
        set = kDigit;
        return true;
      case 'D':
        set = inverted(kDigit);
        return true;
      case 'w':
        set = kWord;
        return true;
      case 'W':
        set = inverted(kWord);
        return true;
      case 's':
        set = kSpace;
        return true;
      case 'S':
        set = inverted(kSpace);
        return true;
      default:
        break;
    }
    is_set = false;
    auto hex = [&](int n) {
      if (i_ + static_cast<size_t>(n) > end_) return fail("short hex escape");
      cp = 0;
      for (int k = 0; k < n; ++k) {
        const char h = r_[i_++];
        const int v = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (v < 0) return fail("bad hex digit");
        cp = cp * 16 + static_cast<uint32_t>(v);
      }
      return true;
    };
    switch (e) {
      case 't':
        cp = '\t';
        return true;
      case 'n':
        cp = '\n';
        return true;
      case 'r':
        cp = '\r';
        return true;
      case 'f':
        cp = '\f';
        return true;
      case 'v':
        cp = '\v';
        return true;
      case '0':
        cp = 0;
        return true;
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      default:
        break;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9'))
      return fail(std::string("unsupported escape '\\") + e + "' (backreferences, \\b and the like)");
    cp = static_cast<uint8_t>(e);  // escaped punctuation
    return true;
  }

  // A set of code points as GBNF; inside a JSON string, the ones it must escape are left out.
  std::string set_text(Ranges set) {
    if (json_) set = minus(set, inverted(kJsonRaw));
    if (normalised(set).empty()) {
      fail("a character class that matches nothing" + std::string(json_ ? " inside a JSON string" : ""));
      return "";
    }
    return class_text(set);
  }

  // One literal code point as GBNF: inside a JSON string, written as the string writes it.
  std::string char_text(uint32_t cp) {
    if (!json_) return gbnf_literal(utf8(cp));
    switch (cp) {
      case '"':
        return gbnf_literal("\\\"");
      case '\\':
        return gbnf_literal("\\\\");
      case '\n':
        return gbnf_literal("\\n");
      case '\r':
        return gbnf_literal("\\r");
      case '\t':
        return gbnf_literal("\\t");
      default:
        break;
    }
    if (cp < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04X", cp);
      return gbnf_literal(buf);
    }
    return gbnf_literal(utf8(cp));
  }

  std::string atom() {
    const char c = r_[i_];
    if (c == '(') {
      ++i_;
      if (i_ < end_ && r_[i_] == '?') {
        if (i_ + 1 < end_ && r_[i_ + 1] == ':') {
          i_ += 2;
        } else {
          fail("lookaround, named groups and flags are not supported");
          return "";
        }
      }
      std::string inner = alternation();
      if (!err_.empty()) return "";
      if (i_ >= end_ || r_[i_] != ')') {
        fail("expected ')'");
        return "";
      }
      ++i_;
      return "(" + inner + ")";
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      return set_text({{0, '\n' - 1}, {'\n' + 1, 0x10FFFF}});
    }
    if (c == '^' || c == '$') {
      fail("anchors are supported only at the start (^) and the end ($)");
      return "";
    }
    if (c == '*' || c == '+' || c == '?') {
      fail(std::string("nothing to repeat before '") + c + "'");
      return "";
    }
    if (c == '\\') {
      ++i_;
      Ranges set;
      bool is_set;
      uint32_t cp = 0;
      if (!escape(set, is_set, cp)) return "";
      return is_set ? set_text(set) : char_text(cp);
    }
    const uint32_t cp = code_point();
    if (!err_.empty()) return "";
    return char_text(cp);
  }

  std::string char_class() {
    ++i_;  // '['
    bool negate = false;
    if (i_ < end_ && r_[i_] == '^') {
      negate = true;
      ++i_;
    }
    Ranges set;
    bool first = true;
    while (i_ < end_ && (r_[i_] != ']' || first)) {
      first = false;
      uint32_t lo;
      if (r_[i_] == '\\') {
        ++i_;
        Ranges sub;
        bool is_set;
        if (!escape(sub, is_set, lo)) return "";
        if (is_set) {
          set.insert(set.end(), sub.begin(), sub.end());
          continue;
        }
      } else {
        lo = code_point();
        if (!err_.empty()) return "";
      }
      uint32_t hi = lo;
      if (i_ + 1 < end_ && r_[i_] == '-' && r_[i_ + 1] != ']') {
        ++i_;
        if (r_[i_] == '\\') {
          ++i_;
          Ranges sub;
          bool is_set;
          if (!escape(sub, is_set, hi)) return "";
          if (is_set) {
            fail("a class range ends in a class escape");
            return "";
          }
        } else {
          hi = code_point();
          if (!err_.empty()) return "";
        }
        if (hi < lo) {
          fail("class range out of order");
          return "";
        }
      }
      set.emplace_back(lo, hi);
    }
    if (i_ >= end_) {
      fail("unterminated character class");
      return "";
    }
    ++i_;
    return set_text(negate ? inverted(set) : set);
  }

  std::string_view r_;
  bool json_;
  int32_t max_repeat_;
  size_t i_ = 0, end_ = 0;
  std::string err_;
};

}  // namespace

Result<std::string> regex_to_gbnf_body(std::string_view regex, bool json_string, bool unanchored, int32_t max_repeat) {
  size_t b = 0, e = regex.size();
  bool start_anchor = false, end_anchor = false;
  if (b < e && regex[b] == '^') {
    start_anchor = true;
    ++b;
  }
  if (e > b && regex[e - 1] == '$') {
    size_t slashes = 0;  // an escaped '$' is a literal
    for (size_t k = e - 1; k > b && regex[k - 1] == '\\'; --k) ++slashes;
    if (slashes % 2 == 0) {
      end_anchor = true;
      --e;
    }
  }
  RegexWriter w(regex, json_string, max_repeat);
  auto body = w.run(b, e);
  if (!body) return body;
  std::string out = "(" + *body + ")";
  if (unanchored) {
    const std::string any = json_string ? class_text(kJsonRaw) + "*" : "[\\x00-\\U0010FFFF]*";
    if (!start_anchor) out = any + " " + out;
    if (!end_anchor) out += " " + any;
  }
  return out;
}

Result<std::string> regex_to_gbnf(std::string_view regex, int32_t max_repeat) {
  auto body = regex_to_gbnf_body(regex, false, false, max_repeat);
  if (!body) return body;
  return "root ::= " + *body + "\n";
}

Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error("choices: the list is empty");
  std::string out = "root ::= ";
  for (size_t k = 0; k < choices.size(); ++k) {
    if (choices[k].empty()) return make_error("choices: choice " + std::to_string(k) + " is empty");
    out += (k ? " | " : "") + gbnf_literal(choices[k]);
  }
  return out + "\n";
}

}  // namespace troupe
