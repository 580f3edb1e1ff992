// The step's inputs packed for one upload (step_pack.h).
#include "kernels/cuda/step_pack.h"

#include <algorithm>
#include <cstring>

namespace troupe::cuda {

StepLayout step_layout(const StepInputs& s) {
  StepLayout l;
  l.num_tokens = static_cast<size_t>(std::max(s.num_tokens, 0));
  while (l.width < static_cast<size_t>(std::max(s.max_blocks_per_seq, 0))) l.width *= 2;
  const size_t nt = l.num_tokens;
  l.positions = nt;
  l.slots = 2 * nt;
  l.token_seq = 3 * nt;
  l.tiles = 4 * nt;
  l.block_tables = 5 * nt + 1;
  l.total = l.block_tables + static_cast<size_t>(std::max(s.num_seqs, 0)) * l.width;
  return l;
}

int32_t pack_step(const StepInputs& s, const StepLayout& l, int32_t* h) {
  const size_t nt = l.num_tokens;
  std::memcpy(h, s.token_ids, nt * 4);
  std::memcpy(h + l.positions, s.positions, nt * 4);
  std::memcpy(h + l.slots, s.slot_mapping, nt * 4);
  std::fill(h + l.token_seq, h + l.token_seq + nt, 0);
  const int32_t n = static_cast<int32_t>(nt);
  for (int32_t q = 0; q < s.num_seqs; ++q) {
    const int32_t t0 = std::clamp(s.query_start[q], 0, n), t1 = std::clamp(s.query_start[q + 1], 0, n);
    for (int32_t t = t0; t < t1; ++t) h[l.token_seq + t] = q;
  }
  // Tiles: a new one at every change of sequence and after 16 tokens, over every token (so
  // no tile is longer than 16 or spans two sequences, whatever the spans were).
  int32_t* tiles = h + l.tiles;
  size_t num_tiles = 0;
  for (int32_t t = 0; t < n; ++t)
    if (num_tiles == 0 || h[l.token_seq + t] != h[l.token_seq + t - 1] || t - tiles[num_tiles - 1] == 16)
      tiles[num_tiles++] = t;
  std::fill(tiles + num_tiles, tiles + nt + 1, n);
  const size_t mb = static_cast<size_t>(std::max(s.max_blocks_per_seq, 0));
  for (int32_t q = 0; q < s.num_seqs; ++q) {
    int32_t* row = h + l.block_tables + static_cast<size_t>(q) * l.width;
    std::memcpy(row, s.block_tables + static_cast<size_t>(q) * mb, mb * 4);
    std::fill(row + mb, row + l.width, 0);
  }
  int32_t max_ctx = 0;
  for (size_t t = 0; t < nt; ++t) max_ctx = std::max(max_ctx, s.positions[t] + 1);
  return max_ctx;
}

DeviceStep device_step(const StepInputs& s, const StepLayout& l, const int32_t* dev, int32_t max_context) {
  DeviceStep d;
  d.max_context = max_context;
  d.num_tokens = s.num_tokens;
  d.num_seqs = s.num_seqs;
  d.max_blocks_per_seq = static_cast<int32_t>(l.width);
  d.token_ids = dev;
  d.positions = dev + l.positions;
  d.slot_mapping = dev + l.slots;
  d.token_seq = dev + l.token_seq;
  d.tiles = dev + l.tiles;
  d.block_tables = dev + l.block_tables;
  return d;
}

}  // namespace troupe::cuda
