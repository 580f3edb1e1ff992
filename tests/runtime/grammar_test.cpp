// Structured output (runtime/grammar/, runtime/sample/grammar_constraint.h): GBNF
// compilation and its errors, UTF-8 class compilation against an encoder, regexes against
// std::regex (ECMAScript) as the independent matcher, JSON schemas against nlohmann's
// parser and hand-written instances, the trie-walked mask against a brute-force pass over
// the default model's real vocabulary, sampling under the mask, and hostile inputs
// failing within a time bound.
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common/utf8.h"
#include "runtime/format/gguf.h"
#include "runtime/grammar/grammar.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/structured_output.h"
#include "runtime/sample/grammar_constraint.h"
#include "runtime/sample/sampler.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/test_util.h"

using namespace troupe;
using ojson = nlohmann::ordered_json;

namespace {

std::shared_ptr<const Grammar> compile(const std::string& g) {
  auto r = Grammar::compile(g);
  INFO(g);
  if (!r) FAIL(r.error().message);
  return *r;
}

// Whole-text match: every byte taken, then accepting.
bool matches(const Grammar& g, const std::string& text) {
  GrammarState st(g);
  return st.feed(text) && st.accepting();
}
bool is_prefix(const Grammar& g, const std::string& text) {
  GrammarState st(g);
  return st.feed(text);
}

std::string utf8(uint32_t c) {
  std::string s;
  append_utf8(s, c);
  return s;
}

struct Vocab {
  std::shared_ptr<const TokenBytes> tb;
  std::unique_ptr<Tokenizer> tok;
};
const Vocab& default_vocab() {
  static Vocab v = [] {
    Vocab out;
    const std::string path = test::default_model_path();
    if (!test::file_exists(path)) return out;
    auto file = gguf::File::open(path);
    if (!file) return out;
    auto tok = Tokenizer::from_gguf(*file);
    if (!tok) return out;
    out.tok = std::make_unique<Tokenizer>(std::move(*tok));
    out.tb = token_bytes(*out.tok);
    return out;
  }();
  if (!v.tb) FAIL(test::model_missing_message(test::default_model_path()));
  return v;
}

}  // namespace

TEST_CASE("UTF-8 ranges encode exactly the code points of the range", "[grammar]") {
  std::mt19937 rng(1);
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {{0, 0x10FFFF},     {0x41, 0x5A},     {0x7F, 0x80},
                                                             {0x700, 0x900},    {0xD7F0, 0xE010}, {0xFFF0, 0x10010},
                                                             {0x1F600, 0x1F64F}};
  for (auto [lo, hi] : ranges) {
    const auto seqs = utf8_sequences(lo, hi);
    auto in_seqs = [&](const std::string& b) {
      for (const auto& s : seqs) {
        if (s.size() != b.size()) continue;
        bool ok = true;
        for (size_t i = 0; i < s.size(); ++i)
          ok = ok && static_cast<uint8_t>(b[i]) >= s[i].first && static_cast<uint8_t>(b[i]) <= s[i].second;
        if (ok) return true;
      }
      return false;
    };
    for (int k = 0; k < 4000; ++k) {
      uint32_t c = k < 2000 ? lo + rng() % (hi - lo + 1) : rng() % 0x110000;
      if (k % 500 == 0) c = k % 1000 ? lo : hi;
      const bool surrogate = c >= 0xD800 && c <= 0xDFFF;
      INFO("range " << lo << "-" << hi << " code point " << c);
      REQUIRE(in_seqs(utf8(c)) == (c >= lo && c <= hi && !surrogate));
    }
  }
}

