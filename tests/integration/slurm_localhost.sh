#!/bin/bash
# Starts a one-node SLURM (munged, slurmctld, slurmd) on this machine for
# tests/integration/test_slurm.py. Needs root and Debian's packages:
#   apt-get update && apt-get install -y slurm-wlm munge
# Usage: tests/integration/slurm_localhost.sh [DIR]   (default /tmp/kmp-slurm)
# then:  export SLURM_CONF=DIR/slurm.conf
set -euo pipefail
dir=${1:-/tmp/kmp-slurm}
host=$(hostname -s)
cpus=$(nproc)
mkdir -p "$dir"/{state,spool,log}
cat > "$dir/slurm.conf" <<CONF
ClusterName=kmp
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6917
SlurmdPort=6918
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged
export SLURM_CONF=$dir/slurm.conf
/usr/sbin/slurmctld -f "$SLURM_CONF"
/usr/sbin/slurmd -f "$SLURM_CONF"
for _ in $(seq 30); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
echo "export SLURM_CONF=$SLURM_CONF"
