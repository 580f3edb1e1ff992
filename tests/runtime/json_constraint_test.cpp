// JSON mode (runtime/sample/json_constraint.h), checked against nlohmann::json as the independent
// parser: every prefix of a valid object text is accepted and only the whole text is
// complete; texts mutated at random are accepted whole exactly when nlohmann parses them as
// an object (within the budgets); and sampling under the mask, from random logits over a
// small vocabulary and over the default model's real one, only ever writes JSON-object
// prefixes and ends only on a complete object that nlohmann parses.
#include "runtime/sample/json_constraint.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/format/gguf.h"
#include "runtime/sample/sampler.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/test_util.h"

using namespace troupe;

namespace {

// Fed byte by byte: the byte at which it failed (text.size() when none), and completeness.
std::pair<size_t, bool> run(const std::string& text) {
  JsonPrefix p;
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.feed(static_cast<uint8_t>(text[i]))) return {i, false};
  return {text.size(), p.complete()};
}

// A random JSON value as text, with random whitespace between tokens.
void random_value(std::mt19937& rng, int depth, std::string& out, bool object_only = false) {
  auto ws = [&] {
    const int n = static_cast<int>(rng() % 5) == 0 ? static_cast<int>(rng() % 4) : 0;
    for (int i = 0; i < n; ++i) out += " \n\t\r"[rng() % 4];
  };
  const int kind = object_only ? 0 : static_cast<int>(rng() % (depth > 4 ? 5 : 7));
  switch (kind) {
    case 0:
    case 5: {  // object
      out += '{';
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        if (i) out += ',';
        ws();
        out += "\"k" + std::to_string(rng() % 100) + "\"";
        ws();
        out += ':';
        ws();
        random_value(rng, depth + 1, out);
        ws();
      }
      out += '}';
      break;
    }
    case 6: {  // array
      out += '[';
      const int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        if (i) out += ',';
        ws();
        random_value(rng, depth + 1, out);
        ws();
      }
      out += ']';
      break;
    }
    case 1: {  // string with escapes
      static const char* parts[] = {"a",        "b c", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\uD83D\\uDE00",
                                    "\xc3\xa9", "-"};
      out += '"';
      const int n = static_cast<int>(rng() % 5);
      for (int i = 0; i < n; ++i) out += parts[rng() % 10];
      out += '"';
      break;
    }
    case 2: {  // number
      static const char* nums[] = {"0", "-0", "12", "-3.25", "1e5", "2E-3", "0.5e+10", "-10.0", "7"};
      out += nums[rng() % 9];
      break;
    }
    case 3:
      out += (rng() % 2) ? "true" : "false";
      break;
    default:
      out += "null";
  }
}

}  // namespace

TEST_CASE("JsonPrefix accepts every prefix of an object and completes only at its end", "[json]") {
  std::mt19937 rng(1);
  for (int i = 0; i < 500; ++i) {
    std::string text;
    random_value(rng, 0, text, /*object_only=*/true);
    INFO(text);
    REQUIRE(nlohmann::json::accept(text));  // the generator writes valid JSON
    JsonPrefix p;
    for (size_t k = 0; k < text.size(); ++k) {
      REQUIRE_FALSE(p.complete());
      REQUIRE(p.feed(static_cast<uint8_t>(text[k])));
    }
    REQUIRE(p.complete());
    REQUIRE_FALSE(p.feed('x'));  // nothing after the object
  }
}

