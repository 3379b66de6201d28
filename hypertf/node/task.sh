#!/usr/bin/env bash
# One HyperTF task on a node: activate the venv (bin/activate, else bin/ first on PATH),
# enter the work dir, run the command,
# keep its output in LOG, its record in PIDFILE and its exit code in EXITFILE. Started by
# 'tasknode start' in a new session, so 'kill -- -PID' stops the tree.
# Every path comes from hypertf.core.rundir.RunDir (the one place the run-dir layout is spelled).
# usage: task.sh LOG PIDFILE EXITFILE DRAINED VENV CWD -- COMMAND [ARGS...]
set -u
# What the job writes on the node is its user's alone (logs, exit codes, outputs).
umask 077
log=$1 pidfile=$2 exitfile=$3 drained=$4 venv=$5 cwd=$6
shift 7
# The record is "PID START": this shell's PID (= its process group) and its start time
# (field 22 of /proc/PID/stat, after the command name in parentheses). The node believes
# the record only while that PID still has that start time: a recycled PID has another.
# One write (a reader sees it empty or whole); no start time: a record nobody believes.
stat="" start=""
read -r stat < "/proc/$$/stat"
set -f
# shellcheck disable=SC2206
fields=(${stat##*) })
set +f
start=${fields[19]:-}
echo "$$ $start" > "$pidfile"
# The node's agent marks a run 'drained' before it frees the GPUs of a job whose lease is
# gone; checked after the PID is on disk, so either the agent sees this task and stops it,
# or this task sees the mark and never runs.
if [ -e "$drained" ]; then echo 75 > "$exitfile"; exit 75; fi
# A task that cannot start says why in its log (the launcher shows the log's last lines).
fail() { echo "hypertf: $2" >> "$log"; echo "$1" > "$exitfile"; exit "$1"; }
# The job's cgroups (hypertf.node.confine; 'tasknode start' names their cgroup.procs files,
# ':'-separated, and their path HYPERTF_CGROUP_PATH): joined before the command, so
# everything it starts, a setsid daemon too, stays in them, with the device rules the agent
# wrote from the job's grant. An account that may not write them (not root; on cgroup v2
# no account but root may move a process between another's cgroups) waits for the agent
# to move this shell in (it proves the wrapper first), at its next probe.
rest=${HYPERTF_CGROUP_PROCS:-} want=0 joined=0
while [ -n "$rest" ]; do
    procs=${rest%%:*}
    if [ "$procs" = "$rest" ]; then rest=""; else rest=${rest#*:}; fi
    want=$((want + 1))
    { echo $$ > "$procs"; } 2>/dev/null && joined=$((joined + 1))
done
if [ "$joined" -lt "$want" ]; then
    for _ in $(seq 100); do
        joined=0
        while read -r line; do
            case $line in *":$HYPERTF_CGROUP_PATH") joined=$((joined + 1)) ;; esac
        done < "/proc/$$/cgroup"
        [ "$joined" -ge "$want" ] && break
        sleep 0.05
    done
fi
if [ "$joined" -lt "$want" ]; then
    [ -n "${HYPERTF_CGROUP_REQUIRED:-}" ] && fail 126 "not in the job's cgroups after 5 s (the node's agent moves a task in when it cannot join itself: is the agent running?), and hypertf_gpu_confine is required on this node"
    echo "hypertf: this task is not confined: it is not in the job's cgroups after 5 s (is the node's agent running?)" >> "$log"
fi
unset HYPERTF_CGROUP_PROCS HYPERTF_CGROUP_REQUIRED HYPERTF_CGROUP_PATH rest procs want joined
if [ -e "$venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    source "$venv/bin/activate" || fail 127 "sourcing $venv/bin/activate failed (exit $?)"
elif [ -x "$venv/bin/python" ]; then
    # No activate script (a hand-made or conda environment): what it does for the command.
    export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
else
    fail 127 "no Python environment at $venv (neither bin/activate nor bin/python): set hypertf_venv in the inventory, or run invoke cluster.setup"
fi
cd "$cwd" || fail 1 "cannot enter $cwd"
# HYPERTF_START_AFTER=host:port: start once that listens (a TF1 worker after worker 0, which
# initialises the model). The launcher's start-up deadline bounds the wait; 120 s here is a
# safety net (the task then starts anyway). A stop's TERM ends the wait (no trap yet).
if [ -n "${HYPERTF_START_AFTER:-}" ]; then
    after_host=${HYPERTF_START_AFTER%:*} after_port=${HYPERTF_START_AFTER##*:}
    for _ in $(seq 1200); do
        (exec 3<>"/dev/tcp/$after_host/$after_port") 2>/dev/null && break
        sleep 0.1
    done
fi
# A stop TERMs the whole group: without a trap this shell would die with the task before
# writing its exit code. With one, bash runs the trap only after the command ends, so the
# code (143 for a task killed by the TERM) is recorded. The command gets default handlers.
trap 'true' TERM
"$@" >> "$log" 2>&1 < /dev/null
code=$?
echo "$code" > "$exitfile.tmp" && mv "$exitfile.tmp" "$exitfile"
exit "$code"
