#!/usr/bin/env bash
# A private Slurm on this machine for tests: munged on its own socket and
# key, slurmctld and two slurmd daemons (nodes n0 and n1, both this host,
# each on its own port: Debian's Slurm 22.05 runs several slurmd per host
# with `slurmd -N NAME`), state, spool and logs under DIR, ports picked free.
#
#   slurm_cluster.sh start DIR [WATCH_PID]   prints SLURM_CONF=DIR/slurm.conf
#   slurm_cluster.sh stop DIR                cancels every job, stops the daemons
#   slurm_cluster.sh steps DIR               the pids of its slurmstepd processes left
#
# With WATCH_PID, a watchdog stops the cluster once that process is gone (a
# test that crashed or was killed by its timeout). Exit 77: not root.
set -euo pipefail

action=${1:?start|stop}
dir=${2:?DIR}

# The slurmstepd processes of this cluster (their environment names its slurm.conf).
stepds_of_this_cluster() {
  local pid
  for pid in $(pgrep -x slurmstepd || true); do
    if grep -qzx "SLURM_CONF=$dir/slurm.conf" "/proc/$pid/environ" 2>/dev/null; then echo "$pid"; fi
  done
}

# Stops the daemons whose pid files are given: TERM, up to 10 s to exit,
# then KILL, and returns once each is gone (a test checks that none is left).
stop_daemons() {
  local pids=() f p
  for f in "$@"; do [[ -f "$f" ]] && pids+=("$(cat "$f")"); done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
}

# Stops what `start` started, by the pids it recorded; safe to run twice.
stop_cluster() {
  export SLURM_CONF="$dir/slurm.conf"
  if [[ -f "$dir/slurmctld.pid" ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    # Every job of this private cluster, then wait for its steps to end.
    scancel --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 60); do
      [[ -z "$(squeue --noheader --states=PENDING,RUNNING,COMPLETING,CONFIGURING,REQUEUED 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi
  # Slurm's daemons first, munged once they are gone: a slurmd whose munged
  # stopped first spends seconds on authentication errors before it exits.
  stop_daemons "$dir"/slurmd-n0.pid "$dir"/slurmd-n1.pid "$dir"/slurmctld.pid
  stop_daemons "$dir"/munged.pid
  # Job steps whose slurmstepd outlived its slurmd: ours have this
  # cluster's SLURM_CONF in their environment.
  for pid in $(stepds_of_this_cluster); do kill -9 "$pid" 2>/dev/null || true; done
  [[ -n "${WATCHDOG:-}" ]] || { [[ -f "$dir/watchdog.pid" ]] && kill "$(cat "$dir/watchdog.pid")" 2>/dev/null || true; }
  rm -f "$dir"/*.pid
}

free_port() {
  local used port
  used=$(ss -Htan | awk '{print $4}' | sed 's/.*://' | sort -u)
  while :; do
    port=$(shuf -i 20000-59999 -n 1)
    grep -qx "$port" <<<"$used" || grep -qx "$port" <<<"${taken:-}" || { taken+=$'\n'"$port"; echo "$port"; return; }
  done
}

case "$action" in
  steps)
    stepds_of_this_cluster
    exit 0
    ;;
  stop)
    stop_cluster
    exit 0
    ;;
  start) ;;
  *) echo "usage: $0 start|stop DIR [WATCH_PID]" >&2; exit 2 ;;
esac

if [[ $(id -u) -ne 0 ]]; then
  echo "slurm_cluster: a private Slurm needs root (slurmd runs jobs as their users); skipped" >&2
  exit 77
fi
here=$(cd "$(dirname "$0")/.." && pwd)
# Slurm, munge and ss: installed here, on first use, not with the other tests' packages.
"$here/tools/install_deps.sh" slurm >&2

# What slurmd and the jobs need of the machine itself (a real Debian 12
# machine has both; a bare chroot or container may not).
if ! mountpoint -q /sys/fs/cgroup; then
  echo "slurm_cluster: slurmd needs the cgroup filesystem, and /sys/fs/cgroup is not mounted here; skipped" >&2
  exit 77
fi
host=$(hostname -s)
if ! getent hosts "$host" >/dev/null; then
  echo "slurm_cluster: this machine's host name '$host' does not resolve (getent hosts), and Slurm's nodes" \
    "and the actors dial it: add it to /etc/hosts; skipped" >&2
  exit 77
fi

mkdir -p "$dir"/{state,log,spool/n0,spool/n1}
chmod 755 "$dir"
taken=""
ctld_port=$(free_port)
n0_port=$(free_port)
n1_port=$(free_port)

# munge: a fresh key and a socket of our own (the system's munged, if any, is untouched).
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 600 "$dir/munge.key"
munged --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munge.seed" --force

# cred_expire: a requeued job waits this long (+1 s) before it may start
# again, so that no node still holds the old run's revoked credential
# (Slurm's default is 120 s).
cat >"$dir/slurm.conf" <<EOF
ClusterName=troupetest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=20
MinJobAge=600
SchedulerParameters=sched_interval=2
InactiveLimit=0
NodeName=n0 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n0_port CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$n1_port CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$dir/slurm.conf" -i
slurmd -f "$dir/slurm.conf" -N n0
slurmd -f "$dir/slurm.conf" -N n1

if [[ -n "${3:-}" ]]; then
  WATCHDOG=1 setsid bash -c "while kill -0 $3 2>/dev/null; do sleep 1; done; WATCHDOG=1 '$0' stop '$dir'" \
    >/dev/null 2>&1 </dev/null &
  echo $! >"$dir/watchdog.pid"
fi

# Both nodes idle.
for _ in $(seq 1 60); do
  if [[ "$(sinfo --noheader --states=idle --format=%D 2>/dev/null)" == 2 ]]; then
    echo "SLURM_CONF=$dir/slurm.conf"
    exit 0
  fi
  sleep 0.5
done
echo "slurm_cluster: the nodes did not come up; logs in $dir/log" >&2
sinfo >&2 || true
stop_cluster
exit 1
