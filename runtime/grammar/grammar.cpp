#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace troupe {

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> utf8_sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  if (lo > hi) return out;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // no surrogates
    if (lo < 0xD800) out = utf8_sequences(lo, 0xD7FF);
    if (hi > 0xDFFF)
      for (auto& s : utf8_sequences(0xE000, hi)) out.push_back(std::move(s));
    return out;
  }
  static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int n = 0; n < 3; ++n)  // split where the encoded length changes
    if (lo <= kMax[n] && hi > kMax[n]) {
      out = utf8_sequences(lo, kMax[n]);
      for (auto& s : utf8_sequences(kMax[n] + 1, hi)) out.push_back(std::move(s));
      return out;
    }
  if (hi <= 0x7F) return {{{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}}};
  const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
  // Split until every continuation byte below the first differing one spans its whole range
  // (RE2's method), so the sequence is a product of byte ranges.
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        out = utf8_sequences(lo, lo | m);
        for (auto& s : utf8_sequences((lo | m) + 1, hi)) out.push_back(std::move(s));
        return out;
      }
      if ((hi & m) != m) {
        out = utf8_sequences(lo, (hi & ~m) - 1);
        for (auto& s : utf8_sequences(hi & ~m, hi)) out.push_back(std::move(s));
        return out;
      }
    }
  }
  auto enc = [len](uint32_t c) {
    std::array<uint8_t, 4> b{};
    if (len == 2) {
      b = {static_cast<uint8_t>(0xC0 | (c >> 6)), static_cast<uint8_t>(0x80 | (c & 0x3F)), 0, 0};
    } else if (len == 3) {
      b = {static_cast<uint8_t>(0xE0 | (c >> 12)), static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F)),
           static_cast<uint8_t>(0x80 | (c & 0x3F)), 0};
    } else {
      b = {static_cast<uint8_t>(0xF0 | (c >> 18)), static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F)),
           static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F)), static_cast<uint8_t>(0x80 | (c & 0x3F))};
    }
    return b;
  };
  const auto a = enc(lo), b = enc(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < len; ++i) seq.emplace_back(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]);
  out.push_back(std::move(seq));
  return out;
}

namespace {
bool is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}
}  // namespace

// The recursive-descent GBNF parser and its lowering into Grammar's rules.
class GrammarBuilder {
 public:
  GrammarBuilder(std::string_view src, const GrammarLimits& lim) : s_(src), lim_(lim) {}

