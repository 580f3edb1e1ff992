#include "runtime/sched/kv_block_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <unordered_set>

namespace troupe {

KvBlockManager::KvBlockManager(const KvBlockConfig& cfg) : cfg_(cfg) {
  if (cfg_.num_blocks < 0) cfg_.num_blocks = 0;
  if (cfg_.block_size <= 0) cfg_.block_size = 16;
  blocks_.resize(static_cast<size_t>(cfg_.num_blocks));
  for (int32_t b = 0; b < cfg_.num_blocks; ++b) {
    blocks_[b].free_pos = free_.insert(free_.end(), b);
    blocks_[b].in_free = true;
  }
}

uint64_t KvBlockManager::chain_hash(uint64_t parent, const int32_t* tokens) const {
  // Seeded with the parent's hash, so a block's identity includes everything before it.
  return XXH3_64bits_withSeed(tokens, sizeof(int32_t) * static_cast<size_t>(cfg_.block_size), parent);
}

int32_t KvBlockManager::take_free_block() {
  const int32_t b = free_.front();
  free_.pop_front();
  Block& blk = blocks_[b];
  blk.in_free = false;
  if (blk.has_hash) {  // evict its cached content
    --cached_free_;
    auto it = cached_.find(blk.hash);
    if (it != cached_.end() && it->second == b) cached_.erase(it);
    blk.has_hash = false;
  }
  blk.ref = 1;
  return b;
}

void KvBlockManager::release(int32_t b) {
  Block& blk = blocks_[b];
  if (--blk.ref > 0) return;
  // Blocks holding cached content go to the LRU tail; content-free ones are reused first.
  blk.free_pos = blk.has_hash ? free_.insert(free_.end(), b) : free_.insert(free_.begin(), b);
  blk.in_free = true;
  if (blk.has_hash) ++cached_free_;
}

std::optional<int32_t> KvBlockManager::add_sequence(int64_t seq, const std::vector<int32_t>& prompt,
                                                    int32_t max_cached_blocks) {
  if (seqs_.count(seq)) return std::nullopt;
  Seq s;
  const int32_t bs = cfg_.block_size;
  if (cfg_.enable_prefix_caching) {
    uint64_t parent = 0;
    // Full blocks only, and at least one prompt token is left to compute.
    for (size_t i = 0;
         (i + 1) * static_cast<size_t>(bs) < prompt.size() && static_cast<int32_t>(s.blocks.size()) < max_cached_blocks;
         ++i) {
      const uint64_t h = chain_hash(parent, prompt.data() + i * bs);
      ++queries_;
      auto it = cached_.find(h);
      if (it == cached_.end()) break;
      ++hits_;
      Block& blk = blocks_[it->second];
      if (blk.in_free) {
        free_.erase(blk.free_pos);
        blk.in_free = false;
        --cached_free_;  // (it has cached content: the cache found it)
      }
      ++blk.ref;
      s.blocks.push_back(it->second);
      s.hashes.push_back(h);
      parent = h;
    }
  }
  s.num_tokens = static_cast<int32_t>(s.blocks.size()) * bs;
  const int32_t cached = s.num_tokens;
  seqs_.emplace(seq, std::move(s));
  return cached;
}

std::vector<bool> KvBlockManager::probe_prefix(const std::vector<int32_t>& prompt) const {
  std::vector<bool> free_listed;
  if (!cfg_.enable_prefix_caching) return free_listed;
  const size_t bs = static_cast<size_t>(cfg_.block_size);
  uint64_t parent = 0;
  for (size_t i = 0; (i + 1) * bs < prompt.size(); ++i) {
    const uint64_t h = chain_hash(parent, prompt.data() + i * bs);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    free_listed.push_back(blocks_[it->second].in_free);
    parent = h;
  }
  return free_listed;
}

bool KvBlockManager::reserve(int64_t seq, int32_t num_tokens, const std::vector<int32_t>& tokens,
                             std::vector<BlockCopy>* copies) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || num_tokens < 0) return false;
  Seq& s = it->second;
  if (num_tokens <= s.num_tokens) return true;
  const int32_t bs = cfg_.block_size;
  const bool writes_partial = s.num_tokens % bs != 0 && !s.blocks.empty();
  const bool cow = writes_partial && blocks_[s.blocks.back()].ref > 1;
  const int32_t need = blocks_needed(num_tokens) - static_cast<int32_t>(s.blocks.size()) + (cow ? 1 : 0);
  if (need > num_free_blocks()) return false;
  if (cow) {
    const int32_t old = s.blocks.back();
    const int32_t fresh = take_free_block();
    if (copies) copies->push_back({old, fresh});
    release(old);
    s.blocks.back() = fresh;
  } else if (writes_partial) {
    // The partial last block is about to change: it must not stay findable by content.
    Block& blk = blocks_[s.blocks.back()];
    if (blk.has_hash) {
      auto c = cached_.find(blk.hash);
      if (c != cached_.end() && c->second == s.blocks.back()) cached_.erase(c);
      blk.has_hash = false;
    }
  }
  while (static_cast<int32_t>(s.blocks.size()) < blocks_needed(num_tokens)) s.blocks.push_back(take_free_block());
  s.num_tokens = num_tokens;
  commit(seq, tokens);
  return true;
}

