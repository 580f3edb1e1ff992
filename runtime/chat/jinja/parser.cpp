// Recursive-descent parser for the chat-template Jinja subset. Precedence follows
// jinja2/parser.py: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary,
// and filters / tests / calls bind tightest (`a + b | trim` trims only b).
// Anything outside the subset is a parse error naming the construct and its line.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "runtime/chat/jinja/ast.h"

namespace troupe::jinja {
namespace {

constexpr int kMaxNesting = 200;  // keeps hostile templates from exhausting the stack

#define JINJA_TRY_EXPR(var, expr)                      \
  auto var##_result = (expr);                          \
  if (!var##_result.ok()) return var##_result.error(); \
  ExprPtr var = std::move(var##_result.value())

ExprPtr make_expr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

Stmt make_stmt(StmtKind kind, int line) {
  Stmt s;
  s.kind = kind;
  s.line = line;
  return s;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  Result<Body> parse_all() {
    std::string end_tag;
    auto body = parse_body({}, &end_tag);
    if (!body.ok()) return body.error();
    if (cur().type != TokenType::kEof) return error_at(cur().line, "unexpected tag '" + end_tag + "'");
    return std::move(body.value());
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  bool at_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool at_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  Status expect_op(const char* op) {
    if (!at_op(op)) return error_at(cur().line, std::string("expected '") + op + "', got '" + describe(cur()) + "'");
    next();
    return {};
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kBlockEnd:
        return "%}";
      case TokenType::kVarEnd:
        return "}}";
      case TokenType::kEof:
        return "end of template";
      default:
        return t.text;
    }
  }
  Status expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) return error_at(cur().line, "expected '%}', got '" + describe(cur()) + "'");
    next();
    return {};
  }

  // Parses statements until a block tag named in `ends` (left unconsumed, its name in
  // *end_tag, the cursor on the tag name) or the end of input.
  Result<Body> parse_body(const std::set<std::string>& ends, std::string* end_tag) {
    if (++depth_ > kMaxNesting) return error_at(cur().line, "blocks nested too deeply");
    Body body;
    while (cur().type != TokenType::kEof) {
      const Token& t = cur();
      if (t.type == TokenType::kText) {
        Stmt s = make_stmt(StmtKind::kText, t.line);
        s.text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVarBegin) {
        next();
        Stmt s = make_stmt(StmtKind::kOutput, t.line);
        auto e = parse_tuple();
        if (!e.ok()) return e.error();
        s.expr = std::move(e.value());
        if (cur().type != TokenType::kVarEnd)
          return error_at(cur().line, "expected '}}', got '" + describe(cur()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        if (cur().type != TokenType::kName) return error_at(cur().line, "expected a tag name");
        if (ends.count(cur().text)) {
          *end_tag = cur().text;
          --depth_;
          return body;
        }
        auto s = parse_statement();
        if (!s.ok()) return s.error();
        body.push_back(std::move(s.value()));
      } else {
        return error_at(t.line, "unexpected '" + describe(t) + "'");
      }
    }
    if (!ends.empty()) {
      std::string names;
      for (const auto& n : ends) names += (names.empty() ? "'" : " or '") + n + "'";
      return error_at(cur().line, "unexpected end of template, expected " + names);
    }
    --depth_;
    return body;
  }

  Result<Stmt> parse_statement() {
    const std::string tag = cur().text;
    const int line = cur().line;
    next();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "break" || tag == "continue") {
      TROUPE_TRY(expect_block_end());
      return make_stmt(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    if (tag == "generation") {  // transformers' AssistantTracker: renders its body
      TROUPE_TRY(expect_block_end());
      Stmt s = make_stmt(StmtKind::kBlock, line);
      std::string end;
      auto body = parse_body({"endgeneration"}, &end);
      if (!body.ok()) return body.error();
      s.bodies.push_back(std::move(body.value()));
      next();
      TROUPE_TRY(expect_block_end());
      return s;
    }
    if (tag == "endif" || tag == "endfor" || tag == "else" || tag == "elif" || tag == "endset") {
      return error_at(line, "unexpected tag '" + tag + "'");
    }
    return error_at(line, "unsupported tag '" + tag + "'");
  }

  Result<Stmt> parse_if(int line) {
    Stmt s = make_stmt(StmtKind::kIf, line);
    while (true) {
      JINJA_TRY_EXPR(cond, parse_expression(false));
      TROUPE_TRY(expect_block_end());
      std::string end;
      auto body = parse_body({"elif", "else", "endif"}, &end);
      if (!body.ok()) return body.error();
      s.conds.push_back(std::move(cond));
      s.bodies.push_back(std::move(body.value()));
      next();
      if (end == "elif") continue;
      if (end == "else") {
        TROUPE_TRY(expect_block_end());
        auto else_body = parse_body({"endif"}, &end);
        if (!else_body.ok()) return else_body.error();
        s.bodies.push_back(std::move(else_body.value()));
        next();
      }
      TROUPE_TRY(expect_block_end());
      return s;
    }
  }

  // Assignment targets: `a`, `a, b`, `(a, b)`; with_attr also allows `ns.attr`.
  Status parse_targets(Stmt& s, bool with_attr) {
    bool paren = at_op("(");
    if (paren) next();
    while (true) {
      if (cur().type != TokenType::kName)
        return error_at(cur().line, "expected a variable name, got '" + describe(cur()) + "'");
      s.targets.push_back(cur().text);
      next();
      if (with_attr && s.targets.size() == 1 && at_op(".")) {
        next();
        if (cur().type != TokenType::kName) return error_at(cur().line, "expected an attribute name");
        s.attr = cur().text;
        next();
        return {};
      }
      if (!at_op(",")) break;
      next();
    }
    if (paren) TROUPE_TRY(expect_op(")"));
    return {};
  }

  Result<Stmt> parse_for(int line) {
    Stmt s = make_stmt(StmtKind::kFor, line);
    TROUPE_TRY(parse_targets(s, false));
    if (!at_name("in")) return error_at(cur().line, "expected 'in' in for loop");
    next();
    JINJA_TRY_EXPR(iter, parse_tuple(false));
    s.expr = std::move(iter);
    if (at_name("if")) {
      next();
      JINJA_TRY_EXPR(filter, parse_expression(true));
      s.filter = std::move(filter);
    }
    if (at_name("recursive")) return error_at(cur().line, "unsupported for-loop modifier 'recursive'");
    TROUPE_TRY(expect_block_end());
    std::string end;
    auto body = parse_body({"else", "endfor"}, &end);
    if (!body.ok()) return body.error();
    s.bodies.push_back(std::move(body.value()));
    next();
    if (end == "else") {
      TROUPE_TRY(expect_block_end());
      auto else_body = parse_body({"endfor"}, &end);
      if (!else_body.ok()) return else_body.error();
      s.bodies.push_back(std::move(else_body.value()));
      next();
    }
    TROUPE_TRY(expect_block_end());
    return s;
  }

  Result<Stmt> parse_set(int line) {
    Stmt s = make_stmt(StmtKind::kSet, line);
    TROUPE_TRY(parse_targets(s, true));
    if (at_op("=")) {
      next();
      JINJA_TRY_EXPR(value, parse_tuple());
      s.expr = std::move(value);
      TROUPE_TRY(expect_block_end());
      return s;
    }
    if (s.targets.size() != 1 || !s.attr.empty()) return error_at(line, "block set needs a single name");
    if (at_op("|")) return error_at(line, "unsupported construct 'filtered block set'");
    TROUPE_TRY(expect_block_end());
    s.kind = StmtKind::kSetBlock;
    std::string end;
    auto body = parse_body({"endset"}, &end);
    if (!body.ok()) return body.error();
    s.bodies.push_back(std::move(body.value()));
    next();
    TROUPE_TRY(expect_block_end());
    return s;
  }

  // expression [, expression]* -> a tuple when a comma appears (as in `{{ a, b }}`).
  Result<ExprPtr> parse_tuple(bool with_condexpr = true) {
    int line = cur().line;
    JINJA_TRY_EXPR(first, parse_expression(with_condexpr));
    if (!at_op(",")) return first;
    auto tuple = make_expr(ExprKind::kList, line);
    tuple->is_tuple = true;
    tuple->args.push_back(std::move(first));
    while (at_op(",")) {
      next();
      if (cur().type == TokenType::kBlockEnd || cur().type == TokenType::kVarEnd) break;
      JINJA_TRY_EXPR(item, parse_expression(with_condexpr));
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  Result<ExprPtr> parse_expression(bool with_condexpr = true) {
    if (++depth_ > kMaxNesting) return error_at(cur().line, "expression nested too deeply");
    JINJA_TRY_EXPR(expr, parse_or());
    while (with_condexpr && at_name("if")) {
      int line = cur().line;
      next();
      JINJA_TRY_EXPR(cond, parse_or());
      auto node = make_expr(ExprKind::kCondExpr, line);
      node->args.push_back(std::move(expr));
      node->args.push_back(std::move(cond));
      if (at_name("else")) {
        next();
        JINJA_TRY_EXPR(other, parse_expression(true));
        node->args.push_back(std::move(other));
      } else {
        node->args.push_back(nullptr);
      }
      expr = std::move(node);
    }
    --depth_;
    return expr;
  }

  static ExprPtr binary(ExprKind kind, std::string op, ExprPtr lhs, ExprPtr rhs, int line) {
    auto node = make_expr(kind, line);
    node->name = std::move(op);
    node->args.push_back(std::move(lhs));
    node->args.push_back(std::move(rhs));
    return node;
  }

  Result<ExprPtr> parse_or() {
    JINJA_TRY_EXPR(lhs, parse_and());
    while (at_name("or")) {
      int line = cur().line;
      next();
      JINJA_TRY_EXPR(rhs, parse_and());
      lhs = std::move(binary(ExprKind::kOr, "or", std::move(lhs), std::move(rhs), line));
    }
    return lhs;
  }

  Result<ExprPtr> parse_and() {
    JINJA_TRY_EXPR(lhs, parse_not());
    while (at_name("and")) {
      int line = cur().line;
      next();
      JINJA_TRY_EXPR(rhs, parse_not());
      lhs = std::move(binary(ExprKind::kAnd, "and", std::move(lhs), std::move(rhs), line));
    }
    return lhs;
  }

  Result<ExprPtr> parse_not() {
    if (at_name("not")) {
      int line = cur().line;
      next();
      if (++depth_ > kMaxNesting) return error_at(line, "expression nested too deeply");
      JINJA_TRY_EXPR(operand, parse_not());
      --depth_;
      auto node = make_expr(ExprKind::kUnary, line);
      node->name = "not";
      node->args.push_back(std::move(operand));
      return node;
    }
    return parse_compare();
  }

  // Chained comparisons (a < b < c) become (a < b) and (b < c); operands have no side
  // effects, so evaluating b twice is harmless.
  Result<ExprPtr> parse_compare() {
    int line = cur().line;
    JINJA_TRY_EXPR(lhs, parse_math1());
    ExprPtr result;
    Expr* prev_rhs = nullptr;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                                 cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (at_name("in")) {
        op = "in";
        next();
      } else if (at_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      JINJA_TRY_EXPR(rhs, parse_math1());
      Expr* rhs_raw = rhs.get();
      ExprPtr left = prev_rhs ? clone_ref(prev_rhs) : std::move(lhs);
      auto cmp = std::move(binary(ExprKind::kBinary, op, std::move(left), std::move(rhs), line));
      result = result ? binary(ExprKind::kAnd, "and", std::move(result), std::move(cmp), line) : std::move(cmp);
      prev_rhs = rhs_raw;
    }
    return result ? std::move(result) : std::move(lhs);
  }

  // Deep copy of an expression (only used for chained comparisons).
  static ExprPtr clone_ref(const Expr* e) {
    if (!e) return nullptr;
    auto c = make_expr(e->kind, e->line);
    c->name = e->name;
    c->value = e->value;
    c->negated = e->negated;
    c->is_tuple = e->is_tuple;
    for (const auto& a : e->args) c->args.push_back(clone_ref(a.get()));
    for (const auto& [k, v] : e->kwargs) c->kwargs.emplace_back(k, clone_ref(v.get()));
    return c;
  }

  template <typename Next>
  Result<ExprPtr> parse_left_assoc(std::initializer_list<const char*> ops, Next next_level) {
    JINJA_TRY_EXPR(lhs, (this->*next_level)());
    while (true) {
      const char* matched = nullptr;
      for (const char* op : ops) {
        if (at_op(op)) matched = op;
      }
      if (!matched) return lhs;
      int line = cur().line;
      next();
      JINJA_TRY_EXPR(rhs, (this->*next_level)());
      lhs = std::move(binary(ExprKind::kBinary, matched, std::move(lhs), std::move(rhs), line));
    }
  }

  Result<ExprPtr> parse_math1() { return parse_left_assoc({"+", "-"}, &Parser::parse_concat); }
  Result<ExprPtr> parse_concat() { return parse_left_assoc({"~"}, &Parser::parse_math2); }
  Result<ExprPtr> parse_math2() { return parse_left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow); }
  Result<ExprPtr> parse_pow() { return parse_left_assoc({"**"}, &Parser::parse_unary_filtered); }
  Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    int line = cur().line;
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      std::string op = cur().text;
      next();
      if (++depth_ > kMaxNesting) return error_at(line, "expression nested too deeply");
      JINJA_TRY_EXPR(operand, parse_unary(false));
      --depth_;
      node = make_expr(ExprKind::kUnary, line);
      node->name = op;
      node->args.push_back(std::move(operand));
    } else {
      JINJA_TRY_EXPR(primary, parse_primary());
      node = std::move(primary);
    }
    auto post = parse_postfix(std::move(node));
    if (!post.ok() || !with_filter) return post;
    return parse_filter_expr(std::move(post.value()));
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.type == TokenType::kName) {
      auto node = make_expr(ExprKind::kLiteral, line);
      if (t.text == "true" || t.text == "True")
        node->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False")
        node->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None")
        node->value = Value::none();
      else {
        node->kind = ExprKind::kName;
        node->name = t.text;
      }
      next();
      return node;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (cur().type == TokenType::kString) {  // adjacent literals concatenate
        s += cur().text;
        next();
      }
      auto node = make_expr(ExprKind::kLiteral, line);
      node->value = Value::string(std::move(s));
      return node;
    }
    if (t.type == TokenType::kInt || t.type == TokenType::kFloat) {
      auto node = make_expr(ExprKind::kLiteral, line);
      if (t.type == TokenType::kFloat) {
        node->value = Value::real(std::strtod(t.text.c_str(), nullptr));
      } else {
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) return error_at(line, "integer literal out of range: " + t.text);
        node->value = Value::integer(v);
      }
      next();
      return node;
    }
    if (at_op("(")) {
      next();
      if (at_op(")")) {
        next();
        auto node = make_expr(ExprKind::kList, line);
        node->is_tuple = true;
        return node;
      }
      JINJA_TRY_EXPR(inner, parse_expression(true));
      if (at_op(")")) {
        next();
        return inner;
      }
      auto tuple = make_expr(ExprKind::kList, line);
      tuple->is_tuple = true;
      tuple->args.push_back(std::move(inner));
      while (at_op(",")) {
        next();
        if (at_op(")")) break;
        JINJA_TRY_EXPR(item, parse_expression(true));
        tuple->args.push_back(std::move(item));
      }
      TROUPE_TRY(expect_op(")"));
      return tuple;
    }
    if (at_op("[") || at_op("{")) {
      bool is_dict = at_op("{");
      next();
      auto node = make_expr(is_dict ? ExprKind::kDict : ExprKind::kList, line);
      const char* close = is_dict ? "}" : "]";
      while (!at_op(close)) {
        if (!node->args.empty()) {
          TROUPE_TRY(expect_op(","));
          if (at_op(close)) break;
        }
        JINJA_TRY_EXPR(item, parse_expression(true));
        node->args.push_back(std::move(item));
        if (is_dict) {
          TROUPE_TRY(expect_op(":"));
          JINJA_TRY_EXPR(value, parse_expression(true));
          node->args.push_back(std::move(value));
        }
      }
      next();
      return node;
    }
    return error_at(line, "unexpected '" + describe(t) + "' in expression");
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (at_op(".")) {
        next();
        if (cur().type != TokenType::kName && cur().type != TokenType::kInt) {
          return error_at(line, "expected an attribute name after '.'");
        }
        auto attr = make_expr(cur().type == TokenType::kInt ? ExprKind::kGetItem : ExprKind::kGetAttr, line);
        if (attr->kind == ExprKind::kGetItem) {
          auto index = make_expr(ExprKind::kLiteral, line);
          index->value = Value::integer(std::strtoll(cur().text.c_str(), nullptr, 10));
          attr->args.push_back(std::move(node));
          attr->args.push_back(std::move(index));
        } else {
          attr->name = cur().text;
          attr->args.push_back(std::move(node));
        }
        next();
        node = std::move(attr);
      } else if (at_op("[")) {
        next();
        JINJA_TRY_EXPR(sub, parse_subscript(std::move(node), line));
        node = std::move(sub);
      } else if (at_op("(")) {
        JINJA_TRY_EXPR(call, parse_call(std::move(node), line));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (at_op(":")) {
        is_slice = true;
        if (++part > 2) return error_at(line, "too many ':' in slice");
        next();
        continue;
      }
      if (at_op("]")) break;
      if (parts[part]) return error_at(line, "unsupported subscript (tuple index)");
      JINJA_TRY_EXPR(e, parse_expression(true));
      parts[part] = std::move(e);
    }
    next();
    if (!is_slice && !parts[0]) return error_at(line, "empty subscript");
    auto node = make_expr(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, line);
    node->args.push_back(std::move(target));
    node->args.push_back(std::move(parts[0]));
    if (is_slice) {
      node->args.push_back(std::move(parts[1]));
      node->args.push_back(std::move(parts[2]));
    }
    return node;
  }

  // Appends `( args, name=kwargs )` to node (which already holds its leading args).
  Status parse_call_args(Expr& node) {
    TROUPE_TRY(expect_op("("));
    while (!at_op(")")) {
      if (at_op("*") || at_op("**")) return error_at(cur().line, "unsupported construct '*args/**kwargs'");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "=") {
        std::string key = cur().text;
        next();
        next();
        JINJA_TRY_EXPR(value, parse_expression(true));
        node.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!node.kwargs.empty()) return error_at(cur().line, "positional argument after keyword argument");
        JINJA_TRY_EXPR(value, parse_expression(true));
        node.args.push_back(std::move(value));
      }
      if (!at_op(",")) break;
      next();
    }
    return expect_op(")");
  }

