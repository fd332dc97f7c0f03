// Kernels for the kernel-resource checker's fixtures: each one stresses one resource.
#include "hip_common.h"

// Few registers, no scratch, no LDS.
extern "C" __global__ LAUNCH_BOUNDS(256) void saxpy(float *y, const float *x, float a, int n) {
  int i = BID() * 256 + TID();
  if (i < n) y[i] = a * x[i] + y[i];
}

// N independent accumulators kept live across a loop: register pressure grows with N.
template <int N>
__device__ void many_live(float *out, const float *in, int n) {
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = in[TID() + k];
  for (int j = 0; j < n; ++j) {
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = acc[k] * in[j + k] + acc[(k + 1) % N];
  }
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k) s += acc[k] * (float)(k + 1);
  out[BID() * 1024 + TID()] = s;
}

// About 160 VGPRs with a 256-thread bound: fits without spilling.
__global__ LAUNCH_BOUNDS(256) void regs_n160_lb256(float *out, const float *in, int n) {
  many_live<160>(out, in, n);
}

// About 256 live values with the default 1024-thread bound: must spill.
__global__ void regs_n256_lb1024(float *out, const float *in, int n) { many_live<256>(out, in, n); }

// 768-thread bound: the occupancy model of LLVM 19 and 22 differ here.
__global__ LAUNCH_BOUNDS(768) void regs_n48_lb768(float *out, const float *in, int n) {
  many_live<48>(out, in, n);
}

// Static LDS of 40 KiB.
__global__ LAUNCH_BOUNDS(256) void lds_big_40k(float *out, const float *in) {
  __shared__ float tile[10240];
  for (int i = TID(); i < 10240; i += 256) tile[i] = in[BID() * 10240 + i];
  SYNC();
  out[BID() * 256 + TID()] = tile[(TID() * 37) % 10240] + tile[10239 - TID()];
}

// A private array indexed at run time: lives in scratch.
__global__ LAUNCH_BOUNDS(128) void scratch_array(float *out, const int *idx, const float *in) {
  float buf[96];
  for (int i = 0; i < 96; ++i) buf[i] = in[i * 128 + TID()];
  out[BID() * 128 + TID()] = buf[idx[TID()] % 96] + buf[idx[TID() + 128] % 96];
}

// A kernel in a version-stamped namespace; the clang-22 build stamps it gufo_v2 (-DKERNRES_NS=gufo_v2), so
// compare must match the two builds' kernels across the stamp.
#ifndef KERNRES_NS
#define KERNRES_NS gufo_v1
#endif
namespace KERNRES_NS {
__global__ LAUNCH_BOUNDS(64) void ns_versioned(float *y, float a) { y[BID() * 64 + TID()] += a; }
}  // namespace KERNRES_NS

#if defined(__gfx942__) || defined(__gfx90a__)
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
// Matrix-core accumulators live in AGPRs on CDNA.
__global__ LAUNCH_BOUNDS(256) void mfma_agpr_acc(f32x16 *out, const f16x4 *a, const f16x4 *b, int n) {
  f32x16 c0 = {}, c1 = {}, c2 = {}, c3 = {};
  for (int k = 0; k < n; ++k) {
    f16x4 va = a[k * 64 + TID()], vb = b[k * 64 + TID()];
    c0 = __builtin_amdgcn_mfma_f32_32x32x8f16(va, vb, c0, 0, 0, 0);
    c1 = __builtin_amdgcn_mfma_f32_32x32x8f16(vb, va, c1, 0, 0, 0);
    c2 = __builtin_amdgcn_mfma_f32_32x32x8f16(va, va, c2, 0, 0, 0);
    c3 = __builtin_amdgcn_mfma_f32_32x32x8f16(vb, vb, c3, 0, 0, 0);
  }
  out[TID()] = c0 + c1 + c2 + c3;
}
#endif
