// The step's inputs on the device (DeviceStep's arrays), packed on the host into one int32
// buffer so that a step is one upload. Host code, no nvcc needed.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/ops.h"

namespace troupe::cuda {

// Where each array lies in the buffer, in int32 values: token ids, positions, slots,
// token -> sequence, attention tiles (num_tokens + 1), block tables (num_seqs rows of
// `width`, a power of two at least max_blocks_per_seq, so that fewer step shapes exist:
// each shape is one CUDA graph).
struct StepLayout {
  size_t num_tokens = 0, width = 1;
  size_t positions = 0, slots = 0, token_seq = 0, tiles = 0, block_tables = 0, total = 0;
};
StepLayout step_layout(const StepInputs& s);

// Fills host (layout.total values) from s. Each sequence's tokens (query_start spans,
// clamped to [0, num_tokens); tokens outside every span: sequence 0) get its index; the
// tokens are cut into tiles of up to 16 of one sequence (DeviceStep::tiles); block-table
// rows are padded with zeros. Returns the longest context (max position + 1).
int32_t pack_step(const StepInputs& s, const StepLayout& l, int32_t* host);

// The DeviceStep for a buffer packed by pack_step and uploaded to dev.
DeviceStep device_step(const StepInputs& s, const StepLayout& l, const int32_t* dev, int32_t max_context);

}  // namespace troupe::cuda
