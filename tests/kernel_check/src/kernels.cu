// CUDA kernels for the kernel-resource checker's fixtures: each one stresses one resource.

// Few registers, no stack, no shared memory.
extern "C" __global__ void cu_saxpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// 96 independent accumulators kept live: about 100 registers, spills under -maxrregcount=32.
__global__ void cu_regs_n96_free(float *out, const float *in, int n) {
  float acc[96];
#pragma unroll
  for (int k = 0; k < 96; ++k) acc[k] = in[threadIdx.x + k];
  for (int j = 0; j < n; ++j) {
#pragma unroll
    for (int k = 0; k < 96; ++k) acc[k] = acc[k] * in[j + k] + acc[(k + 1) % 96];
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 96; ++k) s += acc[k] * (float)(k + 1);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// 16 KiB of static shared memory.
__global__ void __launch_bounds__(128) cu_smem_tile(float *out, const float *in) {
  __shared__ float tile[4096];
  for (int i = threadIdx.x; i < 4096; i += 128) tile[i] = in[blockIdx.x * 4096 + i];
  __syncthreads();
  out[blockIdx.x * 128 + threadIdx.x] = tile[(threadIdx.x * 37) % 4096] + tile[4095 - threadIdx.x];
}

// A local array indexed at run time: a stack frame.
__global__ void __launch_bounds__(256) cu_local_array(float *out, const int *idx, const float *in) {
  float buf[64];
  for (int i = 0; i < 64; ++i) buf[(idx[i] + i) & 63] = in[i * 256 + threadIdx.x];
  out[blockIdx.x * 256 + threadIdx.x] = buf[idx[threadIdx.x] % 64] + buf[idx[threadIdx.x + 256] % 64];
}

// A non-inlined callee with its own stack.
__device__ __noinline__ float cu_helper_stack(const int *idx, int a, int b) {
  int buf[48];
  for (int i = 0; i < 48; ++i) buf[i] = idx[i] * a + b;
  return (float)buf[(a ^ b) % 48];
}

__global__ void __launch_bounds__(512, 2) cu_call_stack(float *out, const int *idx, int n) {
  out[threadIdx.x] = cu_helper_stack(idx, threadIdx.x, n);
}
