// The host-run CUDA runtime (tests/hostrun/README.md): what the generated kernel launches
// (launch.h) and the tests ask of the fake runtime in runtime.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

namespace hostrun {

// Appends an operation to a stream: it runs when the stream is synchronized (or the
// device, by cudaFree), in stream order; into the capture while the stream is captured.
void enqueue(cudaStream_t stream, std::function<void()> op);
// A failed launch: what cudaGetLastError returns next; the reason goes to stderr.
void launch_failed(cudaError_t e, const std::string& why);
// Whether p may be handed to a kernel on `device`: null, or inside a live allocation of
// that device or a pinned host allocation. *why says what is wrong otherwise.
bool device_pointer_ok(const void* p, int device, std::string* why);
int stream_device(cudaStream_t stream);
int current_device();
// The dynamic shared memory a kernel opted into (cudaFuncSetAttribute), 0 if none.
int opted_shared_bytes(const void* kernel);

struct Counters {
  uint64_t kernel_launches = 0;  // kernels run (eager or replayed)
  uint64_t graph_launches = 0;
  uint64_t syncs = 0;
  uint64_t live_allocations = 0;  // device and pinned
};
Counters counters();
// Test hook: the number of devices the fake runtime reports (grows only; default
// TROUPE_HOSTRUN_DEVICES or 2).
void set_device_count(int n);
void note_kernel();  // (launch.h: one kernel ran)

}  // namespace hostrun
