#!/usr/bin/env bash
# gufo serve against llama.cpp's llama-server on the same file and port, one after the other, each
# measured by the same `gufo bench-serve` flags after a discarded warm-up run; writes each server's log
# and JSON (and the bench-serve table) to OUT_DIR as it goes, so a run cut short keeps what it measured.
# Usage:
#   LLAMA_SERVER=/path/to/llama-server scripts/serve_vs_llamacpp.sh MODEL.gguf OUT_DIR [-- BENCH-SERVE FLAGS]
# GUFO_SERVE_FLAGS (default: --device cuda --sessions 64 --max-pending 64 -c 2048) and LLAMA_SERVER_FLAGS
# (default: -np 64 -c 131072 -fa on -ngl 99) set each server's flags; GUFO_LABEL names gufo's files
# (default gufo), so several gufo configurations can share OUT_DIR; without LLAMA_SERVER only gufo runs. Default bench-serve flags: --endpoint chat --concurrency 1,16,32,64 --max-tokens 128
# --prompt-words 200 -r 1 (issue 23's comparison).
set -euo pipefail
model=${1:?usage: serve_vs_llamacpp.sh MODEL.gguf OUT_DIR [-- FLAGS]}
out=${2:?usage: serve_vs_llamacpp.sh MODEL.gguf OUT_DIR [-- FLAGS]}
shift 2
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--endpoint chat --concurrency 1,16,32,64 --max-tokens 128 --prompt-words 200 -r 1)
read -r -a gufo_flags <<< "${GUFO_SERVE_FLAGS:---device cuda --sessions 64 --max-pending 64 -c 2048}"
read -r -a llama_flags <<< "${LLAMA_SERVER_FLAGS:--np 64 -c 131072 -fa on -ngl 99}"
port=${PORT:-8080}
url=http://127.0.0.1:$port
mkdir -p "$out"

measure() {  # label, then the server's command line
  local label=$1
  shift
  "$@" >"$out/server-$label.txt" 2>&1 &
  local pid=$!
  trap 'kill $pid 2>/dev/null' EXIT
  until python -c "import urllib.request as u; u.urlopen('$url/health', timeout=2)" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "$label: the server exited (see $out/server-$label.txt)" >&2; return 1; }
    sleep 1
  done
  gufo bench-serve --base-url "$url" "${flags[@]}" --max-tokens 16 -r 1 >/dev/null  # warm-up
  gufo bench-serve --base-url "$url" "${flags[@]}" -o "$out/serve-$label.json" | tee "$out/serve-$label.md"
  kill $pid
  wait $pid 2>/dev/null || true
  trap - EXIT
}

echo "## gufo serve ${gufo_flags[*]}"
measure "${GUFO_LABEL:-gufo}" gufo serve -m "$model" "${gufo_flags[@]}" --host 127.0.0.1 --port "$port"
if [ -n "${LLAMA_SERVER:-}" ]; then
  echo "## llama-server ${llama_flags[*]}"
  "$LLAMA_SERVER" --version >"$out/llamacpp-version.txt" 2>&1 || true
  measure llamacpp "$LLAMA_SERVER" -m "$model" "${llama_flags[@]}" --host 127.0.0.1 --port "$port"
fi
