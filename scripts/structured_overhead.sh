#!/usr/bin/env bash
# What structured output costs in decode throughput (issue 28, acceptance 7): `gufo bench-serve` against a
# running server, chat completions at C=1 and C=16, three ways: unconstrained, json_object, and a
# json_schema of one long string (so the constrained outputs run to max_tokens as the others do). Writes
# each run's JSON to OUT_DIR and prints decode t/s per request and aggregate t/s, each constrained run
# against the unconstrained one. Start the server first, e.g.
#   gufo serve -m qwen3-8b-q4_k_m.gguf --sessions 16 --port 18080
# Usage: scripts/structured_overhead.sh BASE_URL OUT_DIR [-- BENCH-SERVE FLAGS]
# Default flags: --concurrency 1,16 --max-tokens 128 --prompt-words 200 -r 3.
set -euo pipefail
url=${1:?usage: structured_overhead.sh BASE_URL OUT_DIR [-- FLAGS]}
out=${2:?usage: structured_overhead.sh BASE_URL OUT_DIR [-- FLAGS]}
shift 2
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(--concurrency 1,16 --max-tokens 128 --prompt-words 200 -r 3)
mkdir -p "$out"
cat >"$out/long-string.schema.json" <<'SCHEMA'
{"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": false}
SCHEMA
run() {  # NAME [FLAGS]
  local name=$1
  shift
  gufo bench-serve --base-url "$url" --endpoint chat "${flags[@]}" "$@" -o "$out/$name.json" --progress
}
run plain
run json_object --response-format json_object
run json_schema --json-schema "$out/long-string.schema.json"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {name: json.loads((out / f"{name}.json").read_text()) for name in ("plain", "json_object", "json_schema")}
print("| format | C | completion tokens | decode t/s/req | vs plain | aggregate t/s | vs plain | greedy = C1 |")
print("|---|--:|--:|--:|--:|--:|--:|:-:|")
for name, report in runs.items():
    for row, base in zip(report["results"], runs["plain"]["results"], strict=True):
        decode, aggregate = row["decode_tps_per_request"], row["aggregate_tps"]
        print(
            f"| {name} | {row['concurrency']} | {row['completion_tokens']:.1f} | {decode:.2f} "
            f"| {decode / base['decode_tps_per_request'] - 1:+.1%} | {aggregate:.2f} "
            f"| {aggregate / base['aggregate_tps'] - 1:+.1%} | {row['greedy_matches_c1']} |"
        )
PY
