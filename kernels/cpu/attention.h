// Causal attention of a tile of queries from one sequence and one KV head over the paged
// f16 KV cache. Each K/V row is converted once and used by every query of the tile and
// every query head sharing the KV head (GQA), so prefill does not reload the cache per
// query. A query's result never depends on the tile it is computed in.
#pragma once
#include <cstdint>

namespace troupe::cpu {

struct AttentionTile {
  const uint16_t* k = nullptr;  // layer base of K: [slots, num_kv_heads, head_dim] f16
  const uint16_t* v = nullptr;
  int64_t row = 0;  // num_kv_heads * head_dim
  int32_t head_dim = 0, block_size = 0, group = 0, kv_head = 0;
  const int32_t* block_table = nullptr;
  float scale = 1.0f;
  // Queries: token i of the tile at q + i * ld_q, heads kv_head*group .. +group.
  const float* q = nullptr;
  int64_t ld_q = 0;
  const int32_t* positions = nullptr;  // [num] position of each query (attends to 0..pos)
  int32_t num = 0;
  float* out = nullptr;  // token i at out + i * ld_out, same head layout as q
  int64_t ld_out = 0;
  // KV heads' parts of each cache row the SIMD bodies prefetch, from kv_head on: 1 = this
  // head's only; more when the next heads' tiles follow on the same thread (their rows are
  // then in this core's L2). Never changes a result.
  int32_t prefetch_heads = 1;
};

void attention_tile(const AttentionTile& a);
// One key and one query at a time through dot_f32/axpy_f32; attention_tile gives the same
// bits (its AVX2 body is a blocked form of this), which a test checks.
void attention_tile_portable(const AttentionTile& a);
// The SIMD bodies attention_tile picks (head_dim % 64 == 0; the AVX2 one needs AVX2+FMA+F16C,
// the AVX-512 one AVX-512VL: detect_isa() >= Isa::Avx2 / Isa::Avx512). Declared for tests.
void attention_tile_avx2(const AttentionTile& a);
void attention_tile_avx512(const AttentionTile& a);
// x[i] = std::exp(x[i] - sub) for i < n, bit for bit (vectorized where the CPU has AVX2 and
// FMA: the softmax of attention_tile). Checked for x - sub in [-103.97, 0] and below (0);
// groups of eight with a lane above 88 go through std::exp.
void exp_sub_row(float* x, int32_t n, float sub);

}  // namespace troupe::cpu