TEST_CASE("GBNF grammars match the strings they describe", "[grammar]") {
  auto g = compile(R"(root ::= "a" [0-9]+ ( "x" | "yz" )? tail
tail ::= | "!" # a comment
)");
  for (const char* yes : {"a1", "a12x", "a1yz", "a0!", "a9yz!"}) CHECK(matches(*g, yes));
  for (const char* no : {"a", "ax", "a1y", "b1", "a1x!!", "a1xyz"}) CHECK_FALSE(matches(*g, no));
  CHECK(is_prefix(*g, "a1y"));
  CHECK_FALSE(is_prefix(*g, "a1q"));

  auto braces = compile(R"g(root ::= "(" root ")" | "")g");  // recursion (not left recursion)
  CHECK(matches(*braces, "((()))"));
  CHECK_FALSE(matches(*braces, "(()"));

  auto rep = compile(R"(root ::= [a-c]{2,4} "-" "z"{3} [^a-z]{0,2} .)");
  CHECK(matches(*rep, "ab-zzz9é"));
  CHECK(matches(*rep, "abca-zzz12x"));
  CHECK_FALSE(matches(*rep, "a-zzzx"));
  CHECK_FALSE(matches(*rep, "abcab-zzzx"));
  CHECK_FALSE(matches(*rep, "ab-zzzq9x"));

  // a tail-called repetition keeps one state however long it runs: the mask cache's premise
  auto star = compile(R"(root ::= "\"" [a-z]* "\"")");
  GrammarState st(*star);
  REQUIRE(st.feed("\"abc"));
  const std::string k1 = st.key();
  REQUIRE(st.feed("defghijklmnop"));
  CHECK(st.key() == k1);
  CHECK(st.num_stacks() <= 2);
}

TEST_CASE("bad GBNF is refused with the reason", "[grammar]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "empty"},
      {"root ::= foo", "'foo' is used but not defined"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= root \"a\" | \"b\"", "left-recursive"},
      {"root ::= x \"a\"\nx ::= y\ny ::= x | \"\"", "left-recursive"},
      {"root ::= (\"\" | \"a\")*", "left-recursive"},
      {"root ::= \"a\"{5000}", "limit"},
      {"root ::= \"a\"{3,2}", "n < m"},
      {"root ::= (\"a\"", "expected ')'"},
      {"root ::= \"a\" )", "unbalanced"},
      {"root ::= \"abc", "unterminated"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root ::= \"\\xZZ\"", "hex"},
      {"root = \"a\"", "'::='"},
  };
  for (const auto& [text, words] : bad) {
    auto r = Grammar::compile(text);
    INFO(text);
    REQUIRE_FALSE(r);
    INFO(r.error().message);
    CHECK(r.error().message.find(words) != std::string::npos);
  }
  // the element limit counts repetitions expanded
  GrammarLimits lim;
  lim.max_elements = 1000;
  auto big = Grammar::compile("root ::= ([a-z]{100}){100}", lim);
  CHECK(big.ok());  // a group is one rule: 200 elements
  auto over = Grammar::compile("root ::= [a-z]{600} [a-z]{600}", lim);
  REQUIRE_FALSE(over);
  CHECK(over.error().message.find("elements") != std::string::npos);
}

TEST_CASE("regexes match what std::regex fully matches", "[grammar]") {
  const std::vector<std::string> regexes = {"[a-c]+x?",  "(ab|a)(bc|c)*", "\\d{2,3}-\\d{4}", "[^abc]{1,3}",
                                            "a.c",       "(?:x|yy){2}z*", "\\w+@\\w+\\.com", "[0-9a-f]{4}",
                                            "(a|b)*abb", "\\s*ok\\s*",    "[-+]?[0-9]+",     "x{0,2}y{2,}"};
  std::mt19937 rng(7);
  const std::string alphabet = "abcxyz0129-+@.okm \t";
  int positives = 0;
  for (const auto& re : regexes) {
    auto text = regex_to_gbnf(re);
    INFO(re);
    REQUIRE(text.ok());
    auto g = compile(*text);
    const std::regex ref(re, std::regex::ECMAScript);
    for (int k = 0; k < 3000; ++k) {
      std::string s;
      const int n = static_cast<int>(rng() % 9);
      for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
      const bool want = std::regex_match(s, ref);
      positives += want;
      INFO("string '" << s << "'");
      REQUIRE(matches(*g, s) == want);
    }
  }
  CHECK(positives > 100);  // the random strings hit the regexes often enough to mean something
  for (const std::string bad : {"(a", "a)", "\\1", "(?=a)", "a^b", "*a", "[b-a]", "a{2,1}", "\\bx", "a++"}) {
    INFO(bad);
    CHECK_FALSE(regex_to_gbnf(bad).ok());
  }
}