  Result<std::shared_ptr<const Grammar>> run() {
    if (s_.size() > lim_.max_source_bytes)
      return make_error("grammar is " + std::to_string(s_.size()) + " bytes, over the limit of " +
                        std::to_string(lim_.max_source_bytes));
    skip();
    if (i_ >= s_.size()) return make_error("grammar is empty");
    while (i_ < s_.size()) {
      const std::string name = ident();
      if (name.empty()) return fail("expected a rule name");
      skip();
      if (s_.compare(i_, 3, "::=") != 0) return fail("expected '::=' after '" + name + "'");
      i_ += 3;
      const uint32_t r = rule_id(name);
      if (defined_[r]) return fail("rule '" + name + "' is defined twice");
      defined_[r] = 1;
      if (!alternatives(r, false)) return std::move(err_);
      skip();
    }
    for (const auto& [name, id] : ids_)
      if (!defined_[id]) return make_error("grammar rule '" + name + "' is used but not defined");
    auto root = ids_.find("root");
    if (root == ids_.end()) return make_error("grammar has no 'root' rule");
    if (auto st = check_left_recursion(); !st) return std::move(st).error();
    auto g = std::make_shared<Grammar>();
    g->sets_ = std::move(sets_);
    g->root_ = root->second;
    g->rule_alts_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r)
      for (const auto& alt : rules_[r]) {
        g->rule_alts_[r].push_back(static_cast<uint32_t>(g->code_.size()));
        g->code_.insert(g->code_.end(), alt.begin(), alt.end());
        g->code_.push_back({Grammar::Op::End, 0});
      }
    return std::shared_ptr<const Grammar>(std::move(g));
  }

 private:
  using Elem = Grammar::Elem;
  using Seq = std::vector<Elem>;

  Error fail(const std::string& what) { return Error{"grammar: " + what + " at offset " + std::to_string(i_)}; }
  bool error(const std::string& what) {
    if (err_.message.empty()) err_ = fail(what);
    return false;
  }

  void skip() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }
  std::string ident() {
    const size_t b = i_;
    while (i_ < s_.size() && is_ident(s_[i_])) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }
  // A rule name followed by '::=' starts the next rule (so newlines need no special meaning).
  bool at_rule_start() const {
    size_t j = i_;
    while (j < s_.size() && is_ident(s_[j])) ++j;
    if (j == i_) return false;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\n' || s_[j] == '\r')) ++j;
    return s_.compare(j, 3, "::=") == 0;
  }

  uint32_t rule_id(const std::string& name) {
    auto [it, fresh] = ids_.emplace(name, static_cast<uint32_t>(rules_.size()));
    if (fresh) {
      rules_.emplace_back();
      defined_.push_back(0);
      names_.push_back(name);
    }
    return it->second;
  }
  uint32_t anon_rule(const std::string& hint) {
    rules_.emplace_back();
    defined_.push_back(1);
    names_.push_back(hint + "#" + std::to_string(rules_.size()));
    return static_cast<uint32_t>(rules_.size() - 1);
  }
  bool count(size_t n) {
    elements_ += n;
    if (elements_ > lim_.max_elements)
      return error("over " + std::to_string(lim_.max_elements) + " elements with repetitions expanded");
    return true;
  }
  uint32_t byte_set(const Grammar::ByteSet& b) {
    auto [it, fresh] = set_ids_.emplace(b, static_cast<uint32_t>(sets_.size()));
    if (fresh) sets_.push_back(b);
    return it->second;
  }
  static void set_range(Grammar::ByteSet& s, uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
  }

  // alternatives := sequence ('|' sequence)*, into rule r; nested: inside '(' ')'.
  bool alternatives(uint32_t r, bool nested) {
    for (;;) {
      Seq seq;
      if (!sequence(seq, nested)) return false;
      rules_[r].push_back(std::move(seq));
      skip();
      if (i_ < s_.size() && s_[i_] == '|') {
        ++i_;
        continue;
      }
      return true;
    }
  }

  bool sequence(Seq& out, bool nested) {
    for (;;) {
      skip();
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')') {
        if (i_ < s_.size() && s_[i_] == ')' && !nested) return error("unbalanced ')'");
        return true;
      }
      if (!nested && at_rule_start()) return true;
      Seq item;
      if (!atom(item)) return false;
      for (;;) {  // postfix repetitions, possibly several
        if (i_ >= s_.size()) break;
        const char c = s_[i_];
        if (c != '*' && c != '+' && c != '?' && c != '{') break;
        if (!repeat(item)) return false;
      }
      if (!count(item.size())) return false;
      out.insert(out.end(), item.begin(), item.end());
    }
  }

  bool atom(Seq& item) {
    const char c = s_[i_];
    if (c == '"') return literal(item);
    if (c == '[') return char_class(item);
    if (c == '.') {
      ++i_;
      return code_points({{0, 0x10FFFF}}, item);
    }
    if (c == '(') {
      ++i_;
      const uint32_t r = anon_rule("group");
      if (!alternatives(r, true)) return false;
      skip();
      if (i_ >= s_.size() || s_[i_] != ')') return error("expected ')'");
      ++i_;
      item.push_back({Grammar::Op::Ref, r});
      return true;
    }
    if (is_ident(c)) {
      item.push_back({Grammar::Op::Ref, rule_id(ident())});
      return true;
    }
    return error(std::string("unexpected character '") + c + "'");
  }

  // One character of a literal or class, escapes decoded; false at the end of input.
  bool character(uint32_t& cp) {
    if (i_ >= s_.size()) return error("unterminated literal or class");
    auto c = static_cast<uint8_t>(s_[i_]);
    if (c == '\\') {
      if (++i_ >= s_.size()) return error("unterminated escape");
      const char e = s_[i_++];
      auto hex = [&](int n) {
        if (i_ + static_cast<size_t>(n) > s_.size()) return error("short hex escape");
        cp = 0;
        for (int k = 0; k < n; ++k) {
          const char h = s_[i_++];
          const int v = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
          if (v < 0) return error("bad hex digit in escape");
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        if (cp > 0x10FFFF) return error("escape beyond U+10FFFF");
        return true;
      };
      switch (e) {
        case 'n':
          cp = '\n';
          return true;
        case 'r':
          cp = '\r';
          return true;
        case 't':
          cp = '\t';
          return true;
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          cp = static_cast<uint8_t>(e);
          return true;  // \\ \" \[ \] \- and the like
      }
    }
    // raw UTF-8
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i_ + static_cast<size_t>(len) > s_.size()) return error("invalid UTF-8 in grammar");
    cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < len; ++k) {
      const auto d = static_cast<uint8_t>(s_[i_ + static_cast<size_t>(k)]);
      if ((d & 0xC0) != 0x80) return error("invalid UTF-8 in grammar");
      cp = (cp << 6) | (d & 0x3Fu);
    }
    i_ += static_cast<size_t>(len);
    return true;
  }

  bool literal(Seq& item) {
    ++i_;  // '"'
    while (i_ < s_.size() && s_[i_] != '"') {
      uint32_t cp;
      if (!character(cp)) return false;
      Seq one;
      if (!code_points({{cp, cp}}, one)) return false;
      item.insert(item.end(), one.begin(), one.end());
    }
    if (i_ >= s_.size()) return error("unterminated literal");
    ++i_;
    return true;
  }

  bool char_class(Seq& item) {
    ++i_;  // '['
    bool negate = false;
    if (i_ < s_.size() && s_[i_] == '^') {
      negate = true;
      ++i_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (i_ < s_.size() && s_[i_] != ']') {
      uint32_t lo, hi;
      if (!character(lo)) return false;
      hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        if (!character(hi)) return false;
        if (hi < lo) return error("class range out of order");
      }
      ranges.emplace_back(lo, hi);
    }
    if (i_ >= s_.size()) return error("unterminated character class");
    ++i_;
    std::sort(ranges.begin(), ranges.end());
    if (negate) {
      std::vector<std::pair<uint32_t, uint32_t>> inv;
      uint32_t next = 0;
      for (auto [lo, hi] : ranges) {
        if (lo > next) inv.emplace_back(next, lo - 1);
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) inv.emplace_back(next, 0x10FFFF);
      ranges = std::move(inv);
    }
    if (ranges.empty()) return error("empty character class");
    return code_points(ranges, item);
  }

  // Code point ranges as elements: one byte set if they are all ASCII-sized single bytes,
  // else an anonymous rule with one alternative per UTF-8 sequence (the one-byte ones merged).
  bool code_points(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, Seq& item) {
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (auto [lo, hi] : ranges)
      for (auto& s : utf8_sequences(lo, hi)) seqs.push_back(std::move(s));
    Grammar::ByteSet single{};
    bool has_single = false;
    std::vector<Seq> multi;
    for (const auto& s : seqs) {
      if (s.size() == 1) {
        set_range(single, s[0].first, s[0].second);
        has_single = true;
        continue;
      }
      Seq m;
      for (auto [lo, hi] : s) {
        Grammar::ByteSet b{};
        set_range(b, lo, hi);
        m.push_back({Grammar::Op::Bytes, byte_set(b)});
      }
      multi.push_back(std::move(m));
    }
    if (multi.empty() && !has_single) return error("character class matches nothing");
    if (multi.empty()) {
      item.push_back({Grammar::Op::Bytes, byte_set(single)});
      return true;
    }
    if (!has_single && multi.size() == 1) {
      item.insert(item.end(), multi[0].begin(), multi[0].end());
      return true;
    }
    const uint32_t r = anon_rule("class");
    if (has_single) rules_[r].push_back({{Grammar::Op::Bytes, byte_set(single)}});
    size_t n = 0;
    for (auto& m : multi) {
      n += m.size();
      rules_[r].push_back(std::move(m));
    }
    if (!count(n)) return false;
    item.push_back({Grammar::Op::Ref, r});
    return true;
  }

  // Applies the repetition at i_ to item (which becomes one element first).
  bool repeat(Seq& item) {
    if (item.size() != 1) {
      const uint32_t r = anon_rule("seq");
      rules_[r].push_back(item);
      item = {{Grammar::Op::Ref, r}};
    }
    const Elem x = item[0];
    const char c = s_[i_++];
    int64_t lo = 0, hi = -1;  // hi -1: unbounded
    if (c == '*') {
      lo = 0;
    } else if (c == '+') {
      lo = 1;
    } else if (c == '?') {
      hi = 1;
    } else {  // {m} {m,} {m,n}
      auto number = [&](int64_t& v) {
        skip();
        const size_t b = i_;
        v = 0;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
          v = std::min<int64_t>(v * 10 + (s_[i_++] - '0'), int64_t{1} << 40);
        skip();
        return i_ > b;
      };
      if (!number(lo)) return error("expected a number after '{'");
      hi = lo;
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        if (!number(hi)) hi = -1;
      }
      if (i_ >= s_.size() || s_[i_] != '}') return error("expected '}'");
      ++i_;
      if (lo > lim_.max_repeat || hi > lim_.max_repeat)
        return error("repetition over the limit of " + std::to_string(lim_.max_repeat));
      if (hi >= 0 && hi < lo) return error("repetition {m,n} with n < m");
    }
    Seq out(static_cast<size_t>(lo), x);
    if (!count(out.size())) return false;
    if (hi < 0) {  // x*: R ::= x R | ""
      const uint32_t r = anon_rule("star");
      rules_[r].push_back({x, {Grammar::Op::Ref, r}});
      rules_[r].push_back({});
      out.push_back({Grammar::Op::Ref, r});
    } else if (hi > lo) {  // up to hi-lo more: O_1 ::= x | "", O_k ::= x O_{k-1} | ""
      uint32_t prev = anon_rule("opt");
      rules_[prev].push_back({x});
      rules_[prev].push_back({});
      for (int64_t k = 1; k < hi - lo; ++k) {
        const uint32_t r = anon_rule("opt");
        rules_[r].push_back({x, {Grammar::Op::Ref, prev}});
        rules_[r].push_back({});
        prev = r;
      }
      if (!count(static_cast<size_t>(2 * (hi - lo)))) return false;
      out.push_back({Grammar::Op::Ref, prev});
    }
    item = std::move(out);
    if (item.empty()) {  // x{0}: matches nothing at all -- an empty rule
      const uint32_t r = anon_rule("none");
      rules_[r].push_back({});
      item = {{Grammar::Op::Ref, r}};
    }
    if (item.size() > 1) {  // keep the item one element for a following repetition
      const uint32_t r = anon_rule("rep");
      rules_[r].push_back(item);
      item = {{Grammar::Op::Ref, r}};
    }
    return true;
  }

  // Which rules can match nothing, then whether a rule can reach itself with no byte read.
  Status check_left_recursion() {
    const size_t n = rules_.size();
    std::vector<uint8_t> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : rules_[r]) {
          bool all = true;
          for (const Elem& e : alt)
            if (e.op == Grammar::Op::Bytes || !nullable[e.arg]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> first(n);  // rules reachable before any byte
    for (size_t r = 0; r < n; ++r)
      for (const auto& alt : rules_[r])
        for (const Elem& e : alt) {
          if (e.op == Grammar::Op::Bytes) break;
          first[r].push_back(e.arg);
          if (!nullable[e.arg]) break;
        }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (size_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> stack{{static_cast<uint32_t>(start), 0}};
      color[start] = 1;
      while (!stack.empty()) {
        auto& [r, k] = stack.back();
        if (k < first[r].size()) {
          const uint32_t next = first[r][k++];
          if (color[next] == 1) {
            const std::string& name = names_[next];
            return make_error("grammar rule '" + name.substr(0, name.find('#')) +
                              "' is left-recursive (or repeats something that can match nothing)");
          }
          if (color[next] == 0) {
            color[next] = 1;
            stack.emplace_back(next, 0);
          }
        } else {
          color[r] = 2;
          stack.pop_back();
        }
      }
    }
    return Status::success();
  }

  std::string_view s_;
  size_t i_ = 0;
  GrammarLimits lim_;
  Error err_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::vector<Seq>> rules_;
  std::vector<uint8_t> defined_;
  std::vector<std::string> names_;
  std::vector<Grammar::ByteSet> sets_;
  std::map<Grammar::ByteSet, uint32_t> set_ids_;
  size_t elements_ = 0;
};

