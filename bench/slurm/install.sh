#!/usr/bin/env bash
# Install the Slurm peer of bench/bench_vs_slurm.py: Debian's Slurm 22.05 (slurmctld,
# slurmdbd, slurmd, the client commands) and munge, and write its configuration into
# "$FAIRQ_SLURM_CACHE" (default ~/.cache/fairq-slurm): a cluster "fairq-peer" of 4 nodes
# with 8 fake GPUs each (gres.conf naming empty files under the cache as the devices;
# SlurmdParameters=config_overrides, so slurm.conf's CPUs and memory are believed), one
# slurmd per node on this host (`slurmd -N n<i>`, NodeHostname=localhost, a port each),
# accounting through slurmdbd into the machine's
# MariaDB at 127.0.0.1:3306 (root, empty password; database fairq_slurm_acct) and the
# multifactor priority plugin with fair share, so `sprio` and `sshare` answer as on a
# real cluster. Idempotent; nothing is written into the repository.
#
# Needs root and apt-get (Debian 12); elsewhere it says so and exits 0, and the bench
# skips the Slurm side. Start and stop the daemons with bench/slurm/up.sh and down.sh.
set -euo pipefail

CACHE="${FAIRQ_SLURM_CACHE:-$HOME/.cache/fairq-slurm}"
PKGS=(slurmctld slurmd slurmdbd slurm-client munge)
NODES=4
GPUS=8

if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "slurm: not root or no apt-get: the Slurm peer of bench_vs_slurm.py is skipped"
  exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "slurm: installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
version=$(slurmctld -V | awk '{print $2}')
[[ $version == 22.05.* ]] || echo "slurm: warning: Slurm $version, the bench was written for 22.05"

mkdir -p "$CACHE"/{etc,state,spool,log,run}
for i in $(seq 1 $NODES); do mkdir -p "$CACHE/spool/n$i"; done

# A munge key of our own (the package's is kept), its socket in the cache.
if [[ ! -s $CACHE/etc/munge.key ]]; then
  dd if=/dev/urandom bs=1 count=1024 of="$CACHE/etc/munge.key" status=none
fi
chown root:root "$CACHE/etc/munge.key"
chmod 400 "$CACHE/etc/munge.key"

nodes=""
for i in $(seq 1 $NODES); do
  nodes+="NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=64 RealMemory=512000 Gres=gpu:$GPUS State=UNKNOWN"$'\n'
done

cat > "$CACHE/etc/slurm.conf" <<CONF
# Written by bench/slurm/install.sh: the Slurm peer of bench/bench_vs_slurm.py.
ClusterName=fairq-peer
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=17001
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$CACHE/state
SlurmdSpoolDir=$CACHE/spool/%n
SlurmctldPidFile=$CACHE/run/slurmctld.pid
SlurmdPidFile=$CACHE/run/slurmd-%n.pid
SlurmctldLogFile=$CACHE/log/slurmctld.log
SlurmdLogFile=$CACHE/log/slurmd-%n.log
SlurmctldDebug=error
SlurmdDebug=error
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# The nodes are fake (8 GPUs and 64 CPUs each on a 2-core host): trust slurm.conf.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MaxJobCount=200000
MaxArraySize=100001
PriorityType=priority/multifactor
PriorityWeightFairshare=10000
PriorityWeightAge=1000
PriorityWeightQOS=1000
PriorityDecayHalfLife=7-0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=16819
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations
$nodes
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# Fake GPU device files (gres/gpu counts 0 without File=); one line for every node: a
# NodeName= line is not matched to a node started with -N.
mkdir -p "$CACHE/dev"
for g in $(seq 0 $((GPUS - 1))); do touch "$CACHE/dev/gpu$g"; done
echo "Name=gpu File=$CACHE/dev/gpu[0-$((GPUS - 1))]" > "$CACHE/etc/gres.conf"
cat > "$CACHE/etc/cgroup.conf" <<CONF
CgroupPlugin=autodetect
CONF

cat > "$CACHE/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=16819
SlurmUser=root
PidFile=$CACHE/run/slurmdbd.pid
LogFile=$CACHE/log/slurmdbd.log
DebugLevel=error
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=root
StorageLoc=fairq_slurm_acct
CONF
chmod 600 "$CACHE/etc/slurmdbd.conf"
echo "slurm: Slurm $version configured in $CACHE (bench/slurm/up.sh starts it)"
