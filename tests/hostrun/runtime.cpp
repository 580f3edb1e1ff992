// The host-run CUDA runtime and cuBLAS (tests/hostrun/README.md): the entry points the CUDA
// backend calls, implemented on the host so that the backend's own code -- scratch sizes,
// uploads, launch configurations, graph capture and replay, fused paths, several devices
// -- runs with the kernels' source (through tests/kernels/cuda_emulation.h) on machines
// without a GPU. Stricter than a GPU where that finds bugs a GPU would hide:
// - work is deferred: a stream's kernels and copies run only when it is synchronized (or
//   the device, by cudaFree), so a result read early, or pinned memory rewritten before
//   its copy ran, gives wrong values here rather than a rare race there;
// - every allocation ends in a guard zone checked at each synchronization (a kernel or
//   copy writing past a buffer fails that synchronization with cudaErrorIllegalAddress);
// - copies and kernels' pointer arguments must lie in live allocations of the stream's
//   device (or pinned memory), launches must name the current device's stream;
// - while a thread captures a graph, the calls a GPU refuses then (allocation, freeing,
//   synchronous copies, synchronization, pageable memory in a captured copy) fail and
//   invalidate the capture.
// Compiled with names.h force-included: the functions below get their hostrun_ names.
#include "tests/hostrun/runtime.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct CUstream_st {
  int device = 0;
  bool capturing = false, capture_invalid = false;
  std::vector<std::function<void()>> pending, captured;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace hostrun {
namespace {

constexpr size_t kGuard = 4096;
constexpr unsigned char kGuardByte = 0xA7;
constexpr int kMaxOptinShared = 232448;  // an H100/H200's per-block opt-in limit

struct Alloc {
  size_t size = 0;
  int device = -1;  // -1: pinned host memory
};

int env_int(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}

struct State {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;
  std::vector<size_t> used;  // bytes per device
  std::vector<std::unique_ptr<CUstream_st>> default_streams;
  std::vector<CUstream_st*> streams;  // created ones, live
  std::map<const void*, int> opted;
  Counters counters;
  int num_devices = std::max(1, env_int("TROUPE_HOSTRUN_DEVICES", 2));
  int num_sms = std::max(1, env_int("TROUPE_HOSTRUN_SMS", 8));
  size_t memory = size_t(std::max(1, env_int("TROUPE_HOSTRUN_MEMORY_MB", 4096))) << 20;
  State() {
    used.assign(num_devices, 0);
    for (int d = 0; d < num_devices; ++d) {
      default_streams.push_back(std::make_unique<CUstream_st>());
      default_streams.back()->device = d;
    }
  }
};
State& st() {
  static State* s = new State;  // (never destroyed: backends may outlive static destruction order)
  return *s;
}
thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;
thread_local CUstream_st* t_capturing = nullptr;  // the stream this thread captures into

CUstream_st* resolve(cudaStream_t s) { return s ? s : st().default_streams[t_device].get(); }

// The allocation holding [p, p + bytes), or nullptr.
const std::pair<const uintptr_t, Alloc>* find(const void* p, size_t bytes) {
  auto& a = st().allocs;
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = a.upper_bound(u);
  if (it == a.begin()) return nullptr;
  --it;
  if (u + bytes > it->first + it->second.size || u < it->first) return nullptr;
  return &*it;
}

// Whether every guard zone is intact; a broken one is described and restored (the error
// is the synchronization's, not every later one's: tests go on in the same process).
bool guards_intact_locked(std::string* which) {
  bool intact = true;
  for (const auto& [base, al] : st().allocs) {
    auto* g = reinterpret_cast<unsigned char*>(base + al.size);
    for (size_t i = 0; i < kGuard; ++i)
      if (g[i] != kGuardByte) {
        if (intact)
          *which = "a write past the end of a " + std::to_string(al.size) + "-byte " +
                   (al.device < 0 ? std::string("pinned host") : "device " + std::to_string(al.device)) +
                   " allocation (byte " + std::to_string(i) + " after it)";
        intact = false;
        std::memset(g, kGuardByte, kGuard);
        break;
      }
  }
  return intact;
}

// Runs a stream's queued work, then checks the guard zones.
cudaError_t drain(CUstream_st* s) {
  std::vector<std::function<void()>> ops;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    ops.swap(s->pending);
  }
  for (auto& op : ops) op();
  std::lock_guard<std::mutex> lock(st().mu);
  ++st().counters.syncs;
  std::string which;
  if (guards_intact_locked(&which)) return cudaSuccess;
  std::fprintf(stderr, "hostrun: illegal address: %s\n", which.c_str());
  return cudaErrorIllegalAddress;
}

cudaError_t drain_device(int device) {
  std::vector<CUstream_st*> ss;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    ss.push_back(st().default_streams[device].get());
    for (auto* s : st().streams)
      if (s->device == device) ss.push_back(s);
  }
  cudaError_t e = cudaSuccess;
  for (auto* s : ss)
    if (cudaError_t r = drain(s); r != cudaSuccess) e = r;
  return e;
}

