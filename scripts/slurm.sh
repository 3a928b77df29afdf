#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for campaigns run with `--executor slurm` and for
# the tests: munge, slurmctld and slurmd (Debian's packages, installed when missing) run as root
# with every file under SOVEREIGN_SLURM_DIR (default /tmp/sovereign-slurm).
#
#   scripts/slurm.sh start    # install if needed, write the config, start, wait until the node is idle
#   scripts/slurm.sh stop     # stop the daemons this script started
#   scripts/slurm.sh stop DAEMON...          # stop only these (munged, slurmctld, slurmd)
#   scripts/slurm.sh stop --started-by WHO   # stop only the daemons a `start` by WHO started
#   scripts/slurm.sh status   # daemons and node state
#   scripts/slurm.sh env      # the line to source: export SLURM_CONF=...
#
# `start` starts only the daemons not already running, and says which it started in a line
# `slurm: started by this call: munged slurmctld slurmd` (or `none`), so a caller can stop what
# it started and leave alone what was running before it. It also notes each daemon it starts
# as started by SOVEREIGN_SLURM_STARTED_BY (default `hand`) in DIR/DAEMON.started-by: the tests
# start with `tests`, and `make test` ends with `stop --started-by tests`, a backstop for a test
# binary that was killed before it could stop its cluster.
#
# Client commands (sbatch, squeue, scancel) find the cluster through SLURM_CONF. The
# controller and slurmd listen on SOVEREIGN_SLURM_PORT and the next port (default 6817/6818).
set -euo pipefail

DIR="${SOVEREIGN_SLURM_DIR:-/tmp/sovereign-slurm}"
PORT="${SOVEREIGN_SLURM_PORT:-6817}"
CONF="$DIR/slurm.conf"
STARTED_BY="${SOVEREIGN_SLURM_STARTED_BY:-hand}"
DAEMONS=(munged slurmctld slurmd)
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
  local started=()
  if ! alive "$DIR/munged.pid"; then
    # munged insists on owning its key; a private copy keeps the system's untouched.
    install -m 0400 /etc/munge/munge.key "$DIR/munge/munge.key" 2>/dev/null \
      || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none; chmod 400 "$DIR/munge/munge.key"; }
    munged --force --socket="$SOCKET" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munged.pid" \
      --log-file="$DIR/munged.log" --seed-file="$DIR/munge/seed"
    started+=(munged)
  fi
  if ! alive "$DIR/slurmctld.pid" || ! alive "$DIR/slurmd.pid"; then
    write_config
  fi
  alive "$DIR/slurmctld.pid" || { slurmctld -f "$CONF" -i; started+=(slurmctld); }
  alive "$DIR/slurmd.pid" || { slurmd -f "$CONF"; started+=(slurmd); }
  local d
  for d in "${started[@]}"; do echo "$STARTED_BY" > "$DIR/$d.started-by"; done
  echo "slurm: started by this call: ${started[*]:-none}"
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
  local pidf="$DIR/$1.pid" pid
  rm -f "$DIR/$1.started-by"
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

# Cancels every job of this cluster and waits (30 s at most) until none is left running, so no
# job outlives the cluster (a test that failed mid-campaign leaves its tasks queued or running).
cancel_jobs() {
  local ids
  ids="$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null | tr '\n' ' ')" || return 0
  [ -n "${ids// /}" ] || return 0
  # shellcheck disable=SC2086 # one argument per job id
  SLURM_CONF="$CONF" scancel $ids 2>/dev/null || true
  for _ in $(seq 1 300); do
    [ -z "$(SLURM_CONF="$CONF" squeue -h -o %A 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  echo "slurm.sh: jobs left 30 s after scancel: $(SLURM_CONF="$CONF" squeue -h -o '%A %T' 2>/dev/null | tr '\n' ' ')" >&2
}

# stop [DAEMON... | --started-by WHO]: slurmd first, munged last, whatever order they are named in;
# stopping the controller cancels the cluster's jobs first.
stop() {
  local want=() d stopped=()
  if [ "${1:-}" = --started-by ]; then
    [ -n "${2:-}" ] || die "stop --started-by needs a name"
    for d in "${DAEMONS[@]}"; do
      [ "$(cat "$DIR/$d.started-by" 2>/dev/null)" = "$2" ] && want+=("$d")
    done
  elif [ $# -eq 0 ]; then
    want=("${DAEMONS[@]}")
  else
    for d in "$@"; do
      [[ " ${DAEMONS[*]} " == *" $d "* ]] || die "stop: no daemon '$d' (munged, slurmctld, slurmd)"
    done
    want=("$@")
  fi
  if [[ " ${want[*]} " == *" slurmctld "* ]] && alive "$DIR/slurmctld.pid"; then
    cancel_jobs
  fi
  for d in slurmd slurmctld munged; do
    [[ " ${want[*]} " == *" $d "* ]] || continue
    stop_one "$d"
    stopped+=("$d")
  done
  echo "slurm: stopped ${stopped[*]:-nothing}"
}

status() {
  for d in munged slurmctld slurmd; do
    if alive "$DIR/$d.pid"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: stopped"; fi
  done
  if alive "$DIR/slurmctld.pid"; then SLURM_CONF="$CONF" sinfo -N; fi
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: scripts/slurm.sh start|stop [DAEMON... | --started-by WHO]|status|env" >&2; exit 2 ;;
esac