TEST_CASE("JSON schemas: the grammar takes valid instances and refuses invalid ones", "[grammar]") {
  struct Case {
    const char* schema;
    std::vector<const char*> valid, invalid;
  };
  const std::vector<Case> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0}},
          "required":["name","age"],"additionalProperties":false})",
       {R"({"name":"Ann","age":31})", R"({ "name": "B\"o\u00e9", "age": 0 })",
        "{\n  \"name\": \"x\",\n  \"age\": 7\n}"},
       {R"({"age":31,"name":"Ann"})", R"({"name":"Ann"})", R"({"name":"Ann","age":-1})", R"({"name":"Ann","age":1.5})",
        R"({"name":"Ann","age":31,"x":1})", R"({"name":Ann,"age":31})"}},
      {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}},
          "required":["b"]})",
       {R"({"b":null})", R"({"a":true,"b":null})", R"({"b":null,"c":-1.5e3})", R"({"a":false,"b":null,"c":0})"},
       {R"({})", R"({"a":true})", R"({"b":null,"a":true})", R"({"b":null,,"c":1})", R"({"a":true,"b":null,})"}},
      {R"({"type":"array","items":{"enum":["red","green",3,null]},"minItems":1,"maxItems":3})",
       {R"(["red"])", R"(["green",3,null])", R"([ 3 , "red" ])"},
       {R"([])", R"(["blue"])", R"(["red","red","red","red"])", R"(["red",])"}},
      {R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})",
       {R"("AB-123")"},
       {R"("ab-123")", R"("AB-12")", R"(AB-123)"}},
      {R"({"type":"string","pattern":"cat"})", {R"("a cat!")", R"("cat")"}, {R"("dog")"}},
      {R"({"type":"string","minLength":2,"maxLength":3})",
       {R"("ab")", R"("a\nb")", R"("é€x")"},
       {R"("a")", R"("abcd")"}},
      {R"({"anyOf":[{"type":"integer"},{"type":"string","format":"date"}]})",
       {"42", R"("2024-02-29")"},
       {"4.2", R"("2024-13-01")", "true"}},
      {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},
          "required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
       {R"({"v":1,"next":{"v":2,"next":null}})"},
       {R"({"v":1,"next":{"v":2}})"}},
      {R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {R"({})", R"({"x":1,"y":2})"},
       {R"({"x":"1"})"}},
      {R"({"const":{"k":[1,2]}})", {R"({"k":[1,2]})"}, {R"({"k":[1,3]})"}},
      {R"({"type":["string","null"],"title":"t","description":"d"})", {R"("s")", "null"}, {"1"}},
      {R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
      {R"({})", {R"({"any":[1,"two",{"three":null}]})", "3", R"("x")"}, {"{", "[1,]"}},
  };
  for (const auto& c : cases) {
    INFO(c.schema);
    auto text = json_schema_to_gbnf(ojson::parse(c.schema));
    if (!text) FAIL(text.error().message);
    INFO(*text);
    auto g = compile(*text);
    for (const char* v : c.valid) {
      INFO("valid: " << v);
      CHECK(matches(*g, v));
    }
    for (const char* v : c.invalid) {
      INFO("invalid: " << v);
      CHECK_FALSE(matches(*g, v));
    }
  }
}