// A call a GPU refuses while this thread captures: fails it and the capture.
bool refused_in_capture() {
  if (!t_capturing) return false;
  t_capturing->capture_invalid = true;
  return true;
}

cudaError_t fail(cudaError_t e) {
  t_last = e;
  return e;
}

void* raw_alloc(size_t bytes) {
  void* p = std::aligned_alloc(256, (bytes + kGuard + 255) / 256 * 256);
  if (p) std::memset(static_cast<unsigned char*>(p) + bytes, kGuardByte, kGuard);
  return p;
}

}  // namespace

void enqueue(cudaStream_t stream, std::function<void()> op) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(st().mu);
  (s->capturing ? s->captured : s->pending).push_back(std::move(op));
}
void launch_failed(cudaError_t e, const std::string& why) {
  std::fprintf(stderr, "hostrun: launch refused: %s\n", why.c_str());
  if (t_capturing) t_capturing->capture_invalid = true;
  t_last = e;
}
bool device_pointer_ok(const void* p, int device, std::string* why) {
  if (!p) return true;
  std::lock_guard<std::mutex> lock(st().mu);
  const auto* a = find(p, 0);
  if (!a) {
    *why = "points outside every device and pinned allocation (pageable host memory or freed)";
    return false;
  }
  if (a->second.device >= 0 && a->second.device != device) {
    *why = "points into device " + std::to_string(a->second.device) + "'s memory from a launch on device " +
           std::to_string(device);
    return false;
  }
  return true;
}
int stream_device(cudaStream_t stream) { return resolve(stream)->device; }
int current_device() { return t_device; }
int opted_shared_bytes(const void* kernel) {
  std::lock_guard<std::mutex> lock(st().mu);
  auto it = st().opted.find(kernel);
  return it == st().opted.end() ? 0 : it->second;
}
Counters counters() {
  std::lock_guard<std::mutex> lock(st().mu);
  Counters c = st().counters;
  c.live_allocations = st().allocs.size();
  return c;
}
void set_device_count(int n) {
  std::lock_guard<std::mutex> lock(st().mu);
  while (st().num_devices < n) {
    st().used.push_back(0);
    st().default_streams.push_back(std::make_unique<CUstream_st>());
    st().default_streams.back()->device = st().num_devices++;
  }
}
void note_kernel() {
  std::lock_guard<std::mutex> lock(st().mu);
  ++st().counters.kernel_launches;
}

}  // namespace hostrun

using hostrun::fail;
using hostrun::st;

