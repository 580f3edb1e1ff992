// The KV-block manager: hand-checked cases (prefix hits, no room, copy-on-write fork,
// truncation) and a randomized property test with the invariants checked after every one
// of thousands of operations and the pool back at its baseline at the end.
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "runtime/sched/kv_block_manager.h"

using namespace troupe;

namespace {
std::vector<int32_t> seq_tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + salt) % 50;
  return t;
}
void check(const KvBlockManager& m) {
  auto st = m.check_invariants();
  if (!st.ok()) FAIL(st.error().message);
}
}  // namespace

TEST_CASE("prefix caching reuses full blocks and counts hits", "[kv]") {
  KvBlockManager m({8, 4, true});
  auto prompt = seq_tokens(10, 1);
  REQUIRE(m.add_sequence(1, prompt) == 0);
  REQUIRE(m.reserve(1, 10, prompt, nullptr));
  REQUIRE(m.block_table(1)->size() == 3);
  REQUIRE(m.num_free_blocks() == 5);
  m.free_sequence(1);
  REQUIRE(m.num_free_blocks() == 8);
  REQUIRE(m.stats().num_cached_free == 2);  // the two full blocks keep their content
  // Same first 9 tokens: two full blocks (8 tokens) come from the cache, one token is left.
  std::vector<int32_t> p2(prompt.begin(), prompt.begin() + 9);
  REQUIRE(m.add_sequence(2, p2) == 8);
  REQUIRE(m.stats().prefix_hits == 2);
  REQUIRE(m.num_free_blocks() == 6);
  // Exactly 8 tokens: only one block may be reused (one token must remain to compute).
  std::vector<int32_t> p3(prompt.begin(), prompt.begin() + 8);
  REQUIRE(m.add_sequence(3, p3) == 4);
  REQUIRE(m.block_table(3)->front() == m.block_table(2)->front());
  check(m);
  m.free_sequence(2);
  m.free_sequence(3);
  REQUIRE(m.num_free_blocks() == 8);
  check(m);
}

// A stage node restarted (actors/remote_stage.h): the free list's cached content is gone
// from the device, so the manager forgets it; blocks that sequences hold keep theirs.
TEST_CASE("drop_cached_free forgets the free list's cached content only", "[kv]") {
  KvBlockManager m({8, 4, true});
  auto a = seq_tokens(10, 1), b = seq_tokens(9, 2);
  REQUIRE(m.add_sequence(1, a) == 0);
  REQUIRE(m.reserve(1, 10, a, nullptr));
  m.commit(1, a);
  REQUIRE(m.add_sequence(2, b) == 0);
  REQUIRE(m.reserve(2, 9, b, nullptr));
  m.commit(2, b);
  m.free_sequence(1);  // two cached full blocks in the free list; sequence 2 holds two more
  REQUIRE(m.stats().num_cached_free == 2);
  REQUIRE(m.drop_cached_free() == 2);
  check(m);
  REQUIRE(m.stats().num_cached_free == 0);
  REQUIRE(m.num_free_blocks() == 5);
  REQUIRE(m.add_sequence(3, a) == 0);  // no hit: recomputed
  std::vector<int32_t> b8(b.begin(), b.begin() + 9);
  REQUIRE(m.add_sequence(4, b8) == 8);  // sequence 2's blocks are still shared
  check(m);
  for (int64_t s : {2, 3, 4}) m.free_sequence(s);
  REQUIRE(m.num_free_blocks() == 8);
  check(m);
}

TEST_CASE("no room is a value and changes nothing", "[kv]") {
  KvBlockManager m({3, 4, false});
  auto t = seq_tokens(12, 2);
  REQUIRE(m.add_sequence(1, t) == 0);
  REQUIRE(m.reserve(1, 8, t, nullptr));
  REQUIRE(m.add_sequence(2, t) == 0);
  REQUIRE_FALSE(m.reserve(2, 8, t, nullptr));  // needs 2, 1 free
  REQUIRE(m.block_table(2)->empty());
  REQUIRE(m.num_free_blocks() == 1);
  REQUIRE(m.reserve(2, 4, t, nullptr));
  REQUIRE_FALSE(m.reserve(1, 13, t, nullptr));
  REQUIRE(m.num_tokens(1) == 8);
  check(m);
}

