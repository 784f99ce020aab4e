#!/usr/bin/env bash
# Start the Slurm peer configured by bench/slurm/install.sh: munged, slurmdbd (creating
# the cluster, account and user associations the first time), slurmctld and one slurmd
# per node, and wait until every node is idle. Prints the environment the client
# commands need (SLURM_CONF=...). Stop it with bench/slurm/down.sh.
set -euo pipefail
trap 'echo "slurm: up.sh failed at line $LINENO; see $L" >&2' ERR
CACHE="${FAIRQ_SLURM_CACHE:-$HOME/.cache/fairq-slurm}"
[[ -f $CACHE/etc/slurm.conf ]] || { echo "slurm: not installed (make slurm)" >&2; exit 2; }
export SLURM_CONF=$CACHE/etc/slurm.conf
R=$CACHE/run
L=$CACHE/log
nodes=$(awk '/^NodeName=/{sub("NodeName=","",$1); print $1}' "$SLURM_CONF")

running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() {  # seconds, what, command...
  local t=$1 what=$2 end; shift 2
  end=$((SECONDS + t))
  local run=(timeout 5); declare -F "$1" >/dev/null && run=()
  while ((SECONDS < end)); do "${run[@]}" "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "slurm: $what did not come up; see $L" >&2; return 1
}

# munge's default socket (the client commands look there whatever AuthInfo says), with
# the key of the cache.
mkdir -p /run/munge
running "$R/munged.pid" || munged --force \
  --key-file="$CACHE/etc/munge.key" --pid-file="$R/munged.pid" \
  --log-file="$L/munged.log" --seed-file="$R/munged.seed" --num-threads=4
wait_for 10 munged munge -n

# slurmdbd reads slurmdbd.conf from SLURM_CONF's directory.
running "$R/slurmdbd.pid" || slurmdbd 2>>"$L/slurmdbd.err"
wait_for 60 slurmdbd sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx fairq-peer; then
  sacctmgr -i add cluster fairq-peer >/dev/null
  for a in vision nlp speech; do
    sacctmgr -i add account "$a" cluster=fairq-peer fairshare=1 >/dev/null
  done
  sacctmgr -i modify account vision set fairshare=3 >/dev/null
  sacctmgr -i modify account nlp set fairshare=2 >/dev/null
  sacctmgr -i add user root account=vision cluster=fairq-peer >/dev/null
fi

running "$R/slurmctld.pid" || slurmctld -f "$SLURM_CONF" 2>>"$L/slurmctld.err"
wait_for 30 slurmctld scontrol ping
for n in $nodes; do
  running "$R/slurmd-$n.pid" || slurmd -f "$SLURM_CONF" -N "$n" 2>>"$L/slurmd-$n.err"
done
# A node drained by an earlier run (its reason kept in the saved state) comes back.
sleep 1
scontrol update nodename="$(tr '\n' ',' <<<"$nodes" | sed 's/,$//')" state=resume 2>/dev/null || true
idle() { [[ $(sinfo -h -N -t idle -o '%N' | sort -u | wc -l) -eq $(wc -w <<<"$nodes") ]]; }
wait_for 60 "the nodes" idle
echo "SLURM_CONF=$SLURM_CONF"
