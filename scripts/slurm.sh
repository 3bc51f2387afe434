# A private Slurm cluster for the Slurm provisioner's end-to-end tests
# (tests/e2e/slurm.rs): munged with its own key and socket, one slurmctld
# and two slurmd nodes (ty-n1, ty-n2) on 127.0.0.1 with free ports, all
# state in one temporary folder. Sourced by scripts/test after common.sh.
#
# ensure_slurm installs slurm-wlm and munge from apt when missing;
# start_test_slurm DIR starts the cluster and exports what the tests read:
# SLURM_CONF (every Slurm command finds the private controller through
# it), TRAINYARD_TEST_SLURM=1 and TRAINYARD_TEST_SLURM_NODES; stop_test_slurm
# cancels what still runs and stops the daemons. The daemons run as root
# (SlurmUser=root), which is fine for a throwaway test cluster.

TEST_SLURM_DIR=""

ensure_slurm() {
  command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v munged >/dev/null 2>&1 && return 0
  apt_install slurm-wlm munge
}

# _free_port: a port nobody listens on now (bind to 0, read it, close).
_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_test_slurm() {
  local dir="$1"
  rm -rf "$dir"
  mkdir -p "$dir/munge-key" "$dir/munge-run" "$dir/state" "$dir/log" "$dir/spool-ty-n1" "$dir/spool-ty-n2"
  # munged refuses a key folder others can list and a socket folder others
  # cannot reach.
  chmod 711 "$dir/munge-key"
  chmod 755 "$dir/munge-run"
  dd if=/dev/urandom of="$dir/munge-key/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge-key/munge.key"
  local socket="$dir/munge-run/munge.socket"
  munged --key-file="$dir/munge-key/munge.key" --socket="$socket" \
    --pid-file="$dir/munge-run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/state/munge.seed" --force
  local ctl_port n1_port n2_port
  ctl_port="$(_free_port)"
  n1_port="$(_free_port)"
  n2_port="$(_free_port)"
  while [ "$n1_port" = "$ctl_port" ]; do n1_port="$(_free_port)"; done
  while [ "$n2_port" = "$ctl_port" ] || [ "$n2_port" = "$n1_port" ]; do n2_port="$(_free_port)"; done
  # config_overrides: both nodes are this machine, which has fewer cores
  # than the two of them claim; executors share the cores like local ones.
  cat >"$dir/slurm.conf" <<EOF
ClusterName=trainyard-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
KillWait=5
MinJobAge=300
JobRequeue=0
NodeName=ty-n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n1_port CPUs=4 RealMemory=8192 State=UNKNOWN
NodeName=ty-n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n2_port CPUs=4 RealMemory=8192 State=UNKNOWN
PartitionName=trainyard Nodes=ty-n1,ty-n2 Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$dir/slurm.conf"
  TEST_SLURM_DIR="$dir"
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF" -N ty-n1
  slurmd -f "$SLURM_CONF" -N ty-n2
  local i
  for ((i = 0; i < 300; i++)); do
    [ "$(sinfo --noheader --responding --states=idle --format='%N' --Node 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.1
  done
  if [ "$(sinfo --noheader --responding --states=idle --format='%N' --Node 2>/dev/null | wc -l)" -lt 2 ]; then
    log "the test Slurm cluster did not come up; its logs:"
    tail -n 20 "$dir"/log/*.log >&2
    stop_test_slurm
    return 1
  fi
  export TRAINYARD_TEST_SLURM=1
  export TRAINYARD_TEST_SLURM_NODES="ty-n1,ty-n2"
  log "tests use a private Slurm cluster (controller on 127.0.0.1:$ctl_port, nodes ty-n1 ty-n2, SLURM_CONF=$SLURM_CONF)"
}

# _stop_pidfile FILE: SIGTERM the daemon FILE names, SIGKILL after 10 s.
_stop_pidfile() {
  local pid i
  [ -f "$1" ] || return 0
  pid="$(cat "$1" 2>/dev/null)" || return 0
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

stop_test_slurm() {
  [ -n "$TEST_SLURM_DIR" ] || return 0
  local dir="$TEST_SLURM_DIR"
  TEST_SLURM_DIR=""
  # Whatever a test left running goes first, while the nodes still answer
  # (a step whose slurmd is gone would linger): cancelled, then waited for
  # until KillWait's SIGKILL at most.
  scancel --quiet --partition=trainyard 2>/dev/null || true
  local i
  for ((i = 0; i < 150; i++)); do
    [ -z "$(squeue --noheader --partition=trainyard --format=%i 2>/dev/null)" ] && break
    sleep 0.1
  done
  _stop_pidfile "$dir/slurmd-ty-n1.pid"
  _stop_pidfile "$dir/slurmd-ty-n2.pid"
  _stop_pidfile "$dir/slurmctld.pid"
  _stop_pidfile "$dir/munge-run/munged.pid"
  rm -rf "$dir"
  unset SLURM_CONF TRAINYARD_TEST_SLURM TRAINYARD_TEST_SLURM_NODES
}
