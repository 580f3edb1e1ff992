// Force-included (-include) in every translation unit of the host-run CUDA backend
// (tests/hostrun/README.md): its objects live beside the real CUDA backend in one binary,
// so the CUDA runtime and cuBLAS entry points it calls, the backend's factory and the
// kernels' namespace get other names here. The real headers' declarations are renamed
// too, so the fakes in runtime.cpp are declared with the toolkit's exact signatures.
#pragma once

#define cuda cuda_hostrun  // namespace troupe::cuda
#define make_cuda_backend hostrun_make_cuda_backend
#define cuda_unavailable_reason hostrun_cuda_unavailable_reason

#define cudaDeviceGetAttribute hostrun_cudaDeviceGetAttribute
#define cudaDeviceSynchronize hostrun_cudaDeviceSynchronize
#define cudaDriverGetVersion hostrun_cudaDriverGetVersion
#define cudaRuntimeGetVersion hostrun_cudaRuntimeGetVersion
#define cudaEventCreate hostrun_cudaEventCreate
#define cudaEventDestroy hostrun_cudaEventDestroy
#define cudaEventElapsedTime hostrun_cudaEventElapsedTime
#define cudaEventRecord hostrun_cudaEventRecord
#define cudaEventSynchronize hostrun_cudaEventSynchronize
#define cudaFree hostrun_cudaFree
#define cudaFreeHost hostrun_cudaFreeHost
#define cudaFuncSetAttribute hostrun_cudaFuncSetAttribute
#define cudaGetDevice hostrun_cudaGetDevice
#define cudaGetDeviceCount hostrun_cudaGetDeviceCount
#define cudaGetDeviceProperties hostrun_cudaGetDeviceProperties
#define cudaGetErrorString hostrun_cudaGetErrorString
#define cudaGetLastError hostrun_cudaGetLastError
#define cudaGraphDestroy hostrun_cudaGraphDestroy
#define cudaGraphExecDestroy hostrun_cudaGraphExecDestroy
#define cudaGraphInstantiate hostrun_cudaGraphInstantiate
#define cudaGraphLaunch hostrun_cudaGraphLaunch
#define cudaMalloc hostrun_cudaMalloc
#define cudaMallocHost hostrun_cudaMallocHost
#define cudaMemcpy hostrun_cudaMemcpy
#define cudaMemcpyAsync hostrun_cudaMemcpyAsync
#define cudaMemset hostrun_cudaMemset
#define cudaMemsetAsync hostrun_cudaMemsetAsync
#define cudaSetDevice hostrun_cudaSetDevice
#define cudaStreamBeginCapture hostrun_cudaStreamBeginCapture
#define cudaStreamCreate hostrun_cudaStreamCreate
#define cudaStreamCreateWithFlags hostrun_cudaStreamCreateWithFlags
#define cudaStreamDestroy hostrun_cudaStreamDestroy
#define cudaStreamEndCapture hostrun_cudaStreamEndCapture
#define cudaStreamSynchronize hostrun_cudaStreamSynchronize

#define cublasCreate_v2 hostrun_cublasCreate_v2
#define cublasDestroy_v2 hostrun_cublasDestroy_v2
#define cublasSetStream_v2 hostrun_cublasSetStream_v2
#define cublasGetStatusString hostrun_cublasGetStatusString
#define cublasSgemm_v2 hostrun_cublasSgemm_v2
#define cublasGemmEx hostrun_cublasGemmEx
