// The GGUF block decoders every CUDA kernel shares (dequant32 in kernels/cuda/common.cuh),
// through the embedding kernel's source (kernels/cuda/embed.cu) run on the CPU by
// tests/kernels/cuda_emulation.h: every weight type's rows must decode to exactly the
// reference dequantizer's values (kernels/cpu/quant_ref.h), row lengths off the 32-column
// chunk included for the float types.
#define TROUPE_CUDA_EMULATION 1
#include "tests/kernels/cuda_emulation.h"
// (the emulation header first: it defines the CUDA keywords the kernel source uses)
#include "kernels/cuda/embed.cu"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "kernels/cpu/quant_ref.h"
#include "tests/kernels/kernel_test_util.h"

using namespace troupe;

TEST_CASE("the CUDA block decoders' source decodes every weight type exactly as the reference",
          "[kernels][cuda-emulation]") {
  std::mt19937 g(6);
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                         DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types) {
    const bool k_quant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
    const bool is_float = t == DType::F32 || t == DType::F16 || t == DType::BF16;
    for (int64_t cols : {k_quant ? int64_t{512} : int64_t{96}, is_float ? int64_t{45} : int64_t{0}}) {
      if (cols == 0) continue;
      const int64_t rows = 7;
      // Rows in the device layout (float rows padded to 32 columns, the 32-value block
      // types split into quants, high bits and scales).
      const size_t src_rb = *row_bytes(t, static_cast<uint64_t>(cols));
      const auto w = test::random_weight(t, rows, cols, g);
      size_t rb = 0;
      const auto dev = test::device_rows(t, w, rows, cols, &rb);
      const std::vector<int32_t> ids = {3, 0, 6, 3, 1};
      std::vector<float> out(ids.size() * static_cast<size_t>(cols), -1.0f);
      bool ran = false;
      cuda::dispatch_dtype(t, [&]<DType T>() {
        cuda_emu::launch(static_cast<unsigned>(ids.size()), 128, cuda::embed_kernel<T>,
                         static_cast<const uint8_t*>(dev.data()), rb, cols, ids.data(), out.data());
        ran = true;
      });
      REQUIRE(ran);
      std::vector<float> ref(static_cast<size_t>(cols));
      for (size_t i = 0; i < ids.size(); ++i) {
        REQUIRE(cpu::dequantize_row_ref(t, w.data() + ids[i] * src_rb, ref.data(), cols));
        INFO(dtype_traits(t).name << " cols " << cols << " row " << ids[i]);
        CHECK(std::memcmp(ref.data(), out.data() + i * cols, static_cast<size_t>(cols) * 4) == 0);
      }
    }
  }
}
