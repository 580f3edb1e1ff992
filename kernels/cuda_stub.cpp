// The CUDA backend's entry points in a build without CUDA (no nvcc when configured).
#include "kernels/backend.h"

#ifndef TROUPE_HAS_CUDA
namespace troupe {

std::string cuda_unavailable_reason() {
  return "this build has no CUDA backend (nvcc was not found at configure time)";
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions&) {
  return make_error("--device cuda: " + cuda_unavailable_reason());
}

}  // namespace troupe
#endif
