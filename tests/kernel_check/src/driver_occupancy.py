"""Ask the CUDA driver (on a machine with an sm_90 GPU) for each kernel's attributes and occupancy.

Usage: python driver_occupancy.py CUBIN NAMES_FILE [DYNAMIC_SHARED] > CUBIN.driver.txt
NAMES_FILE is the cubin's cuobjdump --dump-resource-usage output (its "Function NAME:" lines).
Output lines: NAME BLOCK ACTIVE_BLOCKS ACTIVE_WARPS NUM_REGS LOCAL_SIZE_BYTES SHARED_SIZE_BYTES MAX_THREADS
for block sizes 32..1024 step 32 (ACTIVE_BLOCKS 0 above MAX_THREADS).
"""

import ctypes
import re
import sys
from pathlib import Path

cuda = ctypes.CDLL("libcuda.so.1")


def check(status: int, what: str) -> None:
    if status != 0:
        sys.exit(f"{what} failed with CUresult {status}")


image = Path(sys.argv[1]).read_bytes()
names = re.findall(r"Function ([^:\s]+):", Path(sys.argv[2]).read_text())
dynamic = int(sys.argv[3]) if len(sys.argv) > 3 else 0
check(cuda.cuInit(0), "cuInit")
dev, ctx, mod = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)), "cuModuleLoadData")
for name in names:
    fn = ctypes.c_void_p()
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction {name}")
    attrs = []
    for attr in (4, 3, 1, 0):  # NUM_REGS, LOCAL_SIZE_BYTES, SHARED_SIZE_BYTES, MAX_THREADS_PER_BLOCK
        value = ctypes.c_int()
        check(cuda.cuFuncGetAttribute(ctypes.byref(value), attr, fn), "cuFuncGetAttribute")
        attrs.append(value.value)
    for block in range(32, 1025, 32):
        blocks = ctypes.c_int(0)
        if block <= attrs[3]:
            check(
                cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), fn, block, dynamic),
                "occ",
            )
        print(name, block, blocks.value, blocks.value * block // 32, *attrs)