TEST_CASE("JsonPrefix refuses invalid texts at the offending byte", "[json]") {
  struct Case {
    std::string text;
    size_t fails_at;
  };
  // valid JSON, but JSON mode wants one object, starting with its brace
  REQUIRE(run(" {}").first == 0);
  REQUIRE(run("[1]").first == 0);
  REQUIRE(run("\"a\"").first == 0);
  const std::vector<Case> cases = {
      {"{\"a\":1,}", 7},
      {"{\"a\":01}", 6},
      {"{\"a\":1.}", 7},
      {"{\"a\":.5}", 5},
      {"{\"a\":\"\\x\"}", 7},
      {"{\"a\":\"\x01\"}", 6},
      {"{\"a\" 1}", 5},
      {"{a:1}", 1},
      {"{\"a\":tru}", 8},
      {"{\"a\":1}}", 7},
      {"{\"a\":[1,]}", 8},
      {"{\"a\":-}", 6},
      {"{\"a\":1e}", 7},
      {"{\"a\":\"\\u12G4\"}", 10},
      {"{\"a\":1]", 6},
      {"{\"a\":[}", 6},
      {"{,}", 1},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    REQUIRE_FALSE(nlohmann::json::accept(c.text));
    REQUIRE(run(c.text).first == c.fails_at);
  }
  // budgets: nesting and runs of whitespace
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  REQUIRE(run(deep).first == deep.size());
  REQUIRE(run(deep + "[").first == deep.size());
  const std::string spaces = "{" + std::string(JsonPrefix::kMaxSpaces, ' ');
  REQUIRE(run(spaces).first == spaces.size());
  REQUIRE(run(spaces + " ").first == spaces.size());
  // an unclosed object is a prefix, not complete
  REQUIRE(run("{\"a\": [1, {\"b\": null}").first == 21);
  REQUIRE_FALSE(run("{\"a\": [1, {\"b\": null}").second);
}

TEST_CASE("JsonPrefix agrees with nlohmann::json on mutated texts", "[json][property]") {
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":,. -+eE0123456789tfnulrasb\\/\n";
  int agreed_valid = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    random_value(rng, 0, text, true);
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text[at] = c;
          break;
        case 1:
          text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          text.erase(at, 1);
      }
    }
    const auto [stop, complete] = run(text);
    const bool ours = stop == text.size() && complete;
    bool theirs = false;
    try {
      theirs = nlohmann::json::parse(text).is_object();
    } catch (const nlohmann::json::parse_error&) { theirs = false; } catch (const nlohmann::json::out_of_range&) {
      continue;  // a number beyond a double (1e510): valid JSON that nlohmann cannot hold
    }
    // nlohmann allows whitespace around the value; JSON mode does not
    if (theirs && (std::isspace(static_cast<unsigned char>(text.front())) ||
                   std::isspace(static_cast<unsigned char>(text.back()))))
      continue;
    std::string shown;
    for (char ch : text)
      shown += (ch >= 0x20 && ch < 0x7f) ? std::string(1, ch) : "<" + std::to_string(int(uint8_t(ch))) + ">";
    INFO(shown);
    REQUIRE(ours == theirs);
    agreed_valid += ours ? 1 : 0;
  }
  REQUIRE(agreed_valid > 1000);  // the mutations leave plenty of valid texts to compare
}

namespace {

// Samples up to `steps` tokens under JSON mode from random logits; returns the text and
// whether it ended on an end-of-generation token.
std::pair<std::string, bool> sample_json(std::shared_ptr<const TokenBytes> tb, uint64_t seed, int steps,
                                         float temperature) {
  const auto vocab = static_cast<int32_t>(tb->bytes.size());
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  sp.json_object = true;
  Sampler s(sp, vocab);
  s.set_token_bytes(tb);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::string text;
  JsonPrefix check;
  for (int i = 0; i < steps; ++i) {
    for (auto& l : logits) l = nd(rng);
    const int32_t t = s.sample(logits.data()).token;
    REQUIRE(t >= 0);
    REQUIRE(t < vocab);
    if (tb->eog[static_cast<size_t>(t)]) {
      INFO("ended after: " << text);
      REQUIRE(check.complete());
      return {text, true};
    }
    const std::string& b = tb->bytes[static_cast<size_t>(t)];
    INFO(text << " + '" << b << "'");
    REQUIRE_FALSE(b.empty());
    REQUIRE(check.feed(b));
    text += b;
    s.accept(t);
  }
  return {text, false};
}

}  // namespace

