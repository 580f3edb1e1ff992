#define PCRE2_CODE_UNIT_WIDTH 8
#include "runtime/pipeline/tools.h"

#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

namespace troupe {
namespace {

class Calc {
 public:
  explicit Calc(const std::string& s) : s_(s) {}
  Result<double> run() {
    auto v = sum(0);
    if (!v) return v;
    skip();
    if (i_ != s_.size()) return make_error("unexpected '" + s_.substr(i_, 1) + "' at " + std::to_string(i_));
    if (!std::isfinite(*v)) return make_error("the result is not a finite number");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;
  void skip() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  Result<double> sum(int depth) {
    auto a = product(depth);
    if (!a) return a;
    double v = *a;
    for (;;) {
      if (eat('+')) {
        auto b = product(depth);
        if (!b) return b;
        v += *b;
      } else if (eat('-')) {
        auto b = product(depth);
        if (!b) return b;
        v -= *b;
      } else {
        return v;
      }
    }
  }
  Result<double> product(int depth) {
    auto a = power(depth);
    if (!a) return a;
    double v = *a;
    for (;;) {
      const char op = (skip(), i_ < s_.size() ? s_[i_] : 0);
      if (op != '*' && op != '/' && op != '%') return v;
      ++i_;
      auto b = power(depth);
      if (!b) return b;
      if ((op == '/' || op == '%') && *b == 0) return make_error("division by zero");
      v = op == '*' ? v * *b : op == '/' ? v / *b : std::fmod(v, *b);
    }
  }
  Result<double> power(int depth) {
    auto a = unary(depth);
    if (!a) return a;
    if (!eat('^')) return a;
    auto b = power(depth + 1);  // right-associative
    if (!b) return b;
    return std::pow(*a, *b);
  }
  Result<double> unary(int depth) {
    if (depth > kMaxDepth) return make_error("nested too deeply");
    if (eat('-')) {
      auto v = unary(depth + 1);
      if (!v) return v;
      return -*v;
    }
    if (eat('+')) return unary(depth + 1);
    if (eat('(')) {
      auto v = sum(depth + 1);
      if (!v) return v;
      if (!eat(')')) return make_error("a '(' is not closed");
      return v;
    }
    skip();
    const size_t b = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.')) ++i_;
    if (b == i_) return make_error(i_ < s_.size() ? "unexpected '" + s_.substr(i_, 1) + "'" : "an operand is missing");
    const std::string num = s_.substr(b, i_ - b);
    if (num.find('.') != num.rfind('.') || num == ".") return make_error("'" + num + "' is not a number");
    return std::strtod(num.c_str(), nullptr);
  }
  const std::string& s_;
  size_t i_ = 0;
};

// The first arithmetic expression in free text: the longest run of calculator characters
// that holds a digit and parses.
Result<double> first_expression(const std::string& text) {
  auto is_calc = [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == ' ' || c == '+' || c == '-' || c == '*' ||
           c == '/' || c == '%' || c == '^' || c == '(' || c == ')';
  };
  Result<double> err = make_error("no arithmetic expression in the input");
  Result<double> best = err;
  int best_ops = -1;  // (the expression with the most operators wins: "has 12 cows, 12 + 7 =" is 19)
  for (size_t i = 0; i < text.size();) {
    if (!is_calc(text[i])) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < text.size() && is_calc(text[e])) ++e;
    std::string run = text.substr(i, e - i);
    while (!run.empty() && (run.back() == ' ' || run.back() == '.')) run.pop_back();
    if (run.find_first_of("0123456789") != std::string::npos) {
      auto v = calculate(run);
      const auto ops = static_cast<int>(std::count_if(run.begin(), run.end(), [](char c) {
        return c == '+' || c == '-' || c == '*' || c == '/' || c == '%' || c == '^';
      }));
      if (v && ops > best_ops) {
        best = v;
        best_ops = ops;
      } else if (!v && best_ops < 0) {
        err = make_error("'" + run.substr(0, 60) + "': " + v.error().message);
      }
    }
    i = e;
  }
  return best_ops >= 0 ? best : err;
}

Result<std::string> regex_extract(const std::string& input, const std::string& pattern) {
  int code = 0;
  PCRE2_SIZE off = 0;
  std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> re(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &code, &off, nullptr),
      pcre2_code_free);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return make_error("bad pattern at " + std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
  }
  std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> mc(pcre2_match_context_create(nullptr),
                                                                          pcre2_match_context_free);
  pcre2_set_match_limit(mc.get(), 1000000);  // (a catastrophic pattern fails, it does not hang)
  pcre2_set_depth_limit(mc.get(), 10000);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(re.get(), nullptr), pcre2_match_data_free);
  const int rc =
      pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(input.data()), input.size(), 0, 0, md.get(), mc.get());
  if (rc == PCRE2_ERROR_NOMATCH) return make_error("the pattern does not match");
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
    return make_error("the pattern took too long to match (PCRE2's match limit)");
  if (rc < 0) return make_error("the pattern failed to match (PCRE2 error " + std::to_string(rc) + ")");
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  const int g = rc > 1 ? 1 : 0;
  if (ov[2 * g] == PCRE2_UNSET) return std::string();
  return input.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]);
}

// The end of the JSON object opening at `b` (braces counted outside strings), or npos.
size_t object_end(const std::string& s, size_t b) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = b; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{') {
      if (++depth > 64) return std::string::npos;
    } else if (c == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string::npos;
}

Result<std::string> json_extract(const std::string& input, const std::string& key) {
  int tries = 0;
  for (size_t b = input.find('{'); b != std::string::npos && tries < 64; b = input.find('{', b + 1), ++tries) {
    const size_t e = object_end(input, b);
    if (e == std::string::npos) continue;
    auto j = nlohmann::json::parse(input.begin() + static_cast<std::ptrdiff_t>(b),
                                   input.begin() + static_cast<std::ptrdiff_t>(e) + 1, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (!j.contains(key)) return make_error("the JSON object has no key '" + key + "'");
    const auto& v = j[key];
    return v.is_string() ? v.get<std::string>() : v.dump();
  }
  return make_error("no JSON object in the input");
}

}  // namespace

Result<double> calculate(const std::string& expr) {
  if (expr.size() > 256) return make_error("the expression is over 256 bytes");
  return Calc(expr).run();
}

std::string format_number(double v) {
  char buf[64];
  if (std::fabs(v) < 1e15 && v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.12g", v);
  std::string s = buf;
  return s == "-0" ? "0" : s;
}

Result<std::string> run_tool(const std::string& name, const std::string& input, const std::string& pattern) {
  Result<std::string> out = make_error("unknown tool '" + name + "'");
  if (name == "calculator") {
    auto v = first_expression(input.substr(0, 4096));
    if (!v) return v.error();
    out = format_number(*v);
  } else if (name == "regex_extract") {
    out = regex_extract(input, pattern);
  } else if (name == "json_extract") {
    out = json_extract(input, pattern);
  }
  if (out && out->size() > kToolMaxOutput) out->resize(kToolMaxOutput);
  return out;
}

}  // namespace troupe
