#!/usr/bin/env bash
# One HyperTF task on a node: activate the venv, enter the work dir, run the command,
# keep its output in RUN_DIR/NAME.log, its PID (= process group) in NAME.pid and its exit
# code in NAME.exit. Started by the launcher with setsid, so 'kill -- -PID' stops the tree.
# usage: task.sh RUN_DIR NAME VENV CWD -- COMMAND [ARGS...]
set -u
run_dir=$1 name=$2 venv=$3 cwd=$4
shift 5
echo $$ > "$run_dir/$name.pid"
# The node's agent marks a run 'drained' before it frees the GPUs of a job whose lease is
# gone; checked after the PID is on disk, so either the agent sees this task and stops it,
# or this task sees the mark and never runs.
if [ -e "$run_dir/drained" ]; then echo 75 > "$run_dir/$name.exit"; exit 75; fi
# shellcheck disable=SC1091
source "$venv/bin/activate" || { echo 127 > "$run_dir/$name.exit"; exit 127; }
cd "$cwd" || { echo "cannot enter $cwd" > "$run_dir/$name.log"; echo 1 > "$run_dir/$name.exit"; exit 1; }
# A stop TERMs the whole group: without a trap this shell would die with the task before
# writing its exit code. With one, bash runs the trap only after the command ends, so the
# code (143 for a task killed by the TERM) is recorded. The command gets default handlers.
trap 'true' TERM
"$@" >> "$run_dir/$name.log" 2>&1 < /dev/null
code=$?
echo "$code" > "$run_dir/$name.exit.tmp" && mv "$run_dir/$name.exit.tmp" "$run_dir/$name.exit"
exit "$code"
