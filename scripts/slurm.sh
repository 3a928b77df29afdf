#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for campaigns run with `--executor slurm` and for
# the tests: munge, slurmctld and slurmd (Debian's packages, installed when missing) run as root
# with every file under SOVEREIGN_SLURM_DIR (default /tmp/sovereign-slurm).
#
#   scripts/slurm.sh start    # install if needed, write the config, start, wait until the node is idle
#   scripts/slurm.sh stop     # stop the daemons this script started
#   scripts/slurm.sh status   # daemons and node state
#   scripts/slurm.sh env      # the line to source: export SLURM_CONF=...
#
# Client commands (sbatch, squeue, scancel) find the cluster through SLURM_CONF. The
# controller and slurmd listen on SOVEREIGN_SLURM_PORT and the next port (default 6817/6818).
set -euo pipefail

DIR="${SOVEREIGN_SLURM_DIR:-/tmp/sovereign-slurm}"
PORT="${SOVEREIGN_SLURM_PORT:-6817}"
CONF="$DIR/slurm.conf"
SOCKET="$DIR/munge/munge.socket"

die() { echo "error: slurm.sh: $*" >&2; exit 1; }

install_missing() {
  local missing=()
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
  command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
  command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing Slurm: ${missing[*]}"
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get here; install them with your package manager"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_config() {
  local host node
  host="$(hostname -s)"
  # The node as slurmd sees it (CPUs, sockets, memory), so it is never drained for a mismatch.
  node="$(slurmd -C | head -1)"
  [[ "$node" == NodeName=* ]] || die "slurmd -C did not describe this node: $node"
  cat > "$CONF" <<EOF
# Written by scripts/slurm.sh: one node, state and spool under $DIR.
ClusterName=sovereign
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# Finished jobs stay visible to squeue (-t all) for ten minutes.
MinJobAge=600
SchedulerParameters=sched_interval=2
KillWait=5
${node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

node_state() { SLURM_CONF="$CONF" sinfo -h -N -o '%T' 2>/dev/null | head -1; }

start() {
  [ "$(id -u)" -eq 0 ] || die "start needs root (slurmd runs jobs as their users)"
  install_missing
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
  chmod 700 "$DIR/munge"
  if ! alive "$DIR/munged.pid"; then
    # munged insists on owning its key; a private copy keeps the system's untouched.
    install -m 0400 /etc/munge/munge.key "$DIR/munge/munge.key" 2>/dev/null \
      || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none; chmod 400 "$DIR/munge/munge.key"; }
    munged --force --socket="$SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munged.pid" \
      --log-file="$DIR/munged.log" --seed-file="$DIR/munge/seed"
  fi
  if ! alive "$DIR/slurmctld.pid" || ! alive "$DIR/slurmd.pid"; then
    write_config
  fi
  alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF" -i
  alive "$DIR/slurmd.pid" || slurmd -f "$CONF"
  local state=""
  for _ in $(seq 1 120); do
    state="$(node_state)"
    case "$state" in
      idle|mixed|allocated) echo "slurm: node $(hostname -s) $state (SLURM_CONF=$CONF)"; return 0 ;;
      down*|drain*) SLURM_CONF="$CONF" scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  die "the node did not become idle within 60 s (state: ${state:-unknown}); see $DIR/*.log"
}

stop_one() {
  local pidf="$1" pid
  alive "$pidf" || { rm -f "$pidf"; return 0; }
  pid="$(cat "$pidf")"
  kill -TERM "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidf"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidf"
}

stop() {
  stop_one "$DIR/slurmd.pid"
  stop_one "$DIR/slurmctld.pid"
  stop_one "$DIR/munged.pid"
  echo "slurm: stopped"
}

status() {
  for d in munged slurmctld slurmd; do
    if alive "$DIR/$d.pid"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: stopped"; fi
  done
  if alive "$DIR/slurmctld.pid"; then SLURM_CONF="$CONF" sinfo -N; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: scripts/slurm.sh start|stop|status|env" >&2; exit 2 ;;
esac
