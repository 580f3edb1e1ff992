// Lexer for the chat-template Jinja subset. Mirrors jinja2/lexer.py with the settings HF
// uses (trim_blocks=True, lstrip_blocks=True): the whitespace rules decide the output bytes,
// so they follow Jinja's regexes step by step (see the comments on each rule).
#include <cctype>

#include "runtime/chat/jinja/ast.h"

namespace troupe::jinja {
namespace {

constexpr size_t kMaxTagTokens = 4000;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_newlines(const std::string& s, size_t begin, size_t end) {
  int n = 0;
  for (size_t k = begin; k < end; ++k) n += s[k] == '\n';
  return n;
}

// Python's "unicode-escape" decoding of a string literal body (Jinja does the same).
std::string unescape(const std::string& body) {
  std::string out;
  auto hex_value = [&](size_t at, int digits, uint32_t& cp) {
    if (at + digits > body.size()) return false;
    cp = 0;
    for (int k = 0; k < digits; ++k) {
      char c = body[at + k];
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
      cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return true;
  };
  for (size_t k = 0; k < body.size(); ++k) {
    char c = body[k];
    if (c != '\\' || k + 1 == body.size()) {
      out += c;
      continue;
    }
    char e = body[++k];
    uint32_t cp = 0;
    switch (e) {
      case '\n':
        break;  // line continuation
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (hex_value(k + 1, digits, cp)) {
          utf8_append(out, cp);
          k += digits;
        } else {
          out += '\\';
          out += e;
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int n = 0;
          while (n < 3 && k < body.size() && body[k] >= '0' && body[k] <= '7') cp = cp * 8 + (body[k++] - '0'), ++n;
          --k;
          utf8_append(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      size_t open = find_opener();
      if (open == std::string::npos) {
        emit(TokenType::kText, src_.substr(pos_));
        break;
      }
      char kind = src_[open + 1];
      char sign = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+') ? src_[open + 2] : 0;
      std::string text = src_.substr(pos_, open - pos_);
      int text_line = line_;
      line_ += count_newlines(src_, pos_, open);
      if (sign == '-') {
        // {%- / {{- / {#- : strip all whitespace before the tag.
        size_t end = text.size();
        while (end > 0 && is_ws(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag preceded on its line only by whitespace
        // drops that whitespace (the line must really start there: line_starting_).
        size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
          bool all_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_ws(text[k]);
          if (all_ws) text.resize(l_pos);
        }
      }
      if (!text.empty()) tokens_.push_back({TokenType::kText, std::move(text), text_line});
      pos_ = open + 2 + (sign ? 1 : 0);
      line_starting_ = false;
      Status st = kind == '#' ? comment() : tag(kind == '%');
      if (!st.ok()) return st.error();
    }
    tokens_.push_back({TokenType::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_opener() const {
    for (size_t k = src_.find('{', pos_); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  void emit(TokenType type, std::string text) { tokens_.push_back({type, std::move(text), line_}); }

  bool starts(const char* s) const { return src_.compare(pos_, std::char_traits<char>::length(s), s) == 0; }

  // After "-%}" / "-}}" / "-#}": drop all following whitespace.
  void skip_ws() {
    while (pos_ < src_.size() && is_ws(src_[pos_])) line_ += src_[pos_++] == '\n';
  }

  // trim_blocks: one newline directly after "%}" or "#}" is dropped.
  void trim_newline() {
    if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_, ++line_;
  }

  void finish_tag() { line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n'; }

  Status comment() {
    size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) return error_at(line_, "missing end of comment tag");
    char before = close > pos_ ? src_[close - 1] : 0;
    line_ += count_newlines(src_, pos_, close);
    pos_ = close + 2;
    if (before == '-') {
      skip_ws();
    } else if (before != '+') {
      trim_newline();
    }
    finish_tag();
    return {};
  }

  Status tag(bool is_block) {
    emit(is_block ? TokenType::kBlockBegin : TokenType::kVarBegin, "");
    const size_t first_token = tokens_.size();
    std::vector<char> balance;
    bool after_dot = false;
    while (true) {
      if (pos_ >= src_.size()) return error_at(line_, "unexpected end of template, unclosed tag");
      // Bounds the depth of any expression tree (and so the recursion that walks it).
      if (tokens_.size() - first_token > kMaxTagTokens) {
        return error_at(line_, "tag too long (over " + std::to_string(kMaxTagTokens) + " tokens)");
      }
      if (balance.empty()) {
        if (is_block && (starts("-%}") || starts("+%}") || starts("%}"))) {
          char sign = src_[pos_] == '%' ? 0 : src_[pos_];
          pos_ += sign ? 3 : 2;
          emit(TokenType::kBlockEnd, "");
          if (sign == '-') skip_ws();
          if (!sign) trim_newline();
          break;
        }
        if (!is_block && (starts("-}}") || starts("}}"))) {
          bool strip = src_[pos_] == '-';
          pos_ += strip ? 3 : 2;
          emit(TokenType::kVarEnd, "");
          if (strip) skip_ws();
          break;
        }
      }
      char c = src_[pos_];
      if (is_ws(c)) {
        skip_ws();
        continue;
      }
      bool was_dot = after_dot;
      after_dot = false;
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number(was_dot);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
          ++pos_;
        emit(TokenType::kName, src_.substr(start, pos_ - start));
      } else if (c == '\'' || c == '"') {
        TROUPE_TRY(lex_string(c));
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* two : kTwo) {
          if (starts(two)) op = two;
        }
        if (op.empty()) {
          if (std::string("+-/*%~[](){}<>=.:|,;").find(c) == std::string::npos) {
            return error_at(line_, std::string("unexpected character '") + c + "'");
          }
          op = std::string(1, c);
        }
        if (c == '(' || c == '[' || c == '{') {
          balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty() || balance.back() != c) return error_at(line_, "unexpected '" + op + "'");
          balance.pop_back();
        }
        after_dot = op == ".";
        pos_ += op.size();
        emit(TokenType::kOperator, op);
      }
    }
    finish_tag();
    return {};
  }

  // Digits with optional '_' separators; a float needs a fraction or an exponent.
  // Right after '.', only an integer is read (Jinja: `foo.0`).
  void lex_number(bool after_dot) {
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
                                    (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                     std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))))) {
        ++pos_;
      }
    };
    size_t start = pos_;
    digits();
    bool is_float = false;
    auto digit_at = [&](size_t k) { return k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k])); };
    if (!after_dot && pos_ < src_.size() && src_[pos_] == '.' && digit_at(pos_ + 1)) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (digit_at(k)) {
        pos_ = k;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = start; k < pos_; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    emit(is_float ? TokenType::kFloat : TokenType::kInt, text);
  }

  Status lex_string(char quote) {
    size_t k = pos_ + 1;
    while (k < src_.size() && src_[k] != quote) k += src_[k] == '\\' ? 2 : 1;
    if (k >= src_.size()) return error_at(line_, "unterminated string literal");
    int start_line = line_;
    line_ += count_newlines(src_, pos_, k);
    tokens_.push_back({TokenType::kString, unescape(src_.substr(pos_ + 1, k - pos_ - 1)), start_line});
    pos_ = k + 1;
    return {};
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex(const std::string& source) {
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace troupe::jinja