Result<std::shared_ptr<const Grammar>> Grammar::compile(std::string_view gbnf, const GrammarLimits& lim) {
  return GrammarBuilder(gbnf, lim).run();
}

GrammarState::GrammarState(const Grammar& g) : g_(&g) {
  std::vector<std::vector<uint32_t>> out;
  for (uint32_t alt : g.alternatives(g.root())) {
    std::vector<uint32_t> s{alt};
    expand(s, out);
  }
  normalise(out);
}

// Resolves the top of `s` until it is a byte set (or s is empty: matched), following every
// alternative of a rule reference; results go to `out`.
void GrammarState::expand(std::vector<uint32_t>& s, std::vector<std::vector<uint32_t>>& out) {
  const auto& code = g_->code();
  for (;;) {
    if (++work_ > kMaxWork) {  // an ambiguous grammar: stop exploring (and say so)
      overflowed_ = true;
      return;
    }
    if (s.empty() || code[s.back()].op == Grammar::Op::Bytes) {
      if (out.size() < kMaxStacks * 4)
        out.push_back(s);
      else
        overflowed_ = true;
      return;
    }
    const uint32_t pos = s.back();
    s.pop_back();
    const Grammar::Elem e = code[pos];
    if (e.op == Grammar::Op::End) continue;                          // the alternative is done: return to the parent
    if (code[pos + 1].op != Grammar::Op::End) s.push_back(pos + 1);  // no return position for a tail call
    if (s.size() >= kMaxStackDepth) return;
    const auto& alts = g_->alternatives(e.arg);
    for (size_t k = 0; k + 1 < alts.size(); ++k) {
      std::vector<uint32_t> t = s;
      t.push_back(alts[k]);
      expand(t, out);
    }
    s.push_back(alts.back());
  }
}

