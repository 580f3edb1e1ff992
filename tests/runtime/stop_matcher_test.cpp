#include <catch2/catch.hpp>

#include <random>

#include "runtime/request/stop_matcher.h"

using troupe::StopMatcher;

namespace {

// Feeds `pieces` through a matcher; returns what it sent and whether it stopped.
std::pair<std::string, bool> feed(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string sent;
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto out = m.push(pieces[i], i + 1 == pieces.size());
    sent += out.text;
    if (out.stopped) return {sent, true};
  }
  return {sent, false};
}

}  // namespace

TEST_CASE("stop matcher: the longest suffix that starts a stop string is held back", "[request][unit]") {
  REQUIRE(StopMatcher::holdback("hello wor", {"world"}) == 3);
  REQUIRE(StopMatcher::holdback("hello", {"world"}) == 0);
  REQUIRE(StopMatcher::holdback("ab", {"abc", "b!"}) == 2);
  REQUIRE(StopMatcher::holdback("x\n", {"\n\n"}) == 1);
  REQUIRE(StopMatcher::holdback("", {"a"}) == 0);
  REQUIRE(StopMatcher::holdback("abc", {""}) == 0);  // (an empty stop string holds nothing)
}

TEST_CASE("stop matcher: a stop string split over pieces ends the stream before it", "[request][unit]") {
  StopMatcher m({"world"});
  auto a = m.push("hello wo");
  REQUIRE(a.text == "hello ");
  REQUIRE(!a.stopped);
  REQUIRE(m.held() == "wo");
  auto b = m.push("rl");
  REQUIRE(b.text.empty());
  REQUIRE(m.held() == "worl");
  auto c = m.push("d and more");
  REQUIRE(c.stopped);
  REQUIRE(c.text.empty());
  REQUIRE(m.stopped());
  REQUIRE(m.push("x").text.empty());  // nothing after a stop
}

TEST_CASE("stop matcher: held text that does not become a stop string is sent, and all of it at the end",
          "[request][unit]") {
  StopMatcher m({"abc"});
  REQUIRE(m.push("xab").text == "x");
  REQUIRE(m.push("d").text == "abd");
  REQUIRE(m.push("ab").text.empty());
  auto last = m.push("", true);
  REQUIRE(last.text == "ab");
  REQUIRE(!last.stopped);
}

TEST_CASE("stop matcher: the earliest of several stop strings wins, empty ones are ignored", "[request][unit]") {
  REQUIRE(feed({"cd", "b"}, {"abcd"}) == std::make_pair(std::string("a"), true));
  REQUIRE(feed({"", "zz"}, {"abc"}) == std::make_pair(std::string("abc"), false));
  REQUIRE(feed({"\n\n"}, {"one\n", "\n", "two"}) == std::make_pair(std::string("one"), true));
}

TEST_CASE("stop matcher: over any split into pieces, the stream ends before the first stop string complete so far",
          "[request][unit]") {
  // Against the definition (vLLM's, token by token): after the first piece with which the
  // text so far holds a stop string, the stream ends before the earliest such occurrence;
  // with none, all of the text is sent.
  std::mt19937 rng(17);
  const std::string alphabet = "ab\n";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int ns = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < ns; ++s) {
      std::string st;
      const int sl = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < sl; ++i) st += alphabet[rng() % alphabet.size()];
      stops.push_back(st);
    }
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = 1 + rng() % 3;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    if (pieces.empty()) pieces.push_back("");
    size_t first = std::string::npos, upto = 0;
    for (const auto& piece : pieces) {
      upto += piece.size();
      const std::string so_far = text.substr(0, upto);
      for (const auto& s : stops) first = std::min(first, so_far.find(s));
      if (first != std::string::npos) break;
    }
    const std::string want = first == std::string::npos ? text : text.substr(0, first);
    auto [sent, stopped] = feed(stops, pieces);
    INFO("text '" << text << "' trial " << trial);
    REQUIRE(sent == want);
    REQUIRE(stopped == (first != std::string::npos));
  }
}
