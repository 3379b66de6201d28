#!/usr/bin/env bash
# One HyperTF task on a node: activate the venv, enter the work dir, run the command,
# keep its output in LOG, its PID (= process group) in PIDFILE and its exit code in
# EXITFILE. Started by 'tasknode start' in a new session, so 'kill -- -PID' stops the tree.
# Every path comes from hypertf.core.rundir.RunDir (the one place the run-dir layout is spelled).
# usage: task.sh LOG PIDFILE EXITFILE DRAINED VENV CWD -- COMMAND [ARGS...]
set -u
log=$1 pidfile=$2 exitfile=$3 drained=$4 venv=$5 cwd=$6
shift 7
echo $$ > "$pidfile"
# The node's agent marks a run 'drained' before it frees the GPUs of a job whose lease is
# gone; checked after the PID is on disk, so either the agent sees this task and stops it,
# or this task sees the mark and never runs.
if [ -e "$drained" ]; then echo 75 > "$exitfile"; exit 75; fi
# shellcheck disable=SC1091
source "$venv/bin/activate" || { echo 127 > "$exitfile"; exit 127; }
cd "$cwd" || { echo "cannot enter $cwd" > "$log"; echo 1 > "$exitfile"; exit 1; }
# A stop TERMs the whole group: without a trap this shell would die with the task before
# writing its exit code. With one, bash runs the trap only after the command ends, so the
# code (143 for a task killed by the TERM) is recorded. The command gets default handlers.
trap 'true' TERM
"$@" >> "$log" 2>&1 < /dev/null
code=$?
echo "$code" > "$exitfile.tmp" && mv "$exitfile.tmp" "$exitfile"
exit "$code"