TEST_CASE("unsupported or hostile schemas are refused naming the keyword, fast", "[grammar]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type":"string","maxLenght":3})", "'maxLenght'"},
      {R"({"type":"integer","maximum":3})", "'maximum'"},
      {R"({"type":"object","properties":{"a":{"type":"string","format":"email"}}})", "format 'email'"},
      {R"({"$ref":"#/$defs/missing"})", "names no definition"},
      {R"({"$ref":"http://example.com/s.json"})", "'$ref' must be"},
      {R"({"type":"object","required":["x"]})", "'x' is not in 'properties'"},
      {R"({"type":"string","minLength":5,"maxLength":2})", "below"},
      {R"({"type":"string","maxLength":100000})", "maxLength"},
      {R"({"type":"strin"})", "unknown type"},
      {R"({"type":"string","pattern":"(a)\\1"})", "pattern"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf"},
      {"false", "matches nothing"},
  };
  for (const auto& [schema, words] : bad) {
    auto r = json_schema_to_gbnf(ojson::parse(schema));
    INFO(schema);
    REQUIRE_FALSE(r);
    INFO(r.error().message);
    CHECK(r.error().message.find(words) != std::string::npos);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 200; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  auto r = json_schema_to_gbnf(ojson::parse(deep));
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("deeper") != std::string::npos);
  ojson big_enum = {{"enum", ojson::array()}};
  for (int i = 0; i < 100000; ++i) big_enum["enum"].push_back("value number " + std::to_string(i));
  r = json_schema_to_gbnf(big_enum);
  REQUIRE_FALSE(r);
  CHECK(r.error().message.find("enum") != std::string::npos);
  // an exponentially ambiguous grammar: refused at its start by the parse budget
  auto so = structured_output(ojson::parse(R"({"guided_grammar":"root ::= (\"\" | \"\"){64} \"a\""})"));
  CHECK_FALSE(so.ok());
  CHECK(so.error.find("ambiguous") != std::string::npos);
  // a regex with nested repetition that backtracking engines take exponential time over
  so = structured_output(ojson::parse(R"({"guided_regex":"(a+)+b"})"));
  REQUIRE(so.ok());
  auto g = compile(so.grammar);
  GrammarState st(*g);
  REQUIRE(st.feed(std::string(5000, 'a')));  // linear: the parse stacks are deduplicated
  CHECK(st.num_stacks() < 16);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 5.0);
  // more than one constraint at once
  so = structured_output(ojson::parse(R"({"guided_regex":"a","guided_choice":["a"]})"));
  CHECK_FALSE(so.ok());
  CHECK(so.error.find("only one") != std::string::npos);
}

TEST_CASE("the grammar mask equals a brute-force pass over the real vocabulary", "[grammar]") {
  const Vocab& v = default_vocab();
  GrammarCache cache(v.tb);
  auto text = json_schema_to_gbnf(ojson::parse(
      R"({"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"},
          "tags":{"type":"array","items":{"enum":["big","old","coastal"]}}},"required":["city","population"]})"));
  REQUIRE(text.ok());
  auto table = cache.get(*text);
  REQUIRE(table.ok());
  const auto vocab = static_cast<int32_t>(v.tb->bytes.size());
  const std::string sample = R"({"city": "Paris", "population": 2161000, "tags": ["old", "big"]})";
  std::vector<float> logits(static_cast<size_t>(vocab));
  int states = 0, allowed_total = 0;
  for (size_t cut = 0; cut <= sample.size(); cut += 3) {
    GrammarState ref((*table)->grammar());
    REQUIRE(ref.feed(sample.substr(0, cut)));
    GrammarConstraint c(*table);
    for (size_t k = 0; k < cut; ++k) {  // the same state through accept() of one-byte tokens
      const auto one = v.tok->encode(std::string(1, sample[k]), false, false);
      REQUIRE(one.size() == 1);
      REQUIRE(c.accept(one[0]));
    }
    std::fill(logits.begin(), logits.end(), 0.0f);
    c.mask(logits.data(), vocab);
    int wrong = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      const auto i = static_cast<size_t>(t);
      bool want;
      if (v.tb->eog[i]) {
        want = ref.accepting();
      } else if (v.tb->bytes[i].empty()) {
        want = false;
      } else {
        GrammarState s = ref;
        want = s.feed(v.tb->bytes[i]);
      }
      const bool got = logits[i] == 0.0f;
      wrong += got != want;
      allowed_total += got;
    }
    INFO("state after " << cut << " bytes: '" << sample.substr(0, cut) << "'");
    CHECK(wrong == 0);
    ++states;
  }
  CHECK(states > 20);
  CHECK(allowed_total > 1000);  // inside the strings most of the vocabulary is allowed
  CHECK((*table)->hits() > 0);  // states recur (the string's characters), so the table is used
}

