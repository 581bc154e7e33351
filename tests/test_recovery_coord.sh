#!/usr/bin/env bash
# The coordinator's own failures, on loopback (a coordinator and three device
# processes, codec none):
#  - SIGKILL of the coordinator while a job is being profiled (one device
#    stopped, so that the others' links are in and its are not; it is then
#    killed and started again): after the restart the job is profiled again
#    with every device, the others reporting what they measured again (not
#    measuring it again), and runs.
#  - SIGKILL of the coordinator during a job and a restart with the same
#    --state: the devices retry, the job goes on from the step committed in
#    SQLite in a new epoch; a half-written upload left in the store is never
#    taken for a committed step.
#  - `job submit --init` while the coordinator is down: the client sends the
#    piece again until the restarted coordinator takes it, and the job
#    starts from that model.
#  - the checkpoint store failing (the directories of the next checkpoint
#    steps' parts taken by files): the step is not committed, the committed
#    one stays intact and exportable, the job waits and says why, and goes on
#    once the store takes them again.
# The job is sized so that it cannot end while the test runs (whatever the
# machine's speed): once a step is committed after the store's failure it is
# stopped, and its committed checkpoint has the same model.safetensors bytes
# and per-step losses as `skyloom train` stopped at that step.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-recovery-coord-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
REF=
STOPPED=
trap '[ -n "$STOPPED" ] && kill -CONT $STOPPED 2>/dev/null; [ -n "$REF" ] && kill $REF 2>/dev/null && wait $REF; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cl_shard "$src" || exit 1
cl_config "$d/cfg.json" 64 4 128
STEPS=100000

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1
cl_device dev3 lab-b --threads 1 || exit 1
cl_wait_online 3 || exit 1

jq_() { cl_jq "$JOB" "$1"; }
state_is() { [ "$(jq_ 'j["state"]')" = "$1" ]; }

# ---- the coordinator killed while a job is profiled ------------------------------
links_done() { for n in "$@"; do grep -q "task done job=$JOB kind=profile round=links" "$CL/$n.log" || return 1; done; }
STOPPED=${CL_PID_OF[dev3]}
kill -STOP "$STOPPED"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 4 --batch 16 \
      --micro-batches 4 --algo even --checkpoint-every 0 --no-wait 2>&1)
JOB=$(grep -o '^j[0-9a-f]*$' <<<"$out")
[ -n "$JOB" ] || { echo "FAIL submitted: $out"; exit 1; }
check "dev1 and dev2 measured their links (dev3 stopped)" cl_poll 180 links_done dev1 dev2
check "the job is profiling, waiting for dev3" state_is profiling
cl_kill9 coord
cl_kill9 dev3; STOPPED=
cl_restart coord || exit 1
cl_restart dev3 || exit 1
check "after the restart the job runs" cl_poll 180 state_is running
check "on every device" test "$(jq_ 'len(set(s["device"] for s in j["plan"]["stages"]))')" = 3
check "dev1 and dev2 reported their links again, measured once" \
    bash -c 'for n in dev1 dev2; do [ "$(grep -c "task done job=$0 kind=profile round=links" "$1/$n.log")" = 1 ] &&
             grep -q "task reported again job=$0 kind=profile round=links" "$1/$n.log" || exit 1; done' "$JOB" "$CL"
cl_job stop "$JOB" >/dev/null
check "stopped" cl_poll 60 state_is stopped

# the reference run, meanwhile, saving every checkpoint step (the one the
# job is stopped at is compared with at the end), with this machine's threads
# where the devices have one each: the bits must not depend on the thread
# count
OMP_WAIT_POLICY=passive "$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps $STEPS \
    --batch 16 --micro-batches 4 --lr 2e-3 --warmup 20 --save-every 20 --save "$d/ref" >/dev/null 2>&1 &
REF=$!

# running in epoch E or later, more than N steps done in it
progress_in() { cl_progress "$JOB" "$@"; }
# the committed step as SQLite has it
db_committed() { python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select committed_step from jobs where id=?", (sys.argv[2],)).fetchone()[0])' "$d/coord/coordinator.db" "$JOB"; }

out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps $STEPS --batch 16 \
      --micro-batches 4 --algo even --checkpoint-every 20 --lr 2e-3 --warmup 20 --json 2>&1)
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
check "submitted and running" bash -c '[ -n "$0" ] && grep -q "\"state\": \"running\"" <<<"$1"' "$JOB" "$out"
[ -n "$JOB" ] || exit 1

# ---- the coordinator killed mid-job -------------------------------------------
# 40 steps done and one committed (uploads run beside training: under load
# the commit may come well after its step)
committed_in_db() { progress_in 1 40 && [ "$(db_committed)" -ge 20 ]; }
cl_poll 300 committed_in_db || { echo "FAIL the job made progress and committed a step"; exit 1; }
sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
cl_kill9 coord
C=$(db_committed)
echo "     SIGKILL coordinator; committed step in SQLite: $C"
check "a step was committed before the kill" test "$C" -ge 20
# a half-written upload of the next step, as a kill in the middle of one leaves it
mkdir -p "$d/coord/jobs/$JOB/ckpt/step-$((C + 20)).partial"
head -c 1000 /dev/urandom > "$d/coord/jobs/$JOB/ckpt/step-$((C + 20)).partial/model.dfake0000000000000.safetensors"
cl_restart coord || exit 1
check "after the restart the job recovers, at its committed step" \
    bash -c '[ "$(python3 -c "import json,sys; j=json.load(sys.stdin); print(j[\"committed_step\"])" <<<"$("$0" job status "$1" --json --coordinator "$2" --pki "$3")")" = "$4" ]' \
    "$SK" "$JOB" "$CL_ADDR" "$CL/pki" "$C"