TEST_CASE("fork shares blocks and the first write copies the shared partial block", "[kv]") {
  KvBlockManager m({6, 4, true});
  auto t = seq_tokens(6, 3);
  REQUIRE(m.add_sequence(1, t) == 0);
  REQUIRE(m.reserve(1, 6, t, nullptr));
  REQUIRE(m.fork(1, 2));
  REQUIRE(*m.block_table(2) == *m.block_table(1));
  REQUIRE(m.num_free_blocks() == 4);
  std::vector<BlockCopy> copies;
  auto t2 = t;
  t2.push_back(9);
  REQUIRE(m.reserve(2, 7, t2, &copies));
  REQUIRE(copies.size() == 1);
  REQUIRE(copies[0].src == (*m.block_table(1))[1]);
  REQUIRE(copies[0].dst == (*m.block_table(2))[1]);
  REQUIRE((*m.block_table(2))[0] == (*m.block_table(1))[0]);  // full block still shared
  check(m);
  m.truncate(2, 3);
  REQUIRE(m.block_table(2)->size() == 1);
  check(m);
  m.free_sequence(1);
  m.free_sequence(2);
  REQUIRE(m.num_free_blocks() == 6);
  check(m);
}

TEST_CASE("random operations keep every invariant and return the pool to baseline", "[kv][property]") {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    KvBlockManager m({40, 4, seed != 3});
    std::map<int64_t, std::vector<int32_t>> tokens;  // what each sequence holds
    int64_t next_id = 0;
    for (int op = 0; op < 4000; ++op) {
      const int kind = static_cast<int>(rng() % 6);
      auto pick = [&]() -> int64_t {
        if (tokens.empty()) return -1;
        auto it = tokens.begin();
        std::advance(it, static_cast<long>(rng() % tokens.size()));
        return it->first;
      };
      if (kind == 0 && tokens.size() < 10) {  // new sequence, prompts drawn from few prefixes
        const int64_t id = next_id++;
        auto p = seq_tokens(1 + static_cast<int>(rng() % 20), static_cast<int>(rng() % 3));
        auto cached = m.add_sequence(id, p);
        REQUIRE(cached.has_value());
        REQUIRE(*cached < static_cast<int32_t>(p.size()));
        if (m.reserve(id, static_cast<int32_t>(p.size()), p, nullptr))
          tokens[id] = p;
        else
          m.free_sequence(id);
      } else if (kind == 1) {  // grow
        const int64_t id = pick();
        if (id < 0) continue;
        auto t = tokens[id];
        const int add = 1 + static_cast<int>(rng() % 6);
        for (int i = 0; i < add; ++i) t.push_back(static_cast<int32_t>(rng() % 50));
        std::vector<BlockCopy> copies;
        if (m.reserve(id, static_cast<int32_t>(t.size()), t, &copies)) tokens[id] = t;
        for (auto c : copies) REQUIRE(c.src != c.dst);
      } else if (kind == 2) {
        const int64_t id = pick();
        if (id < 0) continue;
        m.free_sequence(id);
        tokens.erase(id);
      } else if (kind == 3 && tokens.size() < 10) {
        const int64_t id = pick();
        if (id < 0) continue;
        REQUIRE(m.fork(id, next_id));
        tokens[next_id++] = tokens[id];
      } else if (kind == 4) {
        const int64_t id = pick();
        if (id < 0 || tokens[id].empty()) continue;
        const int n = static_cast<int>(rng() % tokens[id].size());
        m.truncate(id, n);
        tokens[id].resize(static_cast<size_t>(n));
      } else {
        const int64_t id = pick();
        if (id < 0) continue;
        REQUIRE(m.num_tokens(id) == static_cast<int32_t>(tokens[id].size()));
      }
      auto st = m.check_invariants();
      if (!st.ok()) FAIL("seed " << seed << " op " << op << ": " << st.error().message);
    }
    for (auto& [id, t] : tokens) m.free_sequence(id);
    REQUIRE(m.num_free_blocks() == 40);
    check(m);
    if (seed != 3) REQUIRE(m.stats().prefix_hits > 0);
  }
}