TEST_CASE("sampling under JSON mode writes only object prefixes and ends on a whole object", "[json][sampler]") {
  auto tb = std::make_shared<TokenBytes>();
  // multi-byte tokens, and (as byte-level vocabularies have) every byte JSON needs alone,
  // so that no accepted prefix is a dead end
  tb->bytes = {"{", "}", "[",    "]",  "\"", ":",  ",", " ",   "a",   "bc",  "1",     "0",    ".5",
               "e", "-", "true", "nu", "ll", "\\", "n", "{\"", "\"}", "\":", "\",\"", "x\"y", ".",
               "E", "+", "t",    "r",  "u",  "f",  "l", "s",   "b",   "/",   "\n",    "",     ""};
  tb->eog.assign(tb->bytes.size(), 0);
  tb->eog.back() = 1;  // the last token ends generation; the one before it is a control token
  tb->finish();
  int ended = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    auto [text, eos] = sample_json(tb, seed, 200, seed % 3 == 0 ? 0.0f : 1.5f);
    if (!eos) continue;
    ++ended;
    INFO(text);
    REQUIRE(nlohmann::json::accept(text));
    REQUIRE(nlohmann::json::parse(text).is_object());
  }
  REQUIRE(ended > 30);
}

TEST_CASE("the mask bans exactly the tokens whose bytes the reader refuses", "[json]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto file = gguf::File::open(path);
  REQUIRE(file.ok());
  auto tok = Tokenizer::from_gguf(*file);
  REQUIRE(tok.ok());
  auto tb = token_bytes(*tok);
  const auto vocab = static_cast<int32_t>(tb->bytes.size());
  std::mt19937 rng(3);
  std::vector<float> logits(static_cast<size_t>(vocab));
  int states = 0;
  for (int i = 0; i < 12; ++i) {
    std::string text;
    random_value(rng, 0, text, true);
    for (size_t cut = 0; cut <= text.size(); cut += 1 + rng() % 7) {  // states along the text
      // the reference: the reader run over each token's bytes from this state
      JsonPrefix at;
      REQUIRE(at.feed(std::string_view(text).substr(0, cut)));
      JsonConstraint c(tb);
      for (size_t k = 0; k < cut; ++k) {  // reach the same state through accept() of 1-byte tokens
        const auto one = tok->encode(std::string(1, text[k]), false, false);
        REQUIRE(one.size() == 1);
        REQUIRE(c.accept(one[0]));
      }
      std::fill(logits.begin(), logits.end(), 0.0f);
      c.mask(logits.data(), vocab);
      int wrong = 0;
      std::string first_wrong;
      for (int32_t t = 0; t < vocab; ++t) {
        const auto u = static_cast<size_t>(t);
        bool want;
        if (tb->eog[u]) {
          want = at.complete();
        } else if (tb->bytes[u].empty() || at.complete()) {
          want = false;
        } else {
          JsonPrefix p = at;
          want = p.feed(tb->bytes[u]);
        }
        if ((logits[u] == 0.0f) != want && wrong++ == 0) first_wrong = tb->bytes[u];
      }
      INFO("state after '" << text.substr(0, cut) << "', first wrong token '" << first_wrong << "'");
      REQUIRE(wrong == 0);
      ++states;
    }
  }
  REQUIRE(states > 30);
}

TEST_CASE("JSON mode over the default model's vocabulary", "[json][sampler]") {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) FAIL(test::model_missing_message(path));
  auto file = gguf::File::open(path);
  REQUIRE(file.ok());
  auto tok = Tokenizer::from_gguf(*file);
  REQUIRE(tok.ok());
  auto tb = token_bytes(*tok);
  REQUIRE(tb->bytes.size() == static_cast<size_t>(tok->vocab_size()));
  // a token with a leading space keeps it; end-of-generation tokens are flagged
  const auto the = tok->encode(" the", false, false);
  REQUIRE(the.size() == 1);
  REQUIRE(tb->bytes[static_cast<size_t>(the[0])] == " the");
  REQUIRE(tb->eog[static_cast<size_t>(tok->eos_id())]);
  int ended = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    auto [text, eos] = sample_json(tb, seed, 120, 1.0f);
    if (!eos) continue;
    ++ended;
    INFO(text);
    REQUIRE(nlohmann::json::parse(text).is_object());
  }
  // random logits over 49k tokens rarely close what they open; every prefix was checked
  WARN(ended << " of 16 random runs closed their object within 120 tokens");
}
