#!/usr/bin/env bash
# Whole-process `gufo run` timings on the CPU with OpenMP's spinning waits (OMP_WAIT_POLICY=ACTIVE, gufo's
# behaviour before it set PASSIVE), with gufo's default (passive waits) and with -t 1, ROUNDS times in
# turn; with `loaded`, one `yes` per core runs meanwhile. One line per run:
#   SETTING generation_tok_s wall_s user_s sys_s
# Usage: scripts/cpu_threads.sh [ROUNDS] [loaded]   (needs `gufo` on PATH or python -m gufo.cli.main)
set -euo pipefail
rounds=${1:-3}
load=${2:-}
gufo=(python -m gufo.cli.main)
command -v gufo >/dev/null && gufo=(gufo)
burners=()
cleanup() { for pid in "${burners[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
if [[ $load == loaded ]]; then
  for _ in $(seq "$(nproc)"); do yes >/dev/null & burners+=($!); done
fi
echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), burners: ${#burners[@]}"
run=("${gufo[@]}" run -m gemma3-270m -p "The capital of France is" -n 32 --temp 0 --ignore-eos)
for _ in $(seq "$rounds"); do
  for setting in spin-default passive-default passive-t1; do
    case $setting in
      spin-default) env=(OMP_WAIT_POLICY=ACTIVE); flags=() ;;
      passive-default) env=(); flags=() ;;
      passive-t1) env=(); flags=(-t 1) ;;
    esac
    err=$(env "${env[@]}" /usr/bin/time -f "time %e %U %S" "${run[@]}" "${flags[@]}" 2>&1 >/dev/null)
    tps=$(grep -o 'generation: [0-9]* tokens, [0-9.]* ms, [0-9.]* tok/s' <<<"$err" | awk '{print $6}')
    echo "$setting $tps $(grep '^time ' <<<"$err" | cut -d' ' -f2-)"
  done
done
