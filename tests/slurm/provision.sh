#!/usr/bin/env bash
# Provisions a one-node Slurm cluster on this machine for the tests in `tests/slurm.rs`, as
# root: installs Slurm and MUNGE from the distribution's packages if they are missing
# (Debian's `slurm-wlm` and `munge`), writes `/etc/slurm/slurm.conf` for this host, starts
# munged, slurmctld and slurmd, and waits until the node takes jobs.
#
# Idempotent: daemons already running with this configuration are left alone (a changed
# configuration restarts them), so every test, and every run, may call it. Calls are
# serialized by a lock file. It prints what it did and exits non-zero, with the end of the
# daemons' logs, if the node does not come up.
#
# The cluster: the controller and the one compute node are this host; the node's CPUs and
# memory are what `slurmd -C` reports; processes are tracked through /proc
# (`proctrack/linuxproc`) and no task plugin binds them (`task/none`), so no cgroups are
# needed; cores and memory are consumable (`cons_tres`, `CR_Core_Memory`), as on most
# clusters, so job steps compete for them as they would there.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "provision.sh: must run as root (it installs packages and starts daemons)" >&2
  exit 1
fi

exec 9>/run/malleable-slurm-provision.lock
flock 9

say() { echo "provision.sh: $*"; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  say "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y slurm-wlm munge
fi

# --- MUNGE: a key, its directories, the daemon (as the munge user).
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  say "creating a MUNGE key"
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  # The daemons must not inherit the lock (fd 9), or they would hold it for their life.
  runuser -u munge -- /usr/sbin/munged --force 9>&-
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n </dev/null | unmunge >/dev/null || { say "munged does not answer"; exit 1; }
fi

# --- The configuration, from this host.
host=$(hostname)
node=$(slurmd -C | head -n 1)
case "$node" in
  NodeName=*) ;;
  *) say "slurmd -C printed no node line: $node"; exit 1 ;;
esac
conf=$(cat <<CONF
# Written by tests/slurm/provision.sh: a one-node cluster on $host.
ClusterName=malleable
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs stay visible to squeue and scontrol for 5 minutes.
MinJobAge=300
KillWait=5
InactiveLimit=0
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
)
install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
# Never take over a cluster this script did not set up.
if [ -f /etc/slurm/slurm.conf ] && ! head -n 1 /etc/slurm/slurm.conf | grep -q '^# Written by tests/slurm/provision.sh'; then
  say "/etc/slurm/slurm.conf exists and was not written by this script: not touching this machine's Slurm"
  exit 1
fi
changed=0
if [ ! -f /etc/slurm/slurm.conf ] || [ "$(cat /etc/slurm/slurm.conf)" != "$conf" ]; then
  say "writing /etc/slurm/slurm.conf"
  printf '%s\n' "$conf" >/etc/slurm/slurm.conf
  changed=1
fi

# A daemon runs if its pid file names a live process of that name.
running() {
  local pid
  pid=$(cat "/run/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}
stop() {
  if running "$1"; then
    local pid
    pid=$(cat "/run/$1.pid")
    say "stopping $1 (pid $pid)"
    kill "$pid"
    for _ in $(seq 100); do running "$1" || return 0; sleep 0.1; done
    say "$1 (pid $pid) did not stop"; exit 1
  fi
}
logs() {
  for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; do
    echo "--- last lines of $f" >&2
    tail -n 20 "$f" >&2 2>/dev/null || true
  done
}
if [ "$changed" = 1 ]; then
  stop slurmd
  stop slurmctld
fi
if ! running slurmctld; then
  say "starting slurmctld"
  slurmctld 9>&- || { logs; exit 1; }
fi
for _ in $(seq 100); do
  scontrol ping 2>/dev/null | grep -q 'is UP' && break
  sleep 0.1
done
scontrol ping | grep -q 'is UP' || { say "slurmctld does not answer"; logs; exit 1; }
if ! running slurmd; then
  say "starting slurmd"
  slurmd 9>&- || { logs; exit 1; }
fi

# --- Wait until the node takes jobs (it may be running some already).
name=${node#NodeName=}
name=${name%% *}
for i in $(seq 300); do
  state=$(sinfo -h -N -n "$name" -o %T 2>/dev/null || true)
  case "$state" in
    idle|mixed|allocated|completing) say "node $name is $state"; exit 0 ;;
    down*|drain*|fail*)
      # Left so by an earlier run (say, a daemon killed): put it back in service.
      if [ $((i % 20)) = 1 ]; then
        say "node $name is $state: resuming it"
        scontrol update NodeName="$name" State=RESUME 2>/dev/null || true
      fi ;;
  esac
  sleep 0.1
done
say "node $name did not come up (state: ${state:-unknown})"
sinfo -N -l >&2 || true
logs
exit 1
