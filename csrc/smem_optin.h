// Host helper of the fused libraries: a kernel's dynamic shared-memory limit, raised once per (kernel, device).
#pragma once
#include <cuda_runtime.h>
#include <mutex>

// Sets kernel fn's cudaFuncAttributeMaxDynamicSharedMemorySize on the current device to the most a block of it can
// have there (the device's opt-in maximum per block less fn's static shared memory), once per (kernel, device) in the
// process.  Why that value and not the call's own size: the attribute belongs to the function, for every host thread,
// so a thread setting its smaller size between another thread's set and launch made that launch fail (invalid
// argument); every set here writes the same value, so concurrent sets cannot lower it.  The attribute is only an
// upper bound: each launch still asks for its own size, and occupancy queries take that size.  The record is
// process-wide under a mutex and written only after a successful set, so a thread that finds its entry launches
// under the raised limit.  Returns cudaSuccess or the error of the call that failed.
inline cudaError_t ff_smem_optin(const void* fn) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  struct Entry { const void* fn; int dev; };
  constexpr int CAP = 512;   // (kernel, device) pairs recorded; past it every call sets the (same) value again
  static std::mutex mu;
  static Entry done[CAP];
  static int used = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < used; ++i)
    if (done[i].fn == fn && done[i].dev == dev) return cudaSuccess;
  int optin = 0;
  if ((e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) return e;
  cudaFuncAttributes fa{};
  if ((e = cudaFuncGetAttributes(&fa, fn)) != cudaSuccess) return e;
  e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes);
  if (e != cudaSuccess) return e;
  if (used < CAP) done[used++] = Entry{fn, dev};
  return cudaSuccess;
}