check "the half-written upload is not in the store" \
    bash -c '! find "$0" -name "model.dfake*" | grep -q .' "$d/coord/jobs/$JOB"
check "the job runs again, in epoch 2" cl_poll 300 progress_in 2
check "every device is still running (they retried)" \
    bash -c 'for p in "$@"; do kill -0 "$p" || exit 1; done' "${CL_PID_OF[dev1]}" "${CL_PID_OF[dev2]}" "${CL_PID_OF[dev3]}"
check "the restart is among the job's events" \
    bash -c 'grep -q "\"kind\": \"coordinator_restarted\"" <<<"$("$0" job status "$1" --json --coordinator "$2" --pki "$3")"' \
    "$SK" "$JOB" "$CL_ADDR" "$CL/pki"

# ---- the checkpoint store fails ---------------------------------------------------
cl_poll 300 progress_in 2 30
C2=$(db_committed)
# files where the parts of the next checkpoint steps would go: the store
# cannot make their directories (one already made is left: a later step fails)
J="$d/coord/jobs/$JOB/ckpt"
BLOCKED=()
for k in $(seq 1 30); do
  p="$J/step-$((C2 + 20 * k)).partial"
  [ -e "$p" ] || { : > "$p"; BLOCKED+=("$p"); }
done
check "the job waits, saying the store failed and why" cl_poll 300 state_is waiting
reason=$(jq_ 'j["reason"]')
echo "     reason: $reason"
check "the reason: the store could not take the step, the error, the committed step" \
    bash -c 'grep -q "checkpoint store could not take step .*not a directory.*step [0-9]* stays committed" <<<"$0"' "$reason"
C3=$(jq_ 'j["committed_step"]')
check "the committed step did not move past the failure" \
    bash -c '[ "$0" -ge "$1" ] && grep -q "step $0 stays committed" <<<"$2"' "$C3" "$C2" "$reason"
cl_job export "$JOB" --out "$d/export-waiting" >/dev/null; rc=$?
check "the committed checkpoint stays readable: job export works" \
    bash -c 'test $0 -eq 0 && test -s "$1/model.safetensors"' "$rc" "$d/export-waiting"
for p in "${BLOCKED[@]}"; do [ -f "$p" ] && rm -f "$p"; done
check "with the store writable again, the job goes on" cl_poll 300 progress_in 3

# a step committed after the failure, then the job is stopped there
committed_after() { [ "$(jq_ 'int(j["committed_step"] >= j["plan"]["start_step"] - 1 + 20)')" = 1 ]; }
check "a step is committed after the store's failure" cl_poll 300 committed_after
cl_job stop "$JOB" >/dev/null
check "stopped" cl_poll 60 state_is stopped
C=$(jq_ 'j["committed_step"]')
echo "     stopped; committed step $C"
check "the reference run reached step $C" cl_poll 600 test -s "$d/ref/step-$C/manifest.json"
kill $REF 2>/dev/null; wait $REF; REF=
cl_job export "$JOB" --out "$d/export" >/dev/null; rc=$?
check "the model equals skyloom train's at step $C, byte for byte" \
    bash -c 'test $0 -eq 0 && cmp -s "$1/export/model.safetensors" "$1/ref/step-'$C'/model.safetensors"' "$rc" "$d"
check "the per-step losses up to step $C equal skyloom train's, one row per step" \
    bash -c '[ "$(tail -n +2 "$0" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,2)" ]' \
    "$d/coord/jobs/$JOB/metrics.csv" "$d/ref/metrics.csv" "$C"

# ---- --init while the coordinator is down ---------------------------------------
INIT="$d/ref/step-$C/model.safetensors"
cl_kill9 coord
cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 4 --batch 16 --micro-batches 4 \
    --algo even --checkpoint-every 0 --init "$INIT" --no-wait > "$d/init.out" 2> "$d/init.err" &
SUB=$!
check "the client waits for the coordinator, sending the piece again" \
    cl_poll 120 grep -q "sending the piece again" "$d/init.err"
cl_restart coord || exit 1
wait $SUB; rc=$?
JOB=$(grep -o '^j[0-9a-f]*$' "$d/init.out")
check "once it is back the upload goes through and the job is submitted" \
    bash -c 'test $0 -eq 0 && [ -n "$1" ]' "$rc" "$JOB"
check "the job starts from the uploaded model, byte for byte" \
    cmp -s "$INIT" "$d/coord/jobs/$JOB/ckpt/step-0/model.safetensors"
[ -n "$JOB" ] && cl_job stop "$JOB" >/dev/null

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
