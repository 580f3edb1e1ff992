#include "runtime/sched/kv_ledger.h"

#include <algorithm>

namespace troupe {
namespace {

// An admission: the largest prefix hit (at most what the cache has now) that keeps the
// step within the plan's tokens and blocks for it. For a chunked admission no hit at all
// always fits the plan's count; a whole-prompt one (chunked prefill off) must start at or
// after the hinted hit, so it is refused when that hit was evicted meanwhile.
KvOpResult admit(KvBlockManager& kv, const KvOp& op, std::vector<BlockCopy>* copies) {
  KvOpResult r;
  const int32_t bs = kv.config().block_size;
  const int32_t len = static_cast<int32_t>(op.tokens.size());
  if (len == 0 || op.num_tokens < 1 || kv.block_table(op.seq)) return r;
  const std::vector<bool> probe = kv.probe_prefix(op.tokens);
  std::vector<int32_t> free_before(probe.size() + 1, 0);  // free-listed blocks among the first k
  for (size_t k = 0; k < probe.size(); ++k) free_before[k + 1] = free_before[k] + (probe[k] ? 1 : 0);
  for (int32_t h = static_cast<int32_t>(probe.size()); h >= 0; --h) {
    const int32_t cached = h * bs;
    const int32_t n = op.whole ? len - cached : std::min(len - cached, op.num_tokens);
    if (n < 1 || n > op.num_tokens) continue;
    const int32_t take = free_before[h] + kv.blocks_needed(cached + n) - h;
    if (take > op.allowance || take > kv.num_free_blocks()) continue;
    auto got = kv.add_sequence(op.seq, op.tokens, h);
    if (!got || *got != cached || !kv.reserve(op.seq, cached + n, op.tokens, copies)) {
      kv.free_sequence(op.seq);
      return r;
    }
    // The prefix-cache stats count what add_sequence would have looked up unbounded: the
    // hits, the blocks past `h` it found too, and the first miss.
    const int32_t eligible = (len - 1) / bs;
    const int32_t found = static_cast<int32_t>(probe.size());
    if (kv.config().enable_prefix_caching)
      kv.count_prefix_queries(static_cast<uint64_t>(found - h + (found < eligible ? 1 : 0)));
    return {true, cached, n};
  }
  return r;
}

}  // namespace

KvSnapshot kv_snapshot(const KvBlockManager& kv, const std::vector<KvProbe>& probes) {
  KvSnapshot s;
  s.num_free = kv.num_free_blocks();
  s.seqs = kv.seq_blocks();
  s.stats = kv.stats();
  for (const KvProbe& p : probes) {
    const std::vector<bool> hit = kv.probe_prefix(p.tokens);
    s.hints.push_back(
        {p.seq, static_cast<int32_t>(hit.size()), static_cast<int32_t>(std::count(hit.begin(), hit.end(), true))});
  }
  return s;
}

KvOpsReply apply_kv_ops(KvBlockManager& kv, const KvOpsRequest& req) {
  KvOpsReply out;
  out.batch = req.batch;
  if (req.drop_cached) kv.drop_cached_free();
  bool admissions_refused = false;
  for (const KvOp& op : req.ops) {
    KvOpResult r;
    switch (op.kind) {
      case KvOp::Kind::Admit:
        if (!admissions_refused) r = admit(kv, op, &out.copies);
        admissions_refused = !r.ok;
        break;
      case KvOp::Kind::Reserve:
        r.ok = kv.block_table(op.seq) && kv.reserve(op.seq, op.num_tokens, op.tokens, &out.copies);
        break;
      case KvOp::Kind::Free:
        kv.free_sequence(op.seq);
        r.ok = true;
        break;
      case KvOp::Kind::Truncate:
        kv.truncate(op.seq, op.num_tokens);
        r.ok = kv.block_table(op.seq) != nullptr;
        break;
    }
    out.results.push_back(r);
  }
  for (int64_t id : req.tables) {
    const auto* t = kv.block_table(id);
    out.tables.push_back({id, t ? *t : std::vector<int32_t>{}});
  }
  out.snapshot = kv_snapshot(kv, req.probes);
  return out;
}

KvLedger::KvLedger(const KvBlockConfig& cfg, bool chunked_prefill) : cfg_(cfg), chunked_prefill_(chunked_prefill) {
  if (cfg_.block_size <= 0) cfg_.block_size = 16;
  free_ = std::max(0, cfg_.num_blocks);
  stats_.num_blocks = free_;
  stats_.num_free = free_;
}

std::optional<int32_t> KvLedger::add_sequence(int64_t seq, const std::vector<int32_t>& prompt) {
  if (held_.count(seq) || admitting_.count(seq)) return std::nullopt;
  Admission a;
  if (auto h = hints_.find(seq); h != hints_.end() && may_hit(prompt)) {
    a.hinted = true;
    a.cached_blocks = std::max(0, h->second.cached_blocks);
    // At least one prompt token is left to compute (as the block manager does).
    while (a.cached_blocks > 0 && static_cast<size_t>(a.cached_blocks) * cfg_.block_size >= prompt.size())
      --a.cached_blocks;
    a.free_listed = std::clamp(h->second.free_listed, 0, a.cached_blocks);
  }
  admitting_[seq] = a;
  return a.cached_blocks * cfg_.block_size;
}

bool KvLedger::reserve(int64_t seq, int32_t num_tokens, const std::vector<int32_t>& tokens, std::vector<BlockCopy>*) {
  if (auto a = admitting_.find(seq); a != admitting_.end()) {
    const int32_t cached = a->second.cached_blocks * cfg_.block_size;
    if (num_tokens <= cached) return false;
    if (!a->second.hinted && may_hit(tokens) && num_tokens < static_cast<int32_t>(tokens.size())) {
      // A first chunk without a hint would count cached blocks as new and compute the
      // prompt from its start: wait for the actor to say what the cache holds.
      needs_probe_ = true;
      return false;
    }
    // New blocks, plus the cached ones that sit in the free list. Once this request frees
    // a sequence, every block counts: a hinted block still shared at the snapshot may be
    // in the free list by the time the actor gets here.
    const int32_t take = freed_in_request_
                             ? blocks_needed(num_tokens)
                             : blocks_needed(num_tokens) - a->second.cached_blocks + a->second.free_listed;
    if (take > free_) return false;
    free_ -= take;
    const int32_t held = blocks_needed(num_tokens);
    held_[seq] = {held, held - a->second.cached_blocks};  // exclusive: at least the new blocks
    KvOp op;
    op.kind = KvOp::Kind::Admit;
    op.seq = seq;
    op.cached = cached;
    op.num_tokens = num_tokens - cached;
    op.allowance = take;
    op.whole = !chunked_prefill_ && num_tokens == static_cast<int32_t>(tokens.size());
    op.tokens = tokens;
    ops_.push_back(std::move(op));
    admitting_.erase(a);
    return true;
  }
  auto h = held_.find(seq);
  if (h == held_.end()) return false;
  const int32_t need = std::max(0, blocks_needed(num_tokens) - h->second.held);
  if (need > free_) return false;
  free_ -= need;
  h->second.held += need;
  h->second.exclusive += need;
  KvOp op;
  op.kind = KvOp::Kind::Reserve;
  op.seq = seq;
  op.num_tokens = num_tokens;
  // The tokens go along only when the reservation fills a block (the block manager hashes
  // full blocks for the prefix cache): it then takes a new block or ends on a block
  // boundary. (A decode step otherwise copied the whole sequence every step.)
  if (cfg_.enable_prefix_caching && (need > 0 || num_tokens % cfg_.block_size == 0)) op.tokens = tokens;
  ops_.push_back(std::move(op));
  return true;
}

void KvLedger::free_sequence(int64_t seq) {
  if (admitting_.erase(seq)) return;  // an admission undone before it was recorded
  auto h = held_.find(seq);
  if (h == held_.end()) return;
  free_ += h->second.exclusive;  // shared blocks stay with their other holders
  held_.erase(h);
  freed_in_request_ = true;
  KvOp op;
  op.kind = KvOp::Kind::Free;
  op.seq = seq;
  ops_.push_back(std::move(op));
}

void KvLedger::truncate(int64_t seq, int32_t n) {
  auto h = held_.find(seq);
  if (h == held_.end() || n < 0) return;
  const int32_t released = std::max(0, h->second.held - blocks_needed(n));
  const int32_t exclusive_gone = std::min(released, h->second.exclusive);
  h->second.held -= released;
  h->second.exclusive -= exclusive_gone;
  free_ += exclusive_gone;
  KvOp op;
  op.kind = KvOp::Kind::Truncate;
  op.seq = seq;
  op.num_tokens = n;
  ops_.push_back(std::move(op));
}

std::vector<KvOp> KvLedger::take_ops() {
  std::vector<KvOp> out;
  out.swap(ops_);
  freed_in_request_ = false;
  return out;
}

void KvLedger::sync(const KvSnapshot& s) {
  free_ = s.num_free;
  held_.clear();
  for (const KvSeqBlocks& b : s.seqs) held_[b.seq] = {b.held, b.exclusive};
  admitting_.clear();
  needs_probe_ = false;
  freed_in_request_ = false;
  hints_.clear();
  for (const KvHint& h : s.hints) hints_[h.seq] = h;
  stats_ = s.stats;
}

}  // namespace troupe
