#include "runtime/sample/grammar_constraint.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

namespace troupe {

TokenTrie::TokenTrie(const TokenBytes& tb) {
  std::vector<int32_t> order;
  for (size_t t = 0; t < tb.bytes.size(); ++t)
    if (!tb.bytes[t].empty() && !(t < tb.eog.size() && tb.eog[t])) order.push_back(static_cast<int32_t>(t));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return tb.bytes[static_cast<size_t>(a)] != tb.bytes[static_cast<size_t>(b)]
               ? tb.bytes[static_cast<size_t>(a)] < tb.bytes[static_cast<size_t>(b)]
               : a < b;
  });
  nodes.emplace_back();
  std::vector<uint32_t> last_child(1, 0);
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the previous token
  std::string prev;
  std::vector<std::vector<int32_t>> ends(1);
  for (int32_t t : order) {
    const std::string& b = tb.bytes[static_cast<size_t>(t)];
    size_t common = 0;
    while (common < b.size() && common < prev.size() && b[common] == prev[common]) ++common;
    path.resize(common + 1);
    for (size_t d = common; d < b.size(); ++d) {
      const auto id = static_cast<uint32_t>(nodes.size());
      Node n;
      n.byte = static_cast<uint8_t>(b[d]);
      nodes.push_back(n);
      last_child.push_back(0);
      ends.emplace_back();
      const uint32_t parent = path.back();
      if (last_child[parent])
        nodes[last_child[parent]].next_sibling = id;
      else
        nodes[parent].first_child = id;
      last_child[parent] = id;
      path.push_back(id);
    }
    ends[path.back()].push_back(t);
    prev = b;
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].tokens_begin = static_cast<uint32_t>(tokens.size());
    tokens.insert(tokens.end(), ends[i].begin(), ends[i].end());
    nodes[i].tokens_end = static_cast<uint32_t>(tokens.size());
  }
}

namespace {

// The parse states one walk meets, numbered, with their byte transitions filled as the
// walk needs them: most trie nodes lead to a state seen before (inside a string, after
// any plain character the state is the same), so a node costs an array lookup instead of
// advancing the stacks.
class StateGraph {
 public:
  static constexpr size_t kMaxStates = 4096;  // then the walk advances stacks directly
  explicit StateGraph(const GrammarState& start) { intern(start); }
  // The state after byte b (-1: none takes it; -2: the graph is full).
  int32_t step(int32_t id, uint8_t b) {
    const size_t at = static_cast<size_t>(id) * 256 + b;
    if (trans_[at] != kUnknown) return trans_[at];
    GrammarState next = states_[static_cast<size_t>(id)].after(b);
    const int32_t to = next.dead() ? -1 : intern(std::move(next));
    trans_[at] = to;  // (after intern: it may grow trans_)
    return to;
  }
  const GrammarState& state(int32_t id) const { return states_[static_cast<size_t>(id)]; }

 private:
  static constexpr int32_t kUnknown = -3;
  int32_t intern(GrammarState s) {
    std::string key = s.key();
    if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    if (states_.size() >= kMaxStates) return -2;
    const auto id = static_cast<int32_t>(states_.size());
    ids_.emplace(std::move(key), id);
    states_.push_back(std::move(s));
    trans_.resize(states_.size() * 256, kUnknown);
    return id;
  }
  std::vector<GrammarState> states_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<int32_t> trans_;
};

void mark(const TokenTrie& trie, const TokenTrie::Node& n, GrammarTable::Mask& m) {
  for (uint32_t k = n.tokens_begin; k < n.tokens_end; ++k) {
    const auto t = static_cast<size_t>(trie.tokens[k]);
    m.allowed[t >> 6] |= uint64_t{1} << (t & 63);
    m.any = true;
  }
}

void walk_graph(const TokenTrie& trie, uint32_t node, int32_t id, StateGraph& g, GrammarTable::Mask& m,
                const std::function<void(uint32_t, const GrammarState&)>& direct) {
  for (uint32_t c = trie.nodes[node].first_child; c; c = trie.nodes[c].next_sibling) {
    const TokenTrie::Node& n = trie.nodes[c];
    if (!g.state(id).takes(n.byte)) continue;
    const int32_t next = g.step(id, n.byte);
    if (next == -1) continue;
    if (next == -2) {  // the graph is full: this subtree the slow way
      const GrammarState st = g.state(id).after(n.byte);
      if (st.dead()) continue;
      mark(trie, n, m);
      if (n.first_child) direct(c, st);
      continue;
    }
    mark(trie, n, m);
    if (n.first_child) walk_graph(trie, c, next, g, m, direct);
  }
}

}  // namespace

