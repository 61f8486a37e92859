// The demo stack's GPU extension: one source for AMD (hipcc) and NVIDIA (nvcc).
#include "portable.h"
#include "version.h"

__global__ void scale_add(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

extern "C" int demo_kernels_version() { return DEMO_KERNELS_VERSION; }

// y += a * x on the GPU; returns 0, or -1 when no GPU runtime is available.
extern "C" int demo_scale_add(float a, const float* x, float* y, int n) {
  float *dx, *dy;
  if (gpuMalloc((void**)&dx, n * sizeof(float)) != 0) return -1;
  if (gpuMalloc((void**)&dy, n * sizeof(float)) != 0) { gpuFree(dx); return -1; }
  gpuMemcpy(dx, x, n * sizeof(float), gpuMemcpyHostToDevice);
  gpuMemcpy(dy, y, n * sizeof(float), gpuMemcpyHostToDevice);
  scale_add<<<(n + 255) / 256, 256>>>(a, dx, dy, n);
  gpuDeviceSynchronize();
  gpuMemcpy(y, dy, n * sizeof(float), gpuMemcpyDeviceToHost);
  gpuFree(dx);
  gpuFree(dy);
  return 0;
}
