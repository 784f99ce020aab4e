#!/usr/bin/env bash
# Stop the Slurm peer started by bench/slurm/up.sh (by its pid files; the queue is
# cancelled first so the next run starts empty).
set -uo pipefail
CACHE="${FAIRQ_SLURM_CACHE:-$HOME/.cache/fairq-slurm}"
export SLURM_CONF=$CACHE/etc/slurm.conf
R=$CACHE/run
scancel --quiet --user=root 2>/dev/null
stop() {
  local f=$1
  [[ -f $f ]] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
for f in "$R"/slurmd-*.pid; do stop "$f"; done
stop "$R/slurmctld.pid"
stop "$R/slurmdbd.pid"
stop "$R/munged.pid"
exit 0
