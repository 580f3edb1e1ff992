// Kernel launches of the host-run CUDA backend (tests/hostrun/README.md): gen_cu.py turns
// `kernel<<<grid, block, shmem, stream>>>(args)` into `launcher(grid, block, shmem,
// stream)(kernel, args)`. The launch is checked as the device would check it (block and
// grid limits, dynamic shared memory past 48 KiB only after the kernel opted in, the
// stream's device current) and more strictly (every pointer argument inside a live
// allocation of the stream's device, or pinned memory), then queued on the stream and run
// through the emulation (tests/kernels/cuda_emulation.h) when the stream is synchronized.
#pragma once
#include <mutex>
#include <sstream>
#include <type_traits>

#include "tests/hostrun/runtime.h"

namespace cuda_emu {

// Runs a grid of blocks of `threads` threads, one block at a time.
template <typename Kernel, typename... Args>
void launch_grid(dim3 grid, unsigned threads, Kernel kernel, Args... args) {
  launch3(grid.x, grid.y, grid.z, threads, kernel, args...);
}

inline std::mutex& kernel_mutex() {  // (the emulation's `current` block is one global)
  static std::mutex m;
  return m;
}

struct launcher {
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  launcher(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), shmem(s), stream(st) {}

  template <typename Kernel, typename... Args>
  void operator()(Kernel kernel, Args... args) const {
    std::ostringstream why;
    const int dev = hostrun::stream_device(stream);
    if (block.x == 0 || block.x > 1024 || block.y != 1 || block.z != 1 || block.x % 32 != 0)
      why << "block of " << block.x << "x" << block.y << "x" << block.z
          << " threads (the kernels here use 1-D blocks of 32..1024 whole warps)";
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
      why << "grid of " << grid.x << "x" << grid.y << "x" << grid.z << " blocks";
    else if (shmem > 48 * 1024 &&
             static_cast<size_t>(hostrun::opted_shared_bytes(reinterpret_cast<const void*>(kernel))) < shmem)
      why << shmem << " bytes of dynamic shared memory without the kernel's opt-in";
    else if (dev != hostrun::current_device())
      why << "a stream of device " << dev << " while device " << hostrun::current_device() << " is current";
    else {
      std::string bad;
      int index = 0;
      auto check = [&](const auto& a) {
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_pointer_v<A>) {
          std::string w;
          if (bad.empty() && !hostrun::device_pointer_ok(static_cast<const void*>(a), dev, &w))
            bad = "argument " + std::to_string(index) + ": " + w;
        }
        ++index;
      };
      (check(args), ...);
      why << bad;
    }
    if (!why.str().empty()) {
      hostrun::launch_failed(
          grid.x == 0 || block.x == 0 || block.x > 1024 ? cudaErrorInvalidConfiguration : cudaErrorInvalidValue,
          why.str());
      return;
    }
    const dim3 g = grid;
    const unsigned threads = block.x;
    hostrun::enqueue(stream, [=] {
      std::lock_guard<std::mutex> lock(kernel_mutex());
      hostrun::note_kernel();
      launch_grid(g, threads, kernel, args...);
    });
  }
};

}  // namespace cuda_emu

// cuda_runtime.h's typed overload (nvcc includes it; the host compiler sees only the C API).
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
