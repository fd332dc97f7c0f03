#!/usr/bin/env bash
# gufo bench against llama.cpp's llama-bench on the same machine, same flags, one model at a time,
# alternating the two engines ROUNDS times; writes each run's JSON to OUT_DIR and prints the
# `gufo compare` table per model and round. Usage:
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench_vs_llamacpp.sh OUT_DIR [ROUNDS] [-- BENCH FLAGS]
# Default flags: -p 64,512 -n 128 -d 0,1024 -r 5 -t 2 (issue 3's comparison).
set -euo pipefail
out=${1:?usage: bench_vs_llamacpp.sh OUT_DIR [ROUNDS] [-- FLAGS]}
rounds=${2:-1}
shift $(( $# >= 2 ? 2 : 1 ))
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(-p 64,512 -n 128 -d 0,1024 -r 5 -t 2)
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for model in smollm2-135m gemma3-270m; do
    path=$(python -c "from gufo.gguf.aliases import resolve_model; print(resolve_model('$model'))")
    "$LLAMA_BENCH" -m "$path" "${flags[@]}" -o json >"$out/llamacpp-$model-$round.json" 2>/dev/null
    gufo bench -m "$model" "${flags[@]}" -o json >"$out/gufo-$model-$round.json"
    echo "## $model, round $round"
    gufo compare "$out/llamacpp-$model-$round.json" "$out/gufo-$model-$round.json" --labels llama.cpp,gufo
  done
done