void GrammarTable::walk(uint32_t node, const GrammarState& st, Mask& m) const {
  for (uint32_t c = trie_->nodes[node].first_child; c; c = trie_->nodes[c].next_sibling) {
    const TokenTrie::Node& n = trie_->nodes[c];
    if (!st.takes(n.byte)) continue;  // the whole subtree is out
    const GrammarState next = st.after(n.byte);
    if (next.dead()) continue;
    for (uint32_t k = n.tokens_begin; k < n.tokens_end; ++k) {
      const auto t = static_cast<size_t>(trie_->tokens[k]);
      m.allowed[t >> 6] |= uint64_t{1} << (t & 63);
      m.any = true;
    }
    if (n.first_child) walk(c, next, m);
  }
}

std::shared_ptr<const GrammarTable::Mask> GrammarTable::compute(const GrammarState& st) const {
  auto m = std::make_shared<Mask>();
  m->allowed.assign((tb_->bytes.size() + 63) / 64, 0);
  m->accepting = st.accepting();
  if (st.can_continue()) {
    StateGraph g(st);
    walk_graph(*trie_, 0, 0, g, *m, [&](uint32_t node, const GrammarState& s) { walk(node, s, *m); });
  }
  return m;
}

std::shared_ptr<const GrammarTable::Mask> GrammarTable::mask(const GrammarState& st) {
  const std::string key = st.key();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = masks_.find(key); it != masks_.end()) {
      ++hits_;
      return it->second;
    }
  }
  auto m = compute(st);  // outside the lock: other requests' lookups go on
  std::lock_guard<std::mutex> lk(mu_);
  ++misses_;
  if (masks_.size() >= kMaxMasks) masks_.clear();
  masks_.emplace(key, m);
  return m;
}

GrammarCache::GrammarCache(std::shared_ptr<const TokenBytes> tb, size_t capacity)
    : tb_(std::move(tb)), trie_(std::make_shared<const TokenTrie>(*tb_)), capacity_(std::max<size_t>(capacity, 1)) {}

Result<std::shared_ptr<GrammarTable>> GrammarCache::get(const std::string& gbnf) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = index_.find(gbnf); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  auto g = Grammar::compile(gbnf);
  if (!g) return std::move(g).error();
  auto table = std::make_shared<GrammarTable>(std::move(*g), tb_, trie_);
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = index_.find(gbnf); it != index_.end()) return it->second->second;  // compiled meanwhile
  lru_.emplace_front(gbnf, table);
  index_[gbnf] = lru_.begin();
  if (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return table;
}

void GrammarConstraint::mask(float* logits, int32_t vocab) const {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto m = table_->mask(state_);
  const TokenBytes& tb = table_->tokens();
  for (int32_t t = 0; t < vocab; ++t) {
    const auto i = static_cast<size_t>(t);
    bool ok;
    if (i >= tb.bytes.size())
      ok = false;
    else if (i < tb.eog.size() && tb.eog[i])
      ok = m->accepting || !m->any;  // no way on: let it end rather than write nothing forever
    else
      ok = (m->allowed[i >> 6] >> (i & 63)) & 1u;
    if (!ok) logits[t] = neg_inf;
  }
}

bool GrammarConstraint::accept(int32_t token) {
  const TokenBytes& tb = table_->tokens();
  if (token < 0 || static_cast<size_t>(token) >= tb.bytes.size()) return false;
  const auto i = static_cast<size_t>(token);
  if (i < tb.eog.size() && tb.eog[i]) return state_.accepting();
  const std::string& b = tb.bytes[i];
  if (b.empty()) return false;
  GrammarState next = state_;
  if (!next.feed(b)) return false;
  state_ = std::move(next);
  return true;
}

}  // namespace troupe
