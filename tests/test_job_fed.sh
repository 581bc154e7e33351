#!/usr/bin/env bash
# A federated job end to end on loopback: a coordinator and four device
# processes, two of them data owners with shards of their own (one
# vocabulary). Under --sync step with codec none, sealed, the job's exported
# model.safetensors and its per-step losses equal `skyloom train --data A
# --data B --owner-batch ... --sync step` byte for byte; the devices of
# different replicas exchanged sync payloads and no frame was refused.
# Under --sync outer:H with int8 payloads the model equals the trainer's too
# (the replicas hold the same bytes after the last outer step, every
# replica's part committed). Devices lost during a --sync step job: the job
# re-plans from the committed step (waiting for the owner) and every
# replica's parameters and the losses still equal the trainer's. An owner
# lost during an outer:H job with int8: the other replica goes on, the owner
# back rejoins at a committed outer step, and the job equals `skyloom train
# --owner-absent` over the window the coordinator recorded. A federation of
# classifiers (--task classify, the owners' shards of one labels.txt) equals
# the trainer's the same way.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-jobfed-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
REF=
trap '[ -n "$REF" ] && kill $REF 2>/dev/null && wait $REF; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

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
# the same halves labelled (each line's class its line number mod 3), one labels.txt
sed 's/}$/, "num_labels": 3}/' "$d/cfg.json" > "$d/cls.json"
printf 'x\ny\nz\n' > "$d/labels.txt"
for o in a b; do
  awk 'NF >= 3 { gsub(/\t/, " "); print substr("xyz", NR % 3 + 1, 1) "\t" $0 }' "$d/$o.txt" > "$d/$o.tsv"
  "$SK" -q data prepare --labels --vocab "$d/vocab.txt" --label-vocab "$d/labels.txt" --in "$d/$o.tsv" \
      --out "$d/t$o.shard" --seq 24 >/dev/null || exit 1
done

cl_start || exit 1
# the owners' policy lets the plain chains below send their labels out
cl_device dev1 lab-a --threads 1 --data "wiki=$d/a.shard" --data "topics=$d/ta.shard" \
    --allow-labels-out || exit 1; A=$CL_ID
cl_device dev2 lab-b --threads 1 --data "news=$d/b.shard" --data "topics=$d/tb.shard" \
    --allow-labels-out || exit 1; B=$CL_ID
cl_device dev3 lab-a --threads 1 || exit 1; C=$CL_ID
cl_device dev4 lab-b --threads 1 || exit 1; D=$CL_ID
cl_wait_online 4 || exit 1

STEPS=12
common=(--owner-batch 4,8 --micro-batches 2 --lr 2e-3)

