#!/usr/bin/env bash
# Rebuild the kernel-resource fixtures from tests/kernel_check/src and store the compilers' own numbers
# beside them (the tests' expected values). CI does not run this: the outputs are committed.
#
# Needs: clang-19 and clang-22 (Debian packages clang-NN lld-NN llvm-NN clang-tools-NN), nvcc (CUDA 13),
# cuobjdump (PyPI: nvidia-cuda-cuobjdump), a C++ compiler, python3 and a Python with `triton` (PyPI; it
# compiles for GPUs on the CPU). Override the tool names with CLANG19, CLANG22, BUNDLER19, BUNDLER22,
# LLD_LINK, READOBJ, OBJCOPY, NVCC, CUOBJDUMP, CXX, PYTHON, TRITON_PYTHON; CUDA_HOME locates cuda_occupancy.h.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src="$here/src"
out="$here/fixtures"
CLANG19="${CLANG19:-clang-19}"
CLANG22="${CLANG22:-clang-22}"
BUNDLER19="${BUNDLER19:-clang-offload-bundler-19}"
BUNDLER22="${BUNDLER22:-clang-offload-bundler-22}"
LLD_LINK="${LLD_LINK:-lld-link-19}"
READOBJ="${READOBJ:-llvm-readobj-19}"
NVCC="${NVCC:-nvcc}"
CUOBJDUMP="${CUOBJDUMP:-cuobjdump}"
CXX="${CXX:-c++}"
PYTHON="${PYTHON:-python3}"
TRITON_PYTHON="${TRITON_PYTHON:-python3}" # a Python with the `triton` package

# fixtures/driver/ (the CUDA driver's numbers, measured on a GPU by src/driver_occupancy.py) is kept.
rm -rf "$out/hip" "$out/cuda" "$out/triton"
mkdir -p "$out/hip" "$out/cuda"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$src"/* "$work/"
cd "$work"

# clang-22 builds put one kernel in namespace gufo_v2 instead of gufo_v1 (a version-stamped name).
ns22=-DKERNRES_NS=gufo_v2
hipflags=(-x hip -nogpuinc -nogpulib -O3 -cuid=kernres) # a fixed CUID keeps rebuilds byte-identical

# Keep only the remark lines, without source paths: "Function Name: K", "VGPRs: N", ...
remarks() { grep 'remark:' | sed -e 's/^.*remark: *//' -e 's/ *\[-Rpass-analysis=kernel-resource-usage\]$//'; }
# Kernel metadata fields that the remarks do not print, from llvm-readobj (an independent reader).
notes() { # one "-" line per kernel map, then its kernel-level keys (4-space indent in readobj's YAML)
  "$READOBJ" --notes "$1" | awk '/^  - \./{print "-"} /^(  - |    )\.(name|wavefront_size|max_flat_workgroup_size|vgpr_count|agpr_count|sgpr_count|private_segment_fixed_size|group_segment_fixed_size|vgpr_spill_count|sgpr_spill_count):/{sub(/^ *-? */, ""); print}'
}

# One code object per (compiler, target): the single-target builds everything else is checked against.
hsaco() { # compiler-tag compiler arch [extra flags...]
  local tag="$1" cc="$2" target="$3"
  shift 3
  local arch="${target%%:*}" name="kernels.$tag.$target"
  name="${name//:/.}"
  "$cc" "${hipflags[@]}" --offload-arch="$arch" "$@" --offload-device-only --no-gpu-bundle-output -c kernels.hip \
    -o "$out/hip/$name.hsaco" -Rpass-analysis=kernel-resource-usage 2>&1 | remarks >"$out/hip/$name.remarks.txt"
  notes "$out/hip/$name.hsaco" >"$out/hip/$name.notes.txt"
}
for t in gfx1151 gfx1100 gfx942; do
  hsaco clang19 "$CLANG19" "$t"
  hsaco clang22 "$CLANG22" "$t" "$ns22"
done
hsaco clang19 "$CLANG19" gfx1100:w64 -mwavefrontsize64
hsaco clang22 "$CLANG22" gfx1100:w64 -mwavefrontsize64 "$ns22"
# Code object v4 (clang-19 writes v5 by default, clang-22 v6).
hsaco clang19 "$CLANG19" gfx1151:cov4 -mcode-object-version=4
# A code object without its metadata note: only the kernel descriptors remain.
"${OBJCOPY:-llvm-objcopy-19}" --remove-section=.note "$out/hip/kernels.clang22.gfx1151.hsaco" \
  "$out/hip/nonote.clang22.gfx1151.hsaco"
# The other targets of the occupancy tables, built once.
for t in gfx90a gfx1030 gfx1101 gfx1102 gfx1150 gfx1200 gfx1201; do
  hsaco clang22 "$CLANG22" "$t" "$ns22"