// ---- devices ----

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  *count = st().num_devices;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaSetDevice(int device) {
  if (device < 0 || device >= st().num_devices) return fail(cudaErrorInvalidDevice);
  hostrun::t_device = device;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = hostrun::t_device;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= st().num_devices) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "host-run emulation");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = st().memory;
  prop->multiProcessorCount = st().num_sms;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = hostrun::kMaxOptinShared;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= st().num_devices) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = st().num_sms;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = hostrun::kMaxOptinShared;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue);  // (add what the backend comes to ask)
  }
}
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > hostrun::kMaxOptinShared) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(st().mu);
  st().opted[func] = value;
  return cudaSuccess;
}

// ---- errors ----

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "unrecognized error code (host-run)";
  }
}
cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t e = hostrun::t_last;
  hostrun::t_last = cudaSuccess;
  return e;
}

// ---- memory ----

cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(st().mu);
  const int d = hostrun::t_device;
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  if (st().used[d] + size > st().memory) return fail(cudaErrorMemoryAllocation);
  void* p = hostrun::raw_alloc(size);
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xCD, size);  // (device memory starts as garbage: nothing may rely on zeros)
  st().allocs[reinterpret_cast<uintptr_t>(p)] = {size, d};
  st().used[d] += size;
  *devPtr = p;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t size) {
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  void* p = hostrun::raw_alloc(std::max<size_t>(size, 1));
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(st().mu);
  st().allocs[reinterpret_cast<uintptr_t>(p)] = {std::max<size_t>(size, 1), -1};
  *ptr = p;
  return cudaSuccess;
}
namespace {
cudaError_t free_alloc(void* p, bool pinned) {
  if (!p) return cudaSuccess;
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(st().mu);
    auto it = st().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == st().allocs.end() || (it->second.device < 0) != pinned) return fail(cudaErrorInvalidValue);
    device = it->second.device;
  }
  // Freeing synchronizes the device (pinned memory: every device).
  cudaError_t e = cudaSuccess;
  for (int d = 0; d < st().num_devices; ++d)
    if (d == device || device < 0)
      if (cudaError_t r = hostrun::drain_device(d); r != cudaSuccess) e = r;
  std::lock_guard<std::mutex> lock(st().mu);
  auto it = st().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (device >= 0) st().used[device] -= it->second.size;
  st().allocs.erase(it);
  std::free(p);
  return e;
}
}  // namespace
cudaError_t CUDARTAPI cudaFree(void* devPtr) { return free_alloc(devPtr, false); }
cudaError_t CUDARTAPI cudaFreeHost(void* ptr) { return free_alloc(ptr, true); }

namespace {
// Where a copy's side lies: in a device allocation (its device), pinned memory (-1) or
// pageable memory (-2); -3: it straddles or overruns an allocation.
int where(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(st().mu);
  if (const auto* a = hostrun::find(p, bytes)) return a->second.device;
  // Not wholly inside one: pageable only if it touches no allocation at all.
  if (hostrun::find(p, 0) || hostrun::find(static_cast<const char*>(p) + bytes - 1, 0)) return -3;
  return -2;
}
bool device_side(enum cudaMemcpyKind kind, bool dst) {
  return kind == cudaMemcpyDeviceToDevice || (dst ? kind == cudaMemcpyHostToDevice : kind == cudaMemcpyDeviceToHost);
}
// The copy's sides checked against its kind; the device's stream for device sides.
cudaError_t check_copy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, int* wd, int* ws) {
  *wd = where(dst, count);
  *ws = where(src, count);
  auto bad = [&](int w, bool dev_side, const char* what) {
    if (w == -3 || (dev_side && w < 0) || (!dev_side && w >= 0 && kind != cudaMemcpyDefault)) {
      std::fprintf(stderr, "hostrun: cudaMemcpy of %zu bytes: the %s is %s\n", count, what,
                   w == -3    ? "not inside one allocation"
                   : dev_side ? "not device memory"
                              : "device memory");
      return true;
    }
    return false;
  };
  if (kind != cudaMemcpyDefault &&
      (bad(*wd, device_side(kind, true), "destination") || bad(*ws, device_side(kind, false), "source")))
    return cudaErrorInvalidValue;
  if (*wd == -3 || *ws == -3) return cudaErrorInvalidValue;
  return cudaSuccess;
}
}  // namespace

