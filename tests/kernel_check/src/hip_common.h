// Minimal HIP vocabulary for building without the ROCm headers (-nogpuinc -nogpulib).
#pragma once
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define TID() ((int)__builtin_amdgcn_workitem_id_x())
#define BID() ((int)__builtin_amdgcn_workgroup_id_x())
#define SYNC() __builtin_amdgcn_s_barrier()

#if !defined(__HIP_DEVICE_COMPILE__)
// What the host-side stubs of a HIP compile need to be declared.
struct dim3 {
  unsigned x, y, z;
};
typedef struct ihipStream_t *hipStream_t;
extern "C" int hipLaunchKernel(const void *f, dim3 grid, dim3 block, void **args, unsigned long shmem,
                               hipStream_t stream);
#endif
