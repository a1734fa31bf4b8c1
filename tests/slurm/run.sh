#!/usr/bin/env bash
# A single-node Slurm cluster for the tests, in a directory of its own:
#
#   tests/slurm/run.sh start DIR   configure munge and Slurm for this host in DIR
#                                  (SLURM_CONF=DIR/slurm.conf), start munged,
#                                  slurmctld and slurmd, and wait until the node
#                                  takes jobs (at most 30 s)
#   tests/slurm/run.sh stop DIR    stop the daemons started in DIR (by their pid
#                                  files) and remove DIR
#
# Nothing outside DIR is written: the daemons run in the foreground of
# background jobs with their state, spool, logs, sockets and munge key in
# DIR, on ports chosen free at start. Needs slurm-wlm and munge (Debian).
set -euo pipefail
cmd=${1:?usage: run.sh start|stop DIR}
dir=${2:?usage: run.sh start|stop DIR}

stop() {
	for d in slurmd slurmctld munged; do
		if [ -f "$dir/$d.pid" ]; then
			pid=$(cat "$dir/$d.pid")
			kill -TERM "$pid" 2>/dev/null || true
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	# processes of unfinished steps (slurmstepd and tasks): those with
	# this cluster's SLURM_CONF in their environment
	pkill_dir() {
		for p in /proc/[0-9]*; do
			if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$dir/slurm.conf"; then
				kill -KILL "${p#/proc/}" 2>/dev/null || true
			fi
		done
	}
	pkill_dir
	rm -rf "$dir"
}

freeport() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
		echo $((20000 + RANDOM % 20000))
}

start() {
	for b in munged mungekey slurmctld slurmd srun sinfo; do
		command -v "$b" >/dev/null || { echo "missing $b (apt-get install slurm-wlm munge)" >&2; exit 3; }
	done
	mkdir -p "$dir"/{state,spool,munge}
	chmod 700 "$dir/munge"
	mungekey --create --keyfile "$dir/munge/munge.key" --force >/dev/null
	chmod 600 "$dir/munge/munge.key"
	host=$(hostname -s)
	cpus=$(nproc)
	ctl_port=$(freeport)
	d_port=$(freeport)
	cat >"$dir/slurm.conf" <<CONF
ClusterName=gompitest
SlurmctldHost=$host
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid.slurm
SlurmdPidFile=$dir/slurmd.pid.slurm
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=5
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
	export SLURM_CONF=$dir/slurm.conf
	munged -F --force --socket "$dir/munge/munge.socket" --key-file "$dir/munge/munge.key" \
		--pid-file "$dir/munge/munged.pid" --log-file "$dir/munge/munged.log" \
		--seed-file "$dir/munge/munged.seed" >/dev/null 2>&1 &
	echo $! >"$dir/munged.pid"
	for _ in $(seq 50); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
	slurmctld -D -i >"$dir/slurmctld.out" 2>&1 &
	echo $! >"$dir/slurmctld.pid"
	slurmd -D >"$dir/slurmd.out" 2>&1 &
	echo $! >"$dir/slurmd.pid"
	for _ in $(seq 300); do
		state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
		case "$state" in idle*|mix*|alloc*) echo "slurm up: node $host $state, SLURM_CONF=$SLURM_CONF"; return 0 ;; esac
		sleep 0.1
	done
	echo "slurm did not come up within 30 s; node state '${state:-?}'" >&2
	tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir"/*.out >&2 || true
	stop
	exit 4
}

case $cmd in
start) start ;;
stop) stop ;;
*) echo "usage: run.sh start|stop DIR" >&2; exit 2 ;;
esac
