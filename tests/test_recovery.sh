#!/usr/bin/env bash
# Training that survives losing devices, on loopback: a coordinator and four
# device processes run a plain chain (codec none). SIGKILL at a random point
# inside a step of (1) the device of a middle stage, (2) the device at the
# chain's end, which is not the data owner, and (3) the data owner itself:
# the coordinator declares each lost (a neighbour's broken link, no heartbeat
# needed), re-plans over the devices left from the committed step, the job
# waits while the data owner is away and goes on when it is back; the killed
# devices restarted are profiled again and weighed at the next commit.
# The job is sized so that it cannot end while the test runs (whatever the
# machine's speed): once a step is committed after the last recovery it is
# stopped, and its committed checkpoint has the same model.safetensors bytes
# and the same per-step losses as `skyloom train` stopped at that step.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-recovery-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
REF=
trap '[ -n "$REF" ] && kill $REF 2>/dev/null && wait $REF; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cl_shard "$src" || exit 1
cl_config "$d/cfg.json" 64 4 128
STEPS=100000

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" --allow-labels-out || exit 1; OWNER=$CL_ID  # a plain chain below
declare -A NAME_OF=([$OWNER]=dev1)
for n in dev2 dev3 dev4; do
  cl_device $n lab-b --threads 1 || exit 1
  NAME_OF[$CL_ID]=$n
done
cl_wait_online 4 || exit 1

# the reference run, meanwhile, saving every checkpoint step (the one the job
# is stopped at is compared with at the end), with this machine's threads
# where the devices have one each: the bits must not depend on the thread
# count
OMP_WAIT_POLICY=passive "$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps $STEPS \
    --batch 16 --micro-batches 4 --lr 2e-3 --warmup 20 --save-every 20 --save "$d/ref" >/dev/null 2>&1 &
REF=$!

jq_() { cl_jq "$JOB" "$1"; }
state_is() { [ "$(jq_ 'j["state"]')" = "$1" ]; }
# running in epoch E or later, more than N steps done in it
progress_in() { cl_progress "$JOB" "$@"; }
# the device of stage S of the running plan (-1: the last)
stage_dev() { jq_ "j['plan']['stages'][$1]['device']"; }
# kills NAME at a random point inside a step, once epoch E has made progress
kill_inside_step() {
  local name=$1 epoch=$2
  cl_poll 300 progress_in "$epoch" || { echo "FAIL the job made progress in epoch $epoch"; fail=1; return 1; }
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  echo "     SIGKILL $name at step $(jq_ 'j["step"]') (epoch $(jq_ 'j["epoch"]'))"
  cl_kill9 "$name"
}
weighed() { cl_job status "$JOB" --json 2>/dev/null | grep -q '"kind": "weighed"'; }
lost_events() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sum(1 for e in j["events"] if e["kind"]=="lost" and e["device"]==sys.argv[2] and sys.argv[3] in e["detail"]))' "$@"; }

out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps $STEPS --batch 16 \
      --micro-batches 4 --algo even --checkpoint-every 20 --no-u-shape --lr 2e-3 --warmup 20 --json 2>&1)
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
check "submitted and running" bash -c '[ -n "$0" ] && grep -q "\"state\": \"running\"" <<<"$1"' "$JOB" "$out"
[ -n "$JOB" ] || exit 1
cl_job status "$JOB" --json > "$d/status1.json"
P=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["plan"]["stages"]))' "$d/status1.json")
check "epoch 1: four stages, one on each device" test "$P" = 4

# (1) the device of a middle stage
MID=$(stage_dev 1)
kill_inside_step "${NAME_OF[$MID]}" 1
check "(1) the job runs again in epoch 2" cl_poll 300 progress_in 2
cl_job status "$JOB" --json > "$d/status2.json"
check "(1) the middle device is declared lost once, from its neighbours' broken links" \
    test "$(lost_events "$d/status2.json" "$MID" link)" = 1
check "(1) epoch 2's plan leaves it out and starts after the committed step" \
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); p=j["plan"]; assert all(s["device"]!=sys.argv[2] for s in p["stages"]); assert p["start_step"]<=j["committed_step"]+1, (p["start_step"], j["committed_step"])' \
    "$d/status2.json" "$MID"

# it comes back: profiled again, weighed at the next commit
cl_restart "${NAME_OF[$MID]}"
check "(1) back online, it is profiled and weighed at a commit" \
    cl_poll 300 weighed
E=$(jq_ 'j["epoch"]')

# (2) the device at the chain's end (not the data owner)
LAST=$(stage_dev -1)
check "(2) the last stage is not the data owner's" test "$LAST" != "$OWNER"
kill_inside_step "${NAME_OF[$LAST]}" "$E"
check "(2) the job runs again in epoch $((E + 1))" cl_poll 300 progress_in $((E + 1))
cl_job status "$JOB" --json > "$d/status3.json"
check "(2) the last device is declared lost once" test "$(lost_events "$d/status3.json" "$LAST" "")" = 1
E=$(jq_ 'j["epoch"]')

# (3) the data owner: the job waits, and goes on when it is back
kill_inside_step dev1 "$E"
check "(3) without its data owner the job waits, and says why" cl_poll 120 state_is waiting
reason=$(jq_ 'j["reason"]')
echo "     reason: $reason"
check "(3) the reason names the data owner" grep -q "data owner $OWNER is offline" <<<"$reason"
cl_restart dev1
check "(3) the data owner back, the job runs again" cl_poll 300 progress_in $((E + 1))

# a step committed in the last epoch, then the job is stopped there
committed_after() { [ "$(jq_ 'int(j["committed_step"] >= j["plan"]["start_step"] - 1 + 20)')" = 1 ]; }
check "a step is committed after the last recovery" cl_poll 300 committed_after
cl_job stop "$JOB" >/dev/null
check "stopped" cl_poll 60 state_is stopped
cl_job status "$JOB" --json > "$d/status.json"
C=$(jq_ 'j["committed_step"]')
echo "     stopped; committed step $C"
python3 - "$d/status.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
t0 = j["events"][0]["at_ms"] if j["events"] else 0
for e in j["events"]:
    print("     %8.2f s  epoch %-2d committed %-3d %-10s %-18s %s" % ((e["at_ms"] - t0) / 1000, e["epoch"], e["committed_step"], e["kind"], e["device"][:18], e["detail"]))
PY
check "every recovery resumed training" \
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); k=[e["kind"] for e in j["events"]]; assert k.count("resumed")>=3, k' "$d/status.json"
cl_job export "$JOB" --out "$d/export" >/dev/null; rc=$?
check "the committed checkpoint exports" test $rc -eq 0
check "the reference run reached step $C" cl_poll 600 test -s "$d/ref/step-$C/manifest.json"
kill $REF 2>/dev/null; wait $REF; REF=
check "the model equals skyloom train's at step $C, byte for byte" \
    cmp -s "$d/export/model.safetensors" "$d/ref/step-$C/model.safetensors"
check "the per-step losses up to step $C equal skyloom train's, one row per step" \
    bash -c '[ "$(tail -n +2 "$0" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,2)" ]' \
    "$d/coord/jobs/$JOB/metrics.csv" "$d/ref/metrics.csv" "$C"
curl -s "http://$CL_HTTP/metrics" > "$d/metrics.txt"
check "/metrics counts the devices lost and the recoveries" \
    bash -c 'grep -q "^skyloom_job_devices_lost_total{job_id=\"$1\"} [3-9]" "$0" && grep -q "^skyloom_job_recoveries_total{job_id=\"$1\"} [3-9]" "$0"' \
    "$d/metrics.txt" "$JOB"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