done

# Containers holding some of the builds above (same sources, same flags), listed in a manifest:
# file, compiler tag, then the targets it holds (each must report what kernels.TAG.TARGET.hsaco does).
manifest="$out/hip/containers.txt"
: >"$manifest"
two=(--offload-arch=gfx1151 --offload-arch=gfx942)
"$CLANG19" "${hipflags[@]}" "${two[@]}" --offload-device-only -c kernels.hip -o "$out/hip/bundle.clang19.hipfb"
echo "bundle.clang19.hipfb clang19 gfx1151 gfx942" >>"$manifest"
"$CLANG19" "${hipflags[@]}" "${two[@]}" --offload-device-only --offload-compress -c kernels.hip \
  -o "$out/hip/ccob2.clang19.hipfb"
echo "ccob2.clang19.hipfb clang19 gfx1151 gfx942" >>"$manifest"
"$CLANG22" "${hipflags[@]}" "$ns22" "${two[@]}" --offload-device-only --offload-compress -c kernels.hip \
  -o "$out/hip/ccob3.clang22.hipfb"
echo "ccob3.clang22.hipfb clang22 gfx1151 gfx942" >>"$manifest"
# zlib CCOBs (method 0): clang picks zstd when it has it, so wrap the plain bundle ourselves and
# let clang-offload-bundler prove the result valid by unbundling it.
for v in 2 3; do
  "$PYTHON" - "$out/hip/bundle.clang19.hipfb" "$out/hip/ccob$v-zlib.hipfb" "$v" <<'EOF'
import hashlib, struct, sys, zlib
raw = open(sys.argv[1], "rb").read()
version = int(sys.argv[3])
payload = zlib.compress(raw, 9)
digest = struct.unpack_from("<Q", hashlib.md5(raw).digest())[0]
if version == 2:
    head = b"CCOB" + struct.pack("<HHIIQ", 2, 0, 24 + len(payload), len(raw), digest)
else:
    head = b"CCOB" + struct.pack("<HHQQQ", 3, 0, 32 + len(payload), len(raw), digest)
open(sys.argv[2], "wb").write(head + payload)
EOF
  for arch in gfx1151 gfx942; do
    "$BUNDLER22" --unbundle --type=o --input="$out/hip/ccob$v-zlib.hipfb" \
      --targets="hipv4-amdgcn-amd-amdhsa--$arch" --output="zlib.$arch.o"
    "$BUNDLER22" --unbundle --type=o --input="$out/hip/bundle.clang19.hipfb" \
      --targets="hipv4-amdgcn-amd-amdhsa--$arch" --output="plain.$arch.o"
    cmp "zlib.$arch.o" "plain.$arch.o"
  done
  echo "ccob$v-zlib.hipfb clang19 gfx1151 gfx942" >>"$manifest"
done
# Host objects: .hip_fatbin with one bundle (.o), with two bundles (.so from two translation units),
# and a Windows DLL whose section is called .hip_fat.
"$CLANG19" "${hipflags[@]}" --offload-arch=gfx1100 --offload-arch=gfx1151 -c kernels.hip -o "$out/hip/host.clang19.o"
echo "host.clang19.o clang19 gfx1100 gfx1151" >>"$manifest"
"$CLANG22" "${hipflags[@]}" "$ns22" --offload-arch=gfx942 --offload-compress -fPIC -c kernels.hip -o k22.o
"$CLANG22" "${hipflags[@]}" --offload-arch=gfx942 --offload-compress -fPIC -cuid=second -c second.hip -o s22.o
"$CLANG22" -shared -nostdlib -fuse-ld=lld k22.o s22.o -o "$out/hip/host.clang22.so"
echo "host.clang22.so clang22 gfx942 +second_tu_scale" >>"$manifest"
"$CLANG19" "${hipflags[@]}" --offload-arch=gfx1151 --target=x86_64-pc-windows-msvc -c kernels.hip -o k.obj
"$LLD_LINK" /dll /noentry /nodefaultlib /force:unresolved /Brepro k.obj /out:"$out/hip/host.clang19.dll" >/dev/null 2>&1 || true
rm -f "$out/hip/host.clang19.lib"
test -s "$out/hip/host.clang19.dll"
echo "host.clang19.dll clang19 gfx1151" >>"$manifest"

