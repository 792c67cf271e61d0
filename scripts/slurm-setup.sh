#!/usr/bin/env bash
# Starts a real Slurm on loopback for the Slurm tests (issue #27): munged, slurmctld and two slurmd
# (node names n1 and n2, both on 127.0.0.1: Debian's slurmd is built with multiple-slurmd support,
# `slurmd -N NAME`), so a job of two nodes runs for real on one machine. Idempotent: daemons already
# up with the same slurm.conf are left alone; a changed slurm.conf restarts them. Processes are tracked as on
# most clusters, by cgroup (proctrack/cgroup, cgroup v1 freezer, one tree per node: slurm_n1, slurm_n2), so
# a step's end reaches every process of it, keepers and servers included (by process tree where the v1
# freezer is not mounted).
#
# Needs root (the daemons run as root; jobs run as their submitter, so an unprivileged user can submit).
# Run it as root (scripts/test.sh does) after `apt-get install slurm-wlm munge`.
# stdout: only KEY=VALUE lines (SLURM_CONF); everything else goes to stderr.
set -euo pipefail
exec 3>&1 1>&2
DIR=${VIGIL_SLURM_DIR:-/var/tmp/vigil-slurm}
log() { echo "slurm-setup: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (starts munged, slurmctld, slurmd)"; exit 1; }
for b in munged slurmctld slurmd sinfo scontrol; do
  command -v "$b" >/dev/null 2>&1 || { log "$b not found (apt-get install slurm-wlm munge)"; exit 1; }
done
mkdir -p "$DIR/state" "$DIR/spool-n1" "$DIR/spool-n2" "$DIR/log"
chmod 755 "$DIR"
CONF=$DIR/slurm.conf
# cgroup tracking needs the v1 freezer hierarchy (Slurm 22.05's cgroup/v1); without it, by process tree
if [ -d /sys/fs/cgroup/freezer ]; then PROCTRACK=proctrack/cgroup; else PROCTRACK=proctrack/linuxproc; fi
cat >"$CONF.new" <<EOF
# written by vigil's scripts/slurm-setup.sh: two nodes on loopback for the tests
ClusterName=vigiltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=$PROCTRACK
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MessageTimeout=10
InactiveLimit=0
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=16901 CPUs=8 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=16902 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=vigil Nodes=n1,n2 Default=YES MaxTime=60 State=UP OverSubscribe=YES
EOF
cat >"$DIR/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
chmod 644 "$CONF.new" "$DIR/cgroup.conf"
export SLURM_CONF=$CONF

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() {
  for p in "$DIR/slurmd-n1.pid" "$DIR/slurmd-n2.pid" "$DIR/slurmctld.pid"; do
    if alive "$p"; then
      pid=$(cat "$p")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
}
if ! cmp -s "$CONF.new" "$CONF"; then
  log "new slurm.conf: (re)starting the daemons"
  stop
  mv "$CONF.new" "$CONF"
else
  rm -f "$CONF.new"
fi

# daemon CMD...: starts a daemon with no stdio of ours and no other inherited descriptor: one that kept a
# caller's pipe would hold it open (`$(scripts/slurm-setup.sh | sed ...)` waited forever on the first cold start in
# CI, the daemons holding the pipe). Its own output goes to $DIR/log/NAME.out.
daemon() {
  local name=$1; shift
  (
    for fd in /proc/self/fd/*; do
      n=${fd##*/}
      [ "$n" -gt 2 ] && eval "exec $n>&-" 2>/dev/null
    done
    exec "$@" </dev/null >>"$DIR/log/$name.out" 2>&1
  )
}

# munge: Debian's package writes /etc/munge/munge.key; munged runs as the munge user.
if ! timeout 5 munge -n </dev/null >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || { log "creating /etc/munge/munge.key"; mungekey --create --keyfile=/etc/munge/munge.key; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  log "starting munged"
  daemon munged runuser -u munge -- /usr/sbin/munged
  timeout 10 bash -c 'until munge -n </dev/null >/dev/null 2>&1; do sleep 0.2; done' \
    || { log "munged did not answer within 10 s"; exit 1; }
fi

if ! alive "$DIR/slurmctld.pid"; then
  log "starting slurmctld"
  daemon slurmctld slurmctld -f "$CONF" -c
fi
for n in n1 n2; do
  if ! alive "$DIR/slurmd-$n.pid"; then
    log "starting slurmd -N $n"
    daemon "slurmd-$n" slurmd -f "$CONF" -N "$n"
  fi
done

# Ready: both nodes idle (or serving other test jobs), within 60 s.
deadline=$((SECONDS + 60))
while :; do
  st=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
  up=$(grep -cE '^n[12] (idle|mix|alloc)$' <<<"$st" || true)
  [ "$up" = 2 ] && break
  if grep -qE '^n[12] (down|drain|drng|fail)' <<<"$st"; then
    timeout 10 scontrol update NodeName=n1,n2 State=RESUME >/dev/null 2>&1 || true
  fi
  if [ $SECONDS -ge $deadline ]; then
    log "Slurm nodes not idle within 60 s: $(tr '\n' ';' <<<"$st"); logs in $DIR/log"
    tail -5 "$DIR"/log/*.log >&2 || true
    exit 1
  fi
  sleep 0.5
done
log "Slurm up: $(tr '\n' ' ' <<<"$st")"
echo "SLURM_CONF=$CONF" >&3