void KvBlockManager::commit(int64_t seq, const std::vector<int32_t>& tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  const int32_t bs = cfg_.block_size;
  const size_t limit = std::min(tokens.size(), static_cast<size_t>(s.num_tokens));
  while ((s.hashes.size() + 1) * static_cast<size_t>(bs) <= limit && s.hashes.size() < s.blocks.size()) {
    const uint64_t parent = s.hashes.empty() ? 0 : s.hashes.back();
    const uint64_t h = chain_hash(parent, tokens.data() + s.hashes.size() * bs);
    const int32_t b = s.blocks[s.hashes.size()];
    Block& blk = blocks_[b];
    if (cfg_.enable_prefix_caching && !blk.has_hash && !cached_.count(h)) {
      cached_[h] = b;
      blk.hash = h;
      blk.has_hash = true;
    }
    s.hashes.push_back(h);
  }
}

int32_t KvBlockManager::drop_cached_free() {
  int32_t dropped = 0;
  for (int32_t b : free_) {
    Block& blk = blocks_[b];
    if (!blk.has_hash) continue;
    auto it = cached_.find(blk.hash);
    if (it != cached_.end() && it->second == b) cached_.erase(it);
    blk.has_hash = false;
    ++dropped;
  }
  cached_free_ = 0;
  return dropped;
}

void KvBlockManager::free_sequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Tail first, so a shared prefix stays cached longest.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) release(*b);
  seqs_.erase(it);
}

bool KvBlockManager::fork(int64_t parent, int64_t child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end() || seqs_.count(child)) return false;
  Seq copy = it->second;
  for (int32_t b : copy.blocks) ++blocks_[b].ref;
  seqs_.emplace(child, std::move(copy));
  return true;
}

void KvBlockManager::truncate(int64_t seq, int32_t n) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || n < 0 || n >= it->second.num_tokens) return;
  Seq& s = it->second;
  const size_t keep = static_cast<size_t>(blocks_needed(n));
  while (s.blocks.size() > keep) {
    release(s.blocks.back());
    s.blocks.pop_back();
  }
  s.hashes.resize(std::min(s.hashes.size(), static_cast<size_t>(n / cfg_.block_size)));
  s.num_tokens = n;
}

const std::vector<int32_t>* KvBlockManager::block_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second.blocks;
}

int32_t KvBlockManager::num_tokens(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second.num_tokens;
}

KvBlockStats KvBlockManager::stats() const {
  KvBlockStats st;
  st.num_blocks = cfg_.num_blocks;
  st.num_free = num_free_blocks();
  st.num_cached_free = cached_free_;
  st.prefix_queries = queries_;
  st.prefix_hits = hits_;
  return st;
}

std::vector<KvSeqBlocks> KvBlockManager::seq_blocks() const {
  std::vector<KvSeqBlocks> out;
  out.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) {
    KvSeqBlocks b{id, static_cast<int32_t>(s.blocks.size()), 0};
    for (int32_t blk : s.blocks) b.exclusive += blocks_[blk].ref == 1 ? 1 : 0;
    out.push_back(b);
  }
  std::sort(out.begin(), out.end(), [](const KvSeqBlocks& a, const KvSeqBlocks& b) { return a.seq < b.seq; });
  return out;
}

Status KvBlockManager::check_invariants() const {
  std::vector<int32_t> refs(blocks_.size(), 0);
  for (const auto& [id, s] : seqs_) {
    if (static_cast<int32_t>(s.blocks.size()) != blocks_needed(s.num_tokens))
      return make_error("sequence " + std::to_string(id) + " holds " + std::to_string(s.blocks.size()) +
                        " blocks for " + std::to_string(s.num_tokens) + " tokens");
    if (s.hashes.size() > s.blocks.size())
      return make_error("sequence " + std::to_string(id) + " has more hashes than blocks");
    for (int32_t b : s.blocks) {
      if (b < 0 || b >= cfg_.num_blocks) return make_error("block id out of range");
      ++refs[b];
    }
  }
  std::unordered_set<int32_t> in_list;
  int32_t cached_free = 0;
  for (int32_t b : free_) {
    cached_free += blocks_[b].has_hash ? 1 : 0;
    if (!in_list.insert(b).second) return make_error("block " + std::to_string(b) + " is twice in the free list");
    if (!blocks_[b].in_free)
      return make_error("block " + std::to_string(b) + " is in the free list but not marked free");
  }
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref != refs[b])
      return make_error("block " + std::to_string(b) + " has ref " + std::to_string(blk.ref) + " but " +
                        std::to_string(refs[b]) + " users");
    if ((blk.ref == 0) != blk.in_free || blk.in_free != (in_list.count(static_cast<int32_t>(b)) == 1))
      return make_error("block " + std::to_string(b) + " free-list membership disagrees with its ref count");
    if (blk.has_hash) {
      auto it = cached_.find(blk.hash);
      if (it == cached_.end() || it->second != static_cast<int32_t>(b))
        return make_error("block " + std::to_string(b) + " is hashed but not in the prefix cache");
    }
  }
  if (cached_free != cached_free_)
    return make_error("the free list holds " + std::to_string(cached_free) + " cached blocks but " +
                      std::to_string(cached_free_) + " are counted");
  for (const auto& [h, b] : cached_)
    if (!blocks_[b].has_hash || blocks_[b].hash != h)
      return make_error("prefix cache entry points at a block with other content");
  return {};
}

}  // namespace troupe
