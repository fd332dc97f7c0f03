// Occupancy oracle: NVIDIA's cuda_occupancy.h, fed with ptxas's numbers.
// stdin:  lines "ARCH NAME REGS STATIC_SMEM MAX_THREADS BARRIERS" (MAX_THREADS 0 = no launch bound)
// stdout: lines "NAME BLOCK_SIZE ACTIVE_BLOCKS ACTIVE_WARPS" for block sizes 32..1024 step 32.
#include <climits>
#include <cstdio>
#include <cstring>

#include "cuda_occupancy.h"

// Device properties from the CUDA C++ Programming Guide's compute-capability tables.
static bool device(const char *arch, cudaOccDeviceProp *p) {
  p->regsPerBlock = 65536;
  p->regsPerMultiprocessor = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = 48 * 1024;
  p->reservedSharedMemPerBlock = 1024;
  p->numSms = 1;
  if (!strcmp(arch, "sm_80")) {
    p->computeMajor = 8, p->computeMinor = 0, p->maxThreadsPerMultiprocessor = 2048;
    p->sharedMemPerMultiprocessor = 164 * 1024, p->sharedMemPerBlockOptin = 163 * 1024;
  } else if (!strcmp(arch, "sm_86") || !strcmp(arch, "sm_89")) {
    p->computeMajor = 8, p->computeMinor = arch[4] - '0', p->maxThreadsPerMultiprocessor = 1536;
    p->sharedMemPerMultiprocessor = 100 * 1024, p->sharedMemPerBlockOptin = 99 * 1024;
  } else if (!strcmp(arch, "sm_90")) {
    p->computeMajor = 9, p->computeMinor = 0, p->maxThreadsPerMultiprocessor = 2048;
    p->sharedMemPerMultiprocessor = 228 * 1024, p->sharedMemPerBlockOptin = 227 * 1024;
  } else {
    return false;
  }
  return true;
}

int main() {
  char arch[32], name[512];
  int regs, smem, maxThreads, barriers;
  while (scanf("%31s %511s %d %d %d %d", arch, name, &regs, &smem, &maxThreads, &barriers) == 6) {
    cudaOccDeviceProp prop;
    if (!device(arch, &prop)) return 2;
    cudaOccFuncAttributes attr;
    attr.maxThreadsPerBlock = maxThreads > 0 ? maxThreads : INT_MAX;
    attr.numRegs = regs;
    attr.sharedSizeBytes = smem;
    attr.numBlockBarriers = barriers;
    cudaOccDeviceState state;
    for (int block = 32; block <= 1024; block += 32) {
      cudaOccResult result;
      if (cudaOccMaxActiveBlocksPerMultiprocessor(&result, &prop, &attr, &state, block, 0) != CUDA_OCC_SUCCESS)
        result.activeBlocksPerMultiprocessor = 0;
      int blocks = result.activeBlocksPerMultiprocessor;
      printf("%s %d %d %d\n", name, block, blocks, blocks * (block / 32));
    }
  }
  return 0;
}