TEST_CASE("sampling under a schema writes only valid instances", "[grammar]") {
  const Vocab& v = default_vocab();
  GrammarCache cache(v.tb);
  auto text = json_schema_to_gbnf(ojson::parse(
      R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"},
          "word":{"type":"string","maxLength":6},"kind":{"enum":["a","b"]}},"required":["ok","n","word","kind"],
          "additionalProperties":false})"));
  REQUIRE(text.ok());
  const auto vocab = static_cast<int32_t>(v.tb->bytes.size());
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  int ended = 0;
  for (int run = 0; run < 40; ++run) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.seed = static_cast<uint64_t>(run);
    p.grammar = *text;
    Sampler smp(p, vocab);
    auto table = cache.get(*text);
    REQUIRE(table.ok());
    smp.set_grammar(*table);
    std::string out;
    bool done = false;
    for (int step = 0; step < 120 && !done; ++step) {
      for (auto& x : logits) x = noise(rng);
      const SampleResult r = smp.sample(logits.data());
      if (v.tb->eog[static_cast<size_t>(r.token)]) {
        done = true;
        break;
      }
      out += v.tb->bytes[static_cast<size_t>(r.token)];
      smp.accept(r.token);
    }
    if (!done) continue;
    ++ended;
    INFO(out);
    REQUIRE(nlohmann::json::accept(out));
    const auto j = nlohmann::json::parse(out);
    REQUIRE(j.is_object());
    REQUIRE(j.size() == 4);
    CHECK(j["ok"].is_boolean());
    CHECK(j["n"].is_number_integer());
    CHECK((j["word"].is_string() && j["word"].get<std::string>().size() <= 6 * 4));
    CHECK((j["kind"] == "a" || j["kind"] == "b"));
  }
  CHECK(ended > 20);
}

TEST_CASE("grammar mask cost (hidden: run by hand)", "[.grammar-cost]") {
  const Vocab& v = default_vocab();
  GrammarCache cache(v.tb);
  auto text = json_schema_to_gbnf(ojson::parse(
      R"({"type":"array","items":{"type":"object","properties":{"city":{"type":"string","maxLength":20},"country":{"type":"string","maxLength":20},"population":{"type":"integer"}},"required":["city","country","population"],"additionalProperties":false},"minItems":8,"maxItems":8})"));
  REQUIRE(text.ok());
  auto table = cache.get(*text);
  REQUIRE(table.ok());
  const char* cities[] = {"Tokyo", "Delhi", "Shanghai", "Sao Paulo", "Mexico City", "Cairo", "Mumbai", "Beijing"};
  std::string sample = "[";
  for (int i = 0; i < 8; ++i)
    sample += std::string(i ? ", " : "") + R"({"city": ")" + cities[i] +
              R"(", "country": "Somewhere", "population": )" + std::to_string(1000003 * (i + 7)) + "}";
  sample += "]";
  const auto ids = v.tok->encode(sample, false, false);
  const auto vocab = static_cast<int32_t>(v.tb->bytes.size());
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int pass = 0; pass < 2; ++pass) {
    GrammarConstraint c(*table);
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t id : ids) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      c.mask(logits.data(), vocab);
      INFO("token '" << v.tb->bytes[static_cast<size_t>(id)] << "'");
      REQUIRE(c.accept(id));
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN("pass " << pass << ": " << ids.size() << " tokens, " << ms / ids.size() << " ms/token, hits "
                 << (*table)->hits() << " misses " << (*table)->misses());
  }
}
