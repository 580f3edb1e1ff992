// Python string semantics over UTF-8 for the chat-template engine: code-point decoding,
// str.isspace, simple case mapping, and the str methods templates call (strip, split,
// replace, title, capitalize) plus Jinja's own title filter.
#include "runtime/chat/jinja/value.h"

#include <algorithm>

namespace troupe::jinja {

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || k + len > s.size()) {
      out.push_back(c);  // invalid byte: keep it as a lone code point
      ++k;
      continue;
    }
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int m = 1; m < len; ++m) cp = (cp << 6) | (static_cast<unsigned char>(s[k + m]) & 0x3F);
    out.push_back(cp);
    k += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end && k < cps.size(); ++k) utf8_append(out, cps[k]);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_py_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

char32_t to_upper_cp(char32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) || (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) ||
      (cp >= 0x430 && cp <= 0x44F)) {
    return cp - 32;
  }
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    bool odd_lower = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_lower ? (cp % 2 == 0) : (cp % 2 == 1)) return cp - 1;
  }
  return cp;
}

char32_t to_lower_cp(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) || (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) ||
      (cp >= 0x410 && cp <= 0x42F)) {
    return cp + 32;
  }
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
    bool odd_lower = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
    if (odd_lower ? (cp % 2 == 1) : (cp % 2 == 0)) return cp + 1;
  }
  return cp;
}

bool is_alpha_cp(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return to_upper_cp(cp) != cp || to_lower_cp(cp) != cp;
}

std::string map_case(const std::string& s, char32_t (*fn)(char32_t)) {
  std::string out;
  for (char32_t cp : utf8_decode(s)) utf8_append(out, fn(cp));
  return out;
}

// str.strip/lstrip/rstrip: whitespace by default, else any code point in `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = utf8_decode(s);
  std::vector<char32_t> set;
  bool by_set = chars && chars->is_string();
  if (by_set) set = utf8_decode(chars->s);
  auto drop = [&](char32_t cp) {
    return by_set ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && drop(cps[b])) ++b;
  }
  if (right) {
    while (e > b && drop(cps[e - 1])) --e;
  }
  return utf8_encode(cps, b, e);
}

// Python str.title(): a cased letter is upper after an uncased character, else lower.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t cp : utf8_decode(s)) {
    bool cased = is_alpha_cp(cp);
    utf8_append(out, cased ? (prev_cased ? to_lower_cp(cp) : to_upper_cp(cp)) : cp);
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  auto cps = utf8_decode(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) utf8_append(out, k == 0 ? to_upper_cp(cps[k]) : to_lower_cp(cps[k]));
  return out;
}

// Jinja's title filter: words start after runs of [-\s({[<].
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char32_t cp : utf8_decode(s)) {
    bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_py_space(cp);
    utf8_append(out, sep ? cp : (word_start ? to_upper_cp(cp) : to_lower_cp(cp)));
    word_start = sep;
  }
  return out;
}

Result<Value> py_split(const std::string& s, const Value* sep, const Value* maxsplit_v) {
  int64_t maxsplit = maxsplit_v && maxsplit_v->kind == Kind::kInt ? maxsplit_v->i : -1;
  ValueList parts;
  if (!sep || sep->is_none()) {
    auto cps = utf8_decode(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && is_py_space(cps[k])) ++k;
      if (k == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && is_py_space(cps[e - 1])) --e;
        parts.push_back(Value::string(utf8_encode(cps, k, e)));
        break;
      }
      size_t start = k;
      while (k < cps.size() && !is_py_space(cps[k])) ++k;
      parts.push_back(Value::string(utf8_encode(cps, start, k)));
    }
    return Value::make_list(std::move(parts));
  }
  if (!sep->is_string()) return make_error("split() separator must be a string");
  if (sep->s.empty()) return make_error("empty separator");
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep->s, start);
    if (at == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) break;
    parts.push_back(Value::string(s.substr(start, at - start)));
    start = at + sep->s.size();
  }
  parts.push_back(Value::string(s.substr(start)));
  return Value::make_list(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    auto cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) out += to, ++done;
      if (k < cps.size()) utf8_append(out, cps[k]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + to;
    start = at + from.size();
    ++done;
  }
  return out + s.substr(start);
}

}  // namespace troupe::jinja