void GrammarState::normalise(std::vector<std::vector<uint32_t>>& v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // empty (matched) first
  });
  v.erase(std::unique(v.begin(), v.end()), v.end());
  if (v.size() > kMaxStacks) {
    v.resize(kMaxStacks);
    overflowed_ = true;
  }
  stacks_ = std::move(v);
}

void GrammarState::advance(uint8_t b, GrammarState& out) const {
  out.g_ = g_;
  out.work_ = 0;
  out.overflowed_ = overflowed_;
  std::vector<std::vector<uint32_t>> next;
  for (const auto& s : stacks_) {
    if (s.empty()) continue;
    if (!g_->has_byte(g_->code()[s.back()].arg, b)) continue;
    std::vector<uint32_t> t = s;
    ++t.back();
    out.expand(t, next);
  }
  out.normalise(next);
}

bool GrammarState::feed(uint8_t b) {
  GrammarState next;
  advance(b, next);
  *this = std::move(next);
  return !stacks_.empty();
}

GrammarState GrammarState::after(uint8_t b) const {
  GrammarState next;
  advance(b, next);
  return next;
}

bool GrammarState::takes(uint8_t b) const {
  for (const auto& s : stacks_)
    if (!s.empty() && g_->has_byte(g_->code()[s.back()].arg, b)) return true;
  return false;
}

std::string GrammarState::key() const {
  std::string k;
  for (const auto& s : stacks_) {
    for (uint32_t p : s) k.append(reinterpret_cast<const char*>(&p), sizeof p);
    k.append(4, '\xff');  // separator: no position is 0xffffffff
  }
  return k;
}

}  // namespace troupe