  Result<ExprPtr> parse_call(ExprPtr callee, int line) {
    if (callee->kind == ExprKind::kName) {
      if (!is_known_function(callee->name)) return error_at(line, "unsupported function '" + callee->name + "'");
    } else if (callee->kind == ExprKind::kGetAttr) {
      if (!is_known_method(callee->name)) return error_at(line, "unsupported method '" + callee->name + "'");
    } else {
      return error_at(line, "unsupported call target");
    }
    auto node = make_expr(ExprKind::kCall, line);
    node->args.push_back(std::move(callee));
    TROUPE_TRY(parse_call_args(*node));
    return node;
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (at_op("|")) {
        next();
        if (cur().type != TokenType::kName) return error_at(line, "expected a filter name after '|'");
        std::string name = cur().text;
        if (!is_known_filter(name)) return error_at(line, "unsupported filter '" + name + "'");
        next();
        auto filter = make_expr(ExprKind::kFilter, line);
        filter->name = name;
        filter->args.push_back(std::move(node));
        if (at_op("(")) TROUPE_TRY(parse_call_args(*filter));
        node = std::move(filter);
      } else if (at_name("is")) {
        next();
        auto test = make_expr(ExprKind::kTest, line);
        if (at_name("not")) {
          test->negated = true;
          next();
        }
        if (cur().type != TokenType::kName) return error_at(line, "expected a test name after 'is'");
        test->name = cur().text;
        if (!is_known_test(test->name)) return error_at(line, "unsupported test '" + test->name + "'");
        next();
        test->args.push_back(std::move(node));
        if (at_op("(")) {
          TROUPE_TRY(parse_call_args(*test));
        } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                    cur().type == TokenType::kInt || cur().type == TokenType::kFloat || at_op("[") || at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and")) {
          if (at_name("is")) return error_at(line, "tests cannot be chained with 'is'");
          JINJA_TRY_EXPR(arg, parse_primary());
          JINJA_TRY_EXPR(arg_post, parse_postfix(std::move(arg)));
          test->args.push_back(std::move(arg_post));
        }
        node = std::move(test);
      } else if (at_op("(")) {
        return error_at(line, "unsupported call on a filter or test result");
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Body> parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace troupe::jinja