# fedjob NAME REF [submit and train args]: the reference run into REF, then
# the job on the four devices (SUBMIT_ONLY: arguments of the submit alone;
# CFG the config, SA and SB the owners' shards, DA and DB their datasets'
# names); its id in JOB
fedjob() {
  local name=$1 ref=$2; shift 2
  "$SK" -q train --config "${CFG:-$d/cfg.json}" "${common[@]}" --steps $STEPS --data "${SA:-$d/a.shard}" \
      --data "${SB:-$d/b.shard}" "$@" --save "$ref" >/dev/null 2>&1
  out=$(cl_job submit --config "${CFG:-$d/cfg.json}" "${common[@]}" --steps $STEPS --data "$A:${DA:-wiki}" \
        --data "$B:${DB:-news}" --algo even \
        --checkpoint-every 6 --devices "$A,$B,$C,$D" --json ${SUBMIT_ONLY:-} "$@" 2>&1)
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

# sync_bytes JOBCSV REFCSV H [LAST]: the job's metrics.csv (up to step LAST)
# against the trainer's: the payloads its stages sent for the sync
# (sync_raw_bytes) are the trainer's sync_bytes (and SYNC_EXTRA) at every
# step that is a multiple of H, more bytes as frames; 0 at every other step;
# each replica's loss is the trainer's
sync_bytes() {
  SYNC_EXTRA=${SYNC_EXTRA:-0} python3 - "$@" <<'PY'
import csv, os, sys
extra = int(os.environ["SYNC_EXTRA"])
job, ref, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
last = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 62
J = [r for r in csv.DictReader(open(job)) if int(r["step"]) <= last]
R = {int(r["step"]): r for r in csv.DictReader(open(ref)) if int(r["step"]) <= last}
assert J and len(J) == len(R), (len(J), len(R))
for r in J:
    s = int(r["step"])
    raw, wire, want = int(r["sync_raw_bytes"]), int(r["sync_wire_bytes"]), int(R[s]["sync_bytes"])
    if s % every:
        assert raw == 0 and wire == 0 and want == 0, (s, raw, wire, want)
    else:
        assert raw > 0 and raw == want + extra and wire > raw, (s, raw, wire, want, extra)
    assert r["replica_loss"] == "%s;%s" % (R[s]["loss_0"], R[s]["loss_1"]), (s, r["replica_loss"])
print("     sync bytes per step: %s" % " ".join("%s/%s" % (r["sync_raw_bytes"], r["sync_wire_bytes"]) for r in J[:every + 1]))
PY
}

fedjob step "$d/ref-step" --sync step
check "step: metrics.csv's sync bytes at every step are skyloom train's sync_bytes (frames larger), each replica's loss the trainer's" \
    sync_bytes "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-step/metrics.csv" 1
check "step: job watch shows each replica (owner, dataset, stages, devices) and per step each replica's loss and the sync bytes" \
    bash -c 'grep -q "^replica=0 owner=$1 dataset=wiki stages=0-[0-9]* devices=$1" "$0" &&
             grep -q "^replica=1 owner=$2 dataset=news stages=[0-9]*-[0-9]* devices=$2" "$0" &&
             [ "$(grep -c "^step=.* replica_loss=r0:[0-9.]*,r1:[0-9.]* sync_raw=[1-9][0-9]* sync_wire=[1-9]" "$0")" = '$STEPS' ]' \
    "$d/step.watch" "$A" "$B"
cl_job status "$JOB" > "$d/step.status"
cl_job status "$JOB" --json > "$d/step.status.json"
status_replicas() {
  grep -q "^  replica 0  owner $A  loss [0-9.]*  sync: [1-9][0-9]* B raw, [1-9][0-9]* B on the wire" "$d/step.status" &&
    grep -q "^  replica 1  owner $B  loss" "$d/step.status" &&
    python3 - "$d/step.status.json" "$A" "$B" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
last = j["metrics_csv"].strip().split("\n")[-1].split(",")
st, reps = j["last_step"]["stages"], j["last_step"]["replicas"]
assert sum(s["sync"]["raw_bytes"] for s in st) == int(last[16]) > 0, last
assert sum(r["sync_wire_bytes"] for r in reps) == int(last[17]), last
assert [r["owner"] for r in reps] == sys.argv[2:4], reps
PY
}
check "step: job status shows each replica's loss and sync bytes; its stages' sync bytes add up to the last row's" \
    status_replicas
curl -s -o "$d/step.html" "http://$CL_HTTP/job/$JOB"
curl -s -o "$d/step.metrics" "http://$CL_HTTP/metrics"
dash_replicas() {
  local f=$d/step.html m=$d/step.metrics r raw wire
  grep -q '<table id="replicas">' "$f" && [ "$(grep -c '<tr class="replica">' "$f")" = 2 ] &&
    grep '<tr class="replica">' "$f" | head -1 | grep -q "<code>$A</code>" &&
    grep '<tr class="replica">' "$f" | tail -1 | grep -q "<code>$B</code>" || return 1
  for r in 0 1; do
    raw=$(grep "^skyloom_job_sync_bytes_total{job_id=\"$JOB\",replica=\"$r\",encoding=\"raw\"}" "$m" | cut -d" " -f2)
    wire=$(grep "^skyloom_job_sync_bytes_total{job_id=\"$JOB\",replica=\"$r\",encoding=\"wire\"}" "$m" | cut -d" " -f2)
    [ "${raw:-0}" -gt 0 ] && [ "${wire:-0}" -gt "$raw" ] || return 1
  done
}
check "step: the dashboard's job page has a row per replica (owner, devices); /metrics counts each replica's sync bytes" \
    dash_replicas
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
# the logs of the devices the plan placed
declare -A LOG_OF=([$A]=dev1 [$B]=dev2 [$C]=dev3 [$D]=dev4)
planned=()
for id in $(python3 -c 'import json,sys; print(" ".join(sorted({s["device"] for s in json.load(open(sys.argv[1]))["plan"]["stages"]})))' "$d/step.submit"); do
  planned+=("$d/${LOG_OF[$id]}.log")
done
for f in "${planned[@]}"; do
  # a device logs its end of the job after the coordinator has seen it done
  cl_poll 30 grep -q "job done here job=$JOB" "$f"
  echo "     $(basename "$f" .log): $(grep "job done here job=$JOB" "$f" | grep -o 'received=.*')"
done
check "step: every device of the plan (${#planned[@]}) received sync payloads from the other replica" \
    bash -c 'for f in "${@:2}"; do grep "job done here job=$0" "$f" | grep -q "sync:[1-9]" || exit 1; done' "$JOB" "${planned[@]}"
check "step: the plan seals the links; every device sent sync frames (each larger than its payload)" \
    bash -c 'python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"plan\"][\"sealed\"] is not True)" "$1" &&
             for f in "${@:2}"; do
               l=$(grep "job done here job=$0" "$f"); r=$(grep -o "sync_raw=[0-9]*" <<<"$l" | cut -d= -f2); w=$(grep -o "sync_wire=[0-9]*" <<<"$l" | cut -d= -f2)
               [ "${r:-0}" -gt 0 ] && [ "$w" -gt "$r" ] || exit 1; done' "$JOB" "$d/step.submit" "${planned[@]}"
check "step: metrics.csv's sync bytes add up to what the devices counted sending (raw and as frames)" \
    bash -c 'for k in raw wire; do
               dev=$(cat "${@:2}" | grep "job done here job=$0" | grep -o "sync_$k=[0-9]*" | cut -d= -f2 | paste -sd+ | bc)
               col=$([ $k = raw ] && echo 17 || echo 18)
               csv=$(tail -n +2 "$1" | cut -d, -f$col | paste -sd+ | bc)
               [ -n "$dev" ] && [ "$dev" = "$csv" ] || exit 1; done' "$JOB" "$d/coord/jobs/$JOB/metrics.csv" "${planned[@]}"

fedjob outer "$d/ref-outer" --sync outer:3 --codec-sync int8
check "outer: metrics.csv's sync bytes are 0 between outer steps, at outer steps skyloom train's sync_bytes" \
    sync_bytes "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-outer/metrics.csv" 3

# replicas_equal DIR: every parameter in replica 0's model parts has the same
# bytes in replica 1's, and the two cover the same tensors
replicas_equal() {
  python3 - "$1" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
rep = [{}, {}]
for f in m["files"]:
    if not f["name"].startswith("model."):
        continue
    raw = open(os.path.join(d, f["name"]), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    for k, v in hdr.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            rep[f["replica"]][k] = raw[8 + n + a:8 + n + b]
assert rep[0] and rep[0] == rep[1], sorted(k for k in rep[0] if rep[0].get(k) != rep[1].get(k))[:5]
PY
}
check "outer: at the last (outer) step both replicas' committed parts hold the same parameter bytes" \
    replicas_equal "$d/coord/jobs/$JOB/ckpt/step-$STEPS"

# plain chains: a replica whose head is not on its owner's device gives its
# tied copy the word embeddings' result over its side link
SUBMIT_ONLY=--no-u-shape fedjob chain "$d/ref-chain" --sync step
split=$(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["plan"]
print(sum(p["stages"][r["first_stage"]]["device"] != p["stages"][r["first_stage"] + r["stages"] - 1]["device"] for r in p["replicas"]))' "$d/chain.submit")
echo "     chain: replicas whose head is on another device than their embeddings: $split"
# the trainer counts each payload once; on the network the word embeddings'
# goes both to the other replica's embeddings and to its head (the tied
# copy) where they are on two devices: vocabulary x hidden 32 x 4 bytes more
# for each such replica
SYNC_EXTRA=$((split * CL_VOCAB * 32 * 4)) check "chain: metrics.csv's sync bytes at every step are skyloom train's sync_bytes and the word embeddings' payload to each head apart" \
    sync_bytes "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-chain/metrics.csv" 1

# a federation of classifiers (--task classify): the owners' labelled shards
# of one labels.txt; the job equals the trainer's federation, and its export
# names the owners' labels
CFG=$d/cls.json SA=$d/ta.shard SB=$d/tb.shard DA=topics DB=topics fedjob classify "$d/ref-cls" \
    --sync step --task classify
check "classify: the plan's options say classify; the export's config.json is the trainer's checkpoint's" \
    bash -c 'python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"plan\"][\"options\"][\"task\"] != \"classify\")" "$0" &&
             cmp -s "$1/config.json" "$2/step-'$STEPS'/config.json"' "$d/classify.submit" "$d/classify.export" "$d/ref-cls"

check "no frame refused, no pipeline stopped" bash -c '! grep -H "frame refused\|pipeline stopped" "$0"/dev*.log' "$d"

# Devices lost during a job. The job is sized so that it cannot end while
# the test runs: once a step is committed after the recoveries it is stopped,
# and its committed checkpoint is compared with the trainer's at that step
# (which saves every checkpoint step, in the background meanwhile): each
# replica's parameters (the trainer's replica 0 in model.safetensors, the
# others in fed.safetensors under outer:H) and the per-step losses.
# replicas_as_trainer JOBDIR TRAINERDIR
replicas_as_trainer() {
  python3 - "$1" "$2" <<'PY'
import json, os, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in hdr.items() if k != "__metadata__"}
job, ref = sys.argv[1:3]
m = json.load(open(os.path.join(job, "manifest.json")))
rep = {}
for f in m["files"]:
    if f["name"].startswith("model."):
        rep.setdefault(f["replica"], {}).update(tensors(os.path.join(job, f["name"])))
model = tensors(os.path.join(ref, "model.safetensors"))
fed = tensors(os.path.join(ref, "fed.safetensors")) if os.path.exists(os.path.join(ref, "fed.safetensors")) else {}
assert sorted(rep) == [0, 1], sorted(rep)
for r, got in rep.items():
    assert sorted(got) == sorted(model), (r, sorted(set(got) ^ set(model))[:4])
    for k, v in got.items():
        want = fed.get("replica.%d.%s" % (r, k), model[k]) if r else model[k]
        assert v == want, (r, k)
PY
}

BIG=100000
# lost_run NAME EVERY KILL_MID [sync args]: a job checkpointed every EVERY
# steps; KILL_MID 1: first a device of the plan that is no owner's (when the
# balancer placed one), then the owner of replica 1 (its replica pauses, the
# job waits for it)
lost_run() {
  local name=$1 every=$2 kill_mid=$3; shift 3
  "$SK" -q train --config "$d/cfg.json" "${common[@]}" --steps $BIG --data "$d/a.shard" --data "$d/b.shard" --warmup 5 \
      --save-every "$every" --save "$d/ref-$name" "$@" >/dev/null 2>&1 &
  REF=$!
  out=$(cl_job submit --config "$d/cfg.json" "${common[@]}" --steps $BIG --data "$A:wiki" --data "$B:news" --algo even \
        --warmup 5 --checkpoint-every "$every" --devices "$A,$B,$C,$D" --json "$@" 2>&1)
  JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  echo "$out" > "$d/$name.submit"
  check "$name: submitted and running" bash -c '[ -n "$0" ] && grep -q "\"state\": \"running\"" "$1"' "$JOB" "$d/$name.submit"
  jq_() { cl_jq "$JOB" "$1"; }
  state_is() { [ "$(jq_ 'j["state"]')" = "$1" ]; }
  local MID
  MID=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plan"]; o={r["owner"] for r in p["replicas"]}; v=[s["device"] for s in p["stages"] if s["device"] not in o]; print(v[0] if v else "")' "$d/$name.submit")
  check "$name: the job trains in epoch 1" cl_poll 120 cl_progress "$JOB" 1 $((every + 1))
  E=1
  if [ "$kill_mid" = 1 ] && [ -n "$MID" ]; then
    echo "     SIGKILL ${LOG_OF[$MID]} ($MID, no owner) at step $(jq_ 'j["step"]')"
    cl_kill9 "${LOG_OF[$MID]}"
    check "$name: the job trains again in epoch 2" cl_poll 300 cl_progress "$JOB" 2 2
    cl_job status "$JOB" --json > "$d/$name.2.json"
    check "$name: epoch 2's plan leaves the lost device out, two replicas still" \
        python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plan"]; assert all(s["device"] != sys.argv[2] for s in p["stages"]) and len(p["replicas"]) == 2' "$d/$name.2.json" "$MID"
    E=$(jq_ 'j["epoch"]')
    cl_restart "${LOG_OF[$MID]}"
  elif [ "$kill_mid" = 1 ]; then
    echo "     the balancer placed the owners alone: no other device to lose"
  fi
  echo "     SIGKILL dev2 ($B, the owner of replica 1) at step $(jq_ 'j["step"]')"
  cl_kill9 dev2
  check "$name: without the owner of replica 1 the job waits" cl_poll 120 state_is waiting
  cl_restart dev2
  check "$name: the owner back, the job trains again in epoch $((E + 1))" cl_poll 300 cl_progress "$JOB" $((E + 1))
  # (a job that ended stops the wait: it will not commit)
  committed_after() {
    local v
    v=$(jq_ '"end" if j["state"] in ("done", "failed", "stopped") else int(j["epoch"] >= '"$((E + 1))"' and j["committed_step"] >= j["plan"]["start_step"] - 1 + '"$every"')')
    [ "$v" = end ] && { echo "     the job ended: $(jq_ 'j["state"], j["reason"]')"; CL_POLL_STOP=1; }
    [ "$v" = 1 ]
  }
  check "$name: a step is committed after the recovery" cl_poll 300 committed_after
  cl_job stop "$JOB" >/dev/null
  check "$name: stopped" cl_poll 60 state_is stopped
  S=$(jq_ 'j["committed_step"]')
  echo "     stopped; committed step $S"
  check "$name: the trainer reached step $S" cl_poll 600 test -s "$d/ref-$name/step-$S/manifest.json"
  kill $REF 2>/dev/null; wait $REF 2>/dev/null; REF=
  check "$name: each replica's parameters at step $S equal skyloom train's, byte for byte" \
      replicas_as_trainer "$d/coord/jobs/$JOB/ckpt/step-$S" "$d/ref-$name/step-$S"
  check "$name: the per-step losses up to step $S equal skyloom train's, one row per step" \
      bash -c '[ "$(tail -n +2 "$0" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,2)" ]' \
      "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-$name/metrics.csv" "$S"
  check "$name: metrics.csv's sync bytes up to step $S are skyloom train's, before and after the recoveries" \
      sync_bytes "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-$name/metrics.csv" "$SYNC_EVERY" "$S"
  cl_wait_online 4
}
SYNC_EVERY=1 lost_run lost 5 1 --sync step

# An owner away under outer:4 with int8, committed every 4 (every commit an
# outer step): the owner of replica 1 killed, the other replica goes on (its
# committed step advances); the owner restarted, its replica rejoins at a
# committed outer step; once an outer step is committed with it, the job is
# stopped and compared with `skyloom train --owner-absent 1:S-E`, the window
# read from the coordinator's events (the step after the last one committed
# with the owner, and the outer step it rejoined from), whatever the timing.
away_run() {
  local name=away every=4
  out=$(cl_job submit --config "$d/cfg.json" "${common[@]}" --steps $BIG --data "$A:wiki" --data "$B:news" --algo even \
        --warmup 5 --checkpoint-every $every --devices "$A,$B,$C,$D" --json --sync outer:4 --codec-sync int8 2>&1)
  JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  echo "$out" > "$d/$name.submit"
  check "$name: submitted and running" bash -c '[ -n "$0" ] && grep -q "\"state\": \"running\"" "$1"' "$JOB" "$d/$name.submit"
  jq_() { cl_jq "$JOB" "$1"; }
  state_is() { [ "$(jq_ 'j["state"]')" = "$1" ]; }
  ended() { [ "$(jq_ 'int(j["state"] in ("done", "failed", "stopped"))')" = 1 ] && { echo "     the job ended: $(jq_ 'j["state"], j["reason"]')"; CL_POLL_STOP=1; }; }
  committed_ge() { ended && return 1; [ "$(jq_ 'int(j["committed_step"] >= '"$1"')')" = 1 ]; }
  check "$name: a step is committed in epoch 1" cl_poll 120 committed_ge $every
  echo "     SIGKILL dev2 ($B, the owner of replica 1) at step $(jq_ 'j["step"]'), committed $(jq_ 'j["committed_step"]')"
  cl_kill9 dev2
  away_planned() { ended && return 1; [ "$(jq_ 'int(j["state"] == "running" and bool(j["plan"]["replicas"][1].get("away")) and any(e["kind"] == "away" for e in j["events"]))')" = 1 ]; }
  check "$name: without the owner of replica 1 the job runs on, replica 1 away in its plan" cl_poll 120 away_planned
  cl_job status "$JOB" > "$d/$name.status"
  check "$name: job status says replica 1's owner is away" grep -q "replica 1: owner $B away" "$d/$name.status"
  local S0
  S0=$(jq_ '[e for e in j["events"] if e["kind"] == "away"][-1]["committed_step"] + 1')
  check "$name: the other replica's committed step advances past an outer step while the owner is away" \
      cl_poll 300 committed_ge $((S0 - 1 + every))
  local waited
  waited=$(jq_ 'int(any(e["kind"] == "waiting" for e in j["events"]))')
  check "$name: the job did not wait for the owner" test "$waited" = 0
  cl_restart dev2
  rejoined() { ended && return 1; [ "$(jq_ 'int(j["state"] == "running" and bool(j["plan"]["replicas"][1].get("rejoin")) and any(e["kind"] == "returned" for e in j["events"]))')" = 1 ]; }
  check "$name: the owner back, its replica rejoins (plan: rejoin)" cl_poll 300 rejoined
  local E
  E=$(jq_ '[e for e in j["events"] if e["kind"] == "returned"][-1]["committed_step"]')
  check "$name: it rejoined at an outer step (committed step $E, outer:4)" test $((E % 4)) = 0 -a "$E" -ge "$S0"
  check "$name: an outer step is committed with it back" cl_poll 300 committed_ge $((E + every))
  cl_job stop "$JOB" >/dev/null
  check "$name: stopped" cl_poll 60 state_is stopped
  S=$(jq_ 'j["committed_step"]')
  echo "     owner away from step $S0 to $E; stopped, committed step $S"
  "$SK" -q train --config "$d/cfg.json" "${common[@]}" --steps $BIG --data "$d/a.shard" --data "$d/b.shard" --warmup 5 \
      --save-every $every --stop-at "$S" --save "$d/ref-$name" --sync outer:4 --codec-sync int8 \
      --owner-absent "1:$S0-$E" >/dev/null 2>"$d/ref-$name.err"
  check "$name: skyloom train --owner-absent 1:$S0-$E reached step $S" test -s "$d/ref-$name/step-$S/manifest.json"
  check "$name: each replica's parameters at step $S equal the trainer's, byte for byte" \
      replicas_as_trainer "$d/coord/jobs/$JOB/ckpt/step-$S" "$d/ref-$name/step-$S"
  check "$name: at step $S (an outer step) both replicas' committed parts hold the same bytes" \
      replicas_equal "$d/coord/jobs/$JOB/ckpt/step-$S"
  check "$name: the per-step losses up to step $S equal the trainer's, one row per step" \
      bash -c '[ "$(tail -n +2 "$0" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,2)" ]' \
      "$d/coord/jobs/$JOB/metrics.csv" "$d/ref-$name/metrics.csv" "$S"
  check "$name: the devices' parts held the sync state (fed.DEVICE-uUNIT.safetensors)" \
      bash -c 'ls "$0"/coord/jobs/"$1"/ckpt/step-*/fed.*-u0.safetensors >/dev/null 2>&1' "$d" "$JOB"
  cl_wait_online 4
}
away_run

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
