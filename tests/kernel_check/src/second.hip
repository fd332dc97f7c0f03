// A second translation unit, so that a linked library holds two bundles in .hip_fatbin.
#include "hip_common.h"

extern "C" __global__ LAUNCH_BOUNDS(64) void second_tu_scale(float *y, float a) {
  y[BID() * 64 + TID()] *= a;
}
