#!/usr/bin/env bash
# A federated job end to end on loopback: a coordinator and four device
# processes, two of them data owners with shards of their own (one
# vocabulary). Under --sync step with codec none, sealed, the job's exported
# model.safetensors and its per-step losses equal `skyloom train --data A
# --data B --owner-batch ... --sync step` byte for byte; the devices of
# different replicas exchanged sync payloads and no frame was refused.
# Under --sync outer:H with int8 payloads the model equals the trainer's too
# (the replicas hold the same bytes after the last outer step, every
# replica's part committed).
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-jobfed-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cl_shard "$src" || exit 1
# two owners' shards of one vocabulary: the corpus's first and second half
n=$(wc -l < "$d/corpus.txt")
head -n $((n / 2)) "$d/corpus.txt" > "$d/a.txt"
tail -n +$((n / 2 + 1)) "$d/corpus.txt" > "$d/b.txt"
for o in a b; do
  "$SK" -q data prepare --vocab "$d/vocab.txt" --in "$d/$o.txt" --out "$d/$o.shard" --seq 24 >/dev/null || exit 1
done
cl_config "$d/cfg.json" 32 3 48

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/a.shard" || exit 1; A=$CL_ID
cl_device dev2 lab-b --threads 1 --data "news=$d/b.shard" || exit 1; B=$CL_ID
cl_device dev3 lab-a --threads 1 || exit 1; C=$CL_ID
cl_device dev4 lab-b --threads 1 || exit 1; D=$CL_ID
cl_wait_online 4 || exit 1

STEPS=12
common=(--config "$d/cfg.json" --steps $STEPS --owner-batch 4,8 --micro-batches 2 --lr 2e-3)

# fedjob NAME REF [submit and train args]: the reference run into REF, then
# the job on the four devices; its id in JOB
fedjob() {
  local name=$1 ref=$2; shift 2
  "$SK" -q train "${common[@]}" --data "$d/a.shard" --data "$d/b.shard" "$@" --save "$ref" >/dev/null 2>&1
  out=$(cl_job submit "${common[@]}" --data "$A:wiki" --data "$B:news" --algo even \
        --checkpoint-every 6 --devices "$A,$B,$C,$D" --json "$@" 2>&1)
  local rc=$?
  echo "$out" > "$d/$name.submit"
  JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  check "$name: submitted, planned and running" bash -c 'test $0 -eq 0 && [ -n "$1" ] && grep -q "\"state\": \"running\"" "$2"' "$rc" "$JOB" "$d/$name.submit"
  cl_job watch "$JOB" > "$d/$name.watch"; rc=$?
  check "$name: job watch follows it to done" bash -c 'test $0 -eq 0 && grep -q "step='$STEPS' " "$1" && grep -q "done after" "$1"' "$rc" "$d/$name.watch"
  [ $rc -eq 0 ] || cl_jq "$JOB" 'j["state"], j["reason"]'
  cl_job export "$JOB" --out "$d/$name.export" >/dev/null; rc=$?
  check "$name: the exported model.safetensors equals skyloom train's, byte for byte" \
      bash -c 'test $0 -eq 0 && cmp -s "$1/model.safetensors" "$2/step-'$STEPS'/model.safetensors"' "$rc" "$d/$name.export" "$ref"
  check "$name: the per-step losses equal skyloom train's" \
      bash -c '[ "$(tail -n +2 "$0" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | cut -d, -f1,2)" ]' \
      "$d/coord/jobs/$JOB/metrics.csv" "$ref/metrics.csv"
}

fedjob step "$d/ref-step" --sync step
python3 - "$d/step.submit" "$A" "$B" > "$d/step.replicas" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["plan"]
reps = p["replicas"]
assert [r["owner"] for r in reps] == sys.argv[2:4], reps
devs = [set(s["device"] for s in p["stages"] if s["replica"] == r) for r in range(2)]
assert not devs[0] & devs[1], devs
print(" ".join(str(r["stages"]) for r in reps))
PY
check "step: two replicas, one per owner, no device in both ($(cat "$d/step.replicas") stages)" test -s "$d/step.replicas"
for dev in dev1 dev2 dev3 dev4; do
  recv=$(grep "job done here job=$JOB" "$d/$dev.log" | grep -o 'received=.*')
  echo "     $dev received: $recv"
done
check "step: every device received sync payloads from the other replica" \
    bash -c 'for f in "$0"/dev1.log "$0"/dev2.log "$0"/dev3.log "$0"/dev4.log; do grep "job done here job=$1" "$f" | grep -q "sync:[1-9]" || exit 1; done' "$d" "$JOB"
check "step: the plan seals the links; every device sent sync frames (each larger than its payload)" \
    bash -c 'python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"plan\"][\"sealed\"] is not True)" "$0/step.submit" &&
             for f in "$0"/dev1.log "$0"/dev2.log "$0"/dev3.log "$0"/dev4.log; do
               l=$(grep "job done here job=$1" "$f"); r=$(grep -o "sync_raw=[0-9]*" <<<"$l" | cut -d= -f2); w=$(grep -o "sync_wire=[0-9]*" <<<"$l" | cut -d= -f2)
               [ "${r:-0}" -gt 0 ] && [ "$w" -gt "$r" ] || exit 1; done' "$d" "$JOB"

fedjob outer "$d/ref-outer" --sync outer:3 --codec-sync int8

check "no frame refused, no pipeline stopped" bash -c '! grep -H "frame refused\|pipeline stopped" "$0"/dev*.log' "$d"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