# CUDA: cubins for sm_80 and sm_90 (one with -maxrregcount=32), a fatbin, and a host object.
cu() { # name nvcc-flags...
  local name="$1"
  shift
  "$NVCC" -O3 -Xptxas -v "$@" kernels.cu -o "$out/cuda/$name" 2>&1 | grep -E '^ptxas|^    ' | grep -v 'Compile time' |
    sed -e 's/ptxas info *: //' >"$out/cuda/$name.ptxas.txt"
}
cu kernels.sm_80.cubin -cubin -arch=sm_80
cu kernels.sm_90.cubin -cubin -arch=sm_90
cu kernels.sm_90.maxrreg32.cubin -cubin -arch=sm_90 -maxrregcount=32
cu kernels.sm_86.cubin -cubin -arch=sm_86
cu kernels.sm_89.cubin -cubin -arch=sm_89
"$NVCC" -O3 -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 kernels.cu \
  -o "$out/cuda/kernels.fatbin"
"$NVCC" -O3 -c -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code='[sm_90,compute_90]' \
  kernels.cu -o "$out/cuda/host.cu.o"
for f in kernels.sm_80.cubin kernels.sm_86.cubin kernels.sm_89.cubin kernels.sm_90.cubin kernels.sm_90.maxrreg32.cubin; do
  {
    "$CUOBJDUMP" --dump-resource-usage "$out/cuda/$f" | grep -E 'Function|REG:'
    # The per-kernel .nv.info attribute sections (launch bounds live there).
    "$CUOBJDUMP" -elf "$out/cuda/$f" | awk '/^\.nv\.info\./{p=1} /^\.nv\.callgraph/{p=0} p'
  } >"$out/cuda/$f.cuobjdump.txt"
done
"$CUOBJDUMP" --list-elf "$out/cuda/host.cu.o" | sed 's/.*ELF file *[0-9]*: *//' >"$out/cuda/host.cu.o.list.txt"

# Occupancy from NVIDIA's own calculator (cuda_occupancy.h), fed with ptxas's numbers.
"$CXX" -O1 -I"${CUDA_HOME:-/usr/local/cuda}/include" occ_oracle.cpp -o occ_oracle
for f in kernels.sm_80.cubin kernels.sm_86.cubin kernels.sm_89.cubin kernels.sm_90.cubin kernels.sm_90.maxrreg32.cubin; do
  "$PYTHON" "$src/ptxas_to_occ_input.py" "$out/cuda/$f.ptxas.txt" "$out/cuda/$f.cuobjdump.txt" | ./occ_oracle \
    >"$out/cuda/$f.occupancy.txt"
done

# Triton: a cache directory with the same small kernels compiled for gfx1151 and sm_90 on the CPU; keep the
# kernels and a trimmed metadata JSON (Triton's own lists the machine's library paths).
mkdir -p "$out/triton"
TRITON_CACHE_DIR="$work/tcache" TRITON_DISABLE_LINE_INFO=1 "$TRITON_PYTHON" "$src/triton_kernels.py" 2>/dev/null
for f in "$work"/tcache/*/*.hsaco "$work"/tcache/*/*.cubin; do
  d="$out/triton/$(basename "$(dirname "$f")")"
  mkdir -p "$d"
  cp "$f" "$d/"
  "$PYTHON" -c 'import json, sys
meta = json.load(open(sys.argv[1]))
keep = ("name", "target", "num_warps", "warp_size", "shared", "triton_version")
json.dump({k: meta[k] for k in keep if k in meta}, open(sys.argv[2], "w"), indent=1)' "${f%.*}.json" "$d/$(basename "${f%.*}").json"
  case "$f" in
    *.hsaco) notes "$f" >"$d/$(basename "$f").notes.txt" ;;
    *.cubin)
      "$CUOBJDUMP" --dump-resource-usage "$f" | grep -E 'Function|REG:' >"$d/$(basename "$f").cuobjdump.txt"
      # cuda_occupancy.h with Triton's launch: its shared memory (all dynamic) and every block size
      "$PYTHON" -c 'import json, re, sys
meta = json.load(open(sys.argv[2]))
for m in re.finditer(r"Function ([^:\s]+):\s*REG:(\d+)", open(sys.argv[1]).read()):
    print("sm_%d" % meta["target"]["arch"], m[1], m[2], meta["shared"], 0, 1)' \
        "$d/$(basename "$f").cuobjdump.txt" "$d/$(basename "${f%.*}").json" | ./occ_oracle >"$d/$(basename "$f").occupancy.txt"
      ;;
  esac
done

# No absolute paths in what we commit: the work and checkout folders, home, and the temp root.
tmp_root="$(dirname "$(mktemp -u)")"
if grep -rl "$work\|$here\|$HOME\|$tmp_root/" "$out"; then
  echo "absolute paths leaked into the expected values" >&2
  exit 1
fi
du -sh "$out"
echo "On a machine with an sm_90 GPU, refresh fixtures/driver/ with src/driver_occupancy.py (see its header)."
