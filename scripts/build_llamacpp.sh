#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-server (the comparison binaries of docs/BENCHMARKS.md) from the
# `llama-cpp-python` sdist's vendored tree, a trimmed copy of it, or a source folder. Usage:
#   scripts/build_llamacpp.sh SOURCE BUILD_DIR [cuda|cpu]
# SOURCE: llama_cpp_python-*.tar.gz (`pip download --no-deps --no-binary=:all: llama-cpp-python==0.3.36`),
# a .tar.xz of its vendor/llama.cpp folder, or a llama.cpp folder. cuda (the default) builds for sm_90
# (`-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90`); cpu builds without it. The binaries land in
# BUILD_DIR/bin; JOBS (default: all cores but one) sets the parallel build.
#
# --trim SDIST.tar.gz OUT.tar.xz writes the trimmed tree a device call can carry (about 7 MB: without
# docs, models, media, benches, gguf-py and the ggml backends other than the CPU, CUDA and HIP ones).
set -euo pipefail
if [ "${1:-}" = "--trim" ]; then
  sdist=${2:?usage: build_llamacpp.sh --trim SDIST.tar.gz OUT.tar.xz}
  out=${3:?usage: build_llamacpp.sh --trim SDIST.tar.gz OUT.tar.xz}
  work=$(mktemp -d)
  tar xzf "$sdist" -C "$work"
  tree=$(find "$work" -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -1)
  (cd "$tree" && rm -rf docs models media benches gguf-py .github &&
    cd ggml/src && rm -rf ggml-sycl ggml-vulkan ggml-metal ggml-opencl ggml-cann ggml-musa ggml-webgpu \
      ggml-zdnn ggml-openvino ggml-hexagon ggml-et ggml-virtgpu ggml-zendnn)
  tar cJf "$out" -C "$(dirname "$tree")" llama.cpp
  rm -rf "$work"
  exit 0
fi
source=${1:?usage: build_llamacpp.sh SOURCE BUILD_DIR [cuda|cpu]}
build=${2:?usage: build_llamacpp.sh SOURCE BUILD_DIR [cuda|cpu]}
backend=${3:-cuda}
case "$backend" in
  cuda) flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90) ;;
  cpu) flags=() ;;
  *) echo "build_llamacpp.sh: backend '$backend': expected cuda or cpu" >&2; exit 2 ;;
esac
if [ -d "$source" ]; then
  tree=$source
else
  work=$(mktemp -d)
  tar xf "$source" -C "$work"
  tree=$(find "$work" -maxdepth 3 -type f -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' -printf '%h\n' | head -1)
fi
[ -f "$tree/CMakeLists.txt" ] || { echo "build_llamacpp.sh: no llama.cpp tree in $source" >&2; exit 2; }
cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
cmake --build "$build" -j "${JOBS:-$(($(nproc) > 1 ? $(nproc) - 1 : 1))}" --target llama-bench llama-server
"$build/bin/llama-server" --version
