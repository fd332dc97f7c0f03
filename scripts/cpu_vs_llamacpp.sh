#!/usr/bin/env bash
# Alternate llama.cpp's llama-bench and `gufo run` on the same machine, ROUNDS times, and print one line
# per measurement: ENGINE MODEL TEST TOKENS_PER_SECOND. Usage:
#   LLAMA_BENCH=/path/to/llama-bench scripts/cpu_vs_llamacpp.sh [ROUNDS]
# gufo's numbers are the ones `gufo run` reports (prompt tok/s over a 512-token prompt, generation
# tok/s over 128 greedy tokens); llama-bench runs pp512 and tg128 with one repetition per round.
set -euo pipefail
rounds=${1:-5}
: "${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for model in smollm2-135m gemma3-270m; do
  python - "$model" "$work/$model.txt" <<'PY'
import sys
from pathlib import Path

from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import open_model_file
from gufo.tokenizer import Tokenizer

model, out = sys.argv[1], Path(sys.argv[2])
tok = Tokenizer.from_gguf(open_model_file(resolve_model(model)).metadata)
text = Path("README.md").read_text() * 8
lo, hi = 0, len(text)
while lo < hi:  # shortest prefix of the text that tokenizes to 512 tokens (BOS included)
    mid = (lo + hi) // 2
    if len(tok.encode(text[:mid])) < 512:
        lo = mid + 1
    else:
        hi = mid
out.write_text(text[:lo])
PY
done
for _ in $(seq "$rounds"); do
  for model in smollm2-135m gemma3-270m; do
    path=$(python -c "from gufo.gguf.aliases import resolve_model; print(resolve_model('$model'))")
    "$LLAMA_BENCH" -m "$path" -p 512 -n 128 -r 1 -t 2 -o jsonl 2>/dev/null | python -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('llama.cpp', '$model', 'pp512' if r['n_prompt'] else 'tg128', round(r['avg_ts'], 2))"
    gufo run -m "$model" -f "$work/$model.txt" -n 128 --temp 0 --ignore-eos -t 2 2>&1 >/dev/null | python -c "
import re, sys
prompt, gen = re.findall(r'([0-9.]+) tok/s', sys.stdin.read())
print('gufo', '$model', 'pp512', prompt)
print('gufo', '$model', 'tg128', gen)"
  done
done
