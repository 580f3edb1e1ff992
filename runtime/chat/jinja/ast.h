// Tokens and syntax tree of the chat-template Jinja subset (private to runtime/).
// Lexer: jinja_lexer.cpp; parser: jinja_parser.cpp; evaluator: jinja_eval.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "runtime/chat/jinja/value.h"

namespace troupe::jinja {

enum class TokenType : uint8_t {
  kText,        // raw template data, whitespace control already applied
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kVarBegin,    // {{
  kVarEnd,      // }}
  kName,
  kString,  // value already unescaped
  kInt,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int line;
};

// Tokenizes with Jinja's defaults plus HF's trim_blocks=True, lstrip_blocks=True;
// newlines normalized to \n and one trailing newline dropped (keep_trailing_newline=False).
Result<std::vector<Token>> lex(const std::string& source);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : uint8_t {
  kLiteral,  // value
  kName,     // name
  kList,     // args = items (is_tuple for tuples)
  kDict,     // args = key0, value0, key1, value1, ...
  kGetAttr,  // args[0].name
  kGetItem,  // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]] (null = omitted)
  kCall,     // args[0](args[1..], kwargs); args[0] is a kName or kGetAttr (method)
  kFilter,   // args[0] | name(args[1..], kwargs)
  kTest,     // args[0] is [not] name(args[1..])
  kUnary,    // name in {"-", "+", "not"}
  kBinary,   // name is the operator: + - * / // % ** ~ == != < > <= >= in "not in"
  kAnd,
  kOr,
  kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value value;
  bool negated = false;  // kTest: "is not"
  bool is_tuple = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using Body = std::vector<Stmt>;

enum class StmtKind : uint8_t {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // conds[k] guards bodies[k]; a trailing body without cond is the else
  kFor,       // for targets in expr [if cond]: bodies[0]; else: bodies[1]
  kSet,       // set targets = expr (targets: one name, a tuple of names, or ns.attr)
  kSetBlock,  // set targets[0] %}bodies[0]{% endset
  kBreak,
  kContinue,
  kBlock,  // bodies[0] rendered in place ({% generation %})
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  std::vector<std::string> targets;
  std::string attr;  // kSet on a namespace: targets[0].attr = expr
  ExprPtr expr;
  ExprPtr filter;  // kFor: the "if" clause
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
};

// Parses tokens into a body; errors read "chat template line N: ...".
Result<Body> parse(const std::vector<Token>& tokens);

// Error text with the line prefix every parse and render error carries.
inline Error error_at(int line, const std::string& what) {
  return make_error("chat template line " + std::to_string(line) + ": " + what);
}

// Names the parser accepts; the evaluator implements exactly these (jinja_builtins.cpp).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
bool is_known_function(const std::string& name);
bool is_known_method(const std::string& name);

}  // namespace troupe::jinja