// The synchronous copy and memset go through the legacy stream (the device's default
// stream here), which a non-blocking stream does not wait for. As CUDA documents them: a
// copy to host memory first waits for the legacy stream's earlier work and returns done;
// one from pinned host memory is done on return; one from pageable host memory returns once
// the source is staged (a snapshot) and, like a device-to-device copy or a memset of device
// memory, lands in the legacy stream's order -- here only when that stream is next
// synchronized (cudaStreamSynchronize(0), a device-wide sync, a free, a copy to the host),
// so work on another stream that relies on it sees the memory as it was.
cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  int wd, ws;
  if (cudaError_t e = check_copy(dst, src, count, kind, &wd, &ws); e != cudaSuccess) return fail(e);
  CUstream_st* legacy = hostrun::resolve(nullptr);
  if (wd < 0) {  // to host memory
    if (cudaError_t e = hostrun::drain(legacy); e != cudaSuccess) return fail(e);
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  if (ws == -1) {  // from pinned memory: synchronous
    if (cudaError_t e = hostrun::drain(legacy); e != cudaSuccess) return fail(e);
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  if (ws >= 0) {  // device to device: read when it runs
    hostrun::enqueue(nullptr, [dst, src, count] { std::memmove(dst, src, count); });
    return cudaSuccess;
  }
  auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                             static_cast<const unsigned char*>(src) + count);
  hostrun::enqueue(nullptr, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  int wd, ws;
  if (cudaError_t e = check_copy(dst, src, count, kind, &wd, &ws); e != cudaSuccess) return fail(e);
  CUstream_st* s = hostrun::resolve(stream);
  const bool pageable = wd == -2 || ws == -2;
  if (pageable && s->capturing) {
    std::fprintf(stderr, "hostrun: a captured copy from or to pageable memory\n");
    s->capture_invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (ws == -2) {
    // From pageable memory the call returns once the source is staged: a snapshot now.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    hostrun::enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  hostrun::enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); });
  if (wd == -2) return hostrun::drain(s);  // to pageable memory: returns when done
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemset(void* devPtr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  if (where(devPtr, count) < 0) return fail(cudaErrorInvalidValue);
  hostrun::enqueue(nullptr, [devPtr, value, count] { std::memset(devPtr, value, count); });  // (legacy stream, above)
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (where(devPtr, count) < 0) return fail(cudaErrorInvalidValue);
  if (hostrun::resolve(stream)->capturing) {  // (a memset node on a GPU; the backend records none)
    std::fprintf(stderr, "hostrun: a captured cudaMemsetAsync\n");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  hostrun::enqueue(stream, [devPtr, value, count] { std::memset(devPtr, value, count); });
  return cudaSuccess;
}

// ---- streams and graphs ----

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  auto* s = new CUstream_st;
  s->device = hostrun::t_device;
  std::lock_guard<std::mutex> lock(st().mu);
  st().streams.push_back(s);
  *pStream = s;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  hostrun::drain(stream);
  std::lock_guard<std::mutex> lock(st().mu);
  auto& v = st().streams;
  auto it = std::find(v.begin(), v.end(), stream);
  if (it == v.end()) return fail(cudaErrorInvalidResourceHandle);
  v.erase(it);
  delete stream;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceSynchronize() { return hostrun::drain_device(hostrun::t_device); }
// Events (troupe_gpu_bench's burst timings): an event is recorded when the work queued on
// its stream before it has run here, so the time between two spans the work between them.
struct CUevent_st {
  double t = 0;
};
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (hostrun::refused_in_capture()) return fail(cudaErrorStreamCaptureUnsupported);
  if (cudaError_t e = hostrun::drain(hostrun::resolve(stream)); e != cudaSuccess) return fail(e);
  event->t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = static_cast<float>((end->t - start->t) * 1e3);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = hostrun::resolve(stream);
  if (s->capturing || hostrun::t_capturing) {
    if (hostrun::t_capturing) hostrun::t_capturing->capture_invalid = true;
    s->capture_invalid = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return hostrun::drain(s);
}
cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (!stream) return fail(cudaErrorStreamCaptureUnsupported);  // (not the legacy stream)
  if (stream->capturing) return fail(cudaErrorIllegalState);
  stream->capturing = true;
  stream->capture_invalid = false;
  stream->captured.clear();
  if (mode != cudaStreamCaptureModeRelaxed) hostrun::t_capturing = stream;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (!stream || !stream->capturing) return fail(cudaErrorIllegalState);
  stream->capturing = false;
  if (hostrun::t_capturing == stream) hostrun::t_capturing = nullptr;
  if (stream->capture_invalid) {
    *pGraph = nullptr;
    stream->captured.clear();
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  auto* g = new CUgraph_st;
  g->ops.swap(stream->captured);
  *pGraph = g;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  if (!graph) return fail(cudaErrorInvalidValue);
  auto* e = new CUgraphExec_st;
  e->ops = graph->ops;
  *pGraphExec = e;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  if (!graphExec) return fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(st().mu);
    ++st().counters.graph_launches;
  }
  for (const auto& op : graphExec->ops) hostrun::enqueue(stream, op);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  delete graphExec;
  return cudaSuccess;
}

// ---- cuBLAS (the GEMMs the backend asks for, column-major, f32 accumulation) ----

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS (host-run: unknown)";
  }
}
namespace {
float load_elem(const void* p, cudaDataType t, size_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default:
      return 0.f;
  }
}
void store_elem(void* p, cudaDataType t, size_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(p)[i] = v;
      break;
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    default:
      break;
  }
}
size_t elem_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
// A column-major operand of `rows` x `cols` (before op) with leading dimension ld, inside one
// allocation of the handle's device.
bool operand_ok(const void* p, cudaDataType t, int rows, int cols, int ld, int device) {
  if (ld < std::max(1, rows)) return false;
  const size_t bytes = (size_t(cols - 1) * ld + rows) * elem_bytes(t);
  std::lock_guard<std::mutex> lock(st().mu);
  const auto* a = hostrun::find(p, bytes);
  return a && a->second.device == device;
}
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, float beta,
                    void* C, cudaDataType ct, int ldc) {
  auto supported = [](cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; };
  if (!supported(at) || !supported(bt) || !supported(ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const int dev = hostrun::stream_device(h->stream);
  const bool an = ta == CUBLAS_OP_N, bn = tb == CUBLAS_OP_N;
  if (!operand_ok(A, at, an ? m : k, an ? k : m, lda, dev) || !operand_ok(B, bt, bn ? k : n, bn ? n : k, ldb, dev) ||
      !operand_ok(C, ct, m, n, ldc, dev)) {
    std::fprintf(stderr, "hostrun: cublas GEMM %dx%dx%d: an operand is outside its allocation or device\n", m, n, k);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  hostrun::enqueue(h->stream, [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float s = 0.f;
        for (int p = 0; p < k; ++p)
          s = std::fma(load_elem(A, at, an ? size_t(i) + size_t(p) * lda : size_t(p) + size_t(i) * lda),
                       load_elem(B, bt, bn ? size_t(p) + size_t(j) * ldb : size_t(j) + size_t(p) * ldb), s);
        const size_t ci = size_t(i) + size_t(j) * ldc;
        store_elem(C, ct, ci, alpha * s + (beta != 0.f ? beta * load_elem(C, ct, ci) : 0.f));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace
cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                           int m, int n, int k, const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, CUDA_R_32F,
              ldc);
}
cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                                         cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  if (computeType != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), A, Atype, lda, B, Btype, ldb,
              *static_cast<const float*>(beta), C, Ctype, ldc);
}
