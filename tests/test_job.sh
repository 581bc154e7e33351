#!/usr/bin/env bash
# Federated jobs end to end on loopback: a coordinator and three device
# processes. A job of 3 stages (codec none, sealed) ends with the same
# model.safetensors bytes and losses as `skyloom train` with the same config,
# data, seed, batch and micro-batches; the device holding neither the data
# nor unit 0 or the head never receives labels; a job on a dataset the owner
# refuses fails at submit with the owner's reason; the plan is signed. A
# classification job (--task classify) on a labelled shard equals `skyloom
# train --task classify` the same way, its export (config.json too) the
# checkpoint's, and predict loads the export folder; the owner refuses a
# config whose classes are its labels in another order, and a shard without
# labels.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-job-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cl_shard "$src" || exit 1
V=$CL_VOCAB
cl_config "$d/cfg.json" 32 3 48
sed "s/\"vocab_size\": $V/\"vocab_size\": 50/" "$d/cfg.json" > "$d/small.json"
# a labelled shard of the same text: each line's class its line number mod 3
sed 's/}$/, "num_labels": 3}/' "$d/cfg.json" > "$d/cls.json"
awk 'NF >= 3 { gsub(/\t/, " "); print substr("xyz", NR % 3 + 1, 1) "\t" $0 }' "$d/corpus.txt" > "$d/topics.tsv"
"$SK" -q data prepare --labels --vocab "$d/vocab.txt" --in "$d/topics.tsv" --out "$d/topics.shard" --seq 24 >/dev/null ||
    { echo "FAIL the labelled shard"; exit 1; }

cl_start || exit 1
# the owner's policy lets the plain chain below send its labels out
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" --data "topics=$d/topics.shard" \
    --allow-labels-out || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; MID=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; LAST=$CL_ID
cl_wait_online 3 || exit 1
check "a device started without OMP_WAIT_POLICY runs with it passive" \
    bash -c 'tr "\0" "\n" < /proc/$0/environ | grep -qx OMP_WAIT_POLICY=passive' "${CL_PID_OF[dev1]}"

"$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 20 --batch 8 --micro-batches 4 \
    --lr 2e-3 --save "$d/ref" >/dev/null 2>&1

# job NAME DEVICES [submit args]: a 20-step job like the reference run
# (REF; CFG its config, DATA its dataset); its id in JOB, its submit output
# in $d/NAME.submit
job() {
  local name=$1 devs=$2; shift 2
  out=$(cl_job submit --config "${CFG:-$d/cfg.json}" --data "$OWNER:${DATA:-wiki}" --steps 20 --batch 8 \
        --micro-batches 4 --algo even --checkpoint-every 10 --devices "$devs" --lr 2e-3 --json "$@" 2>&1)
  local rc=$?
  echo "$out" > "$d/$name.submit"
  JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  check "$name: submitted, planned and running" bash -c 'test $0 -eq 0 && [ -n "$1" ] && grep -q "\"state\": \"running\"" "$2"' "$rc" "$JOB" "$d/$name.submit"
  cl_job watch "$JOB" > "$d/$name.watch"; rc=$?
  check "$name: job watch follows it to done" bash -c 'test $0 -eq 0 && grep -q "step=20 " "$1" && grep -q "done after" "$1"' "$rc" "$d/$name.watch"
  cl_job export "$JOB" --out "$d/$name.export" >/dev/null; rc=$?
  check "$name: the exported model.safetensors equals skyloom train's, byte for byte" \
      bash -c 'test $0 -eq 0 && cmp -s "$1/model.safetensors" "$2/step-20/model.safetensors"' "$rc" "$d/$name.export" "$REF"
  check "$name: the per-step losses equal skyloom train's" \
      bash -c '[ -s "$0" ] && [ "$(tail -n +2 "$0" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | cut -d, -f1,2)" ]' \
      "$d/coord/jobs/$JOB/metrics.csv" "$REF/metrics.csv"
}
REF=$d/ref # the skyloom train run a job is compared with
# stage I of the submit output's plan is on device ID
stage_on() { python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plan"]; sys.exit(p["stages"][int(sys.argv[2])]["device"] != sys.argv[3])' "$@"; }
export -f stage_on
nstages() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["plan"]["stages"]))' "$1"; }

# three devices, the default U-shaped chain: the owner holds the first and the last stage
job u3 "$OWNER,$MID,$LAST"
p=$(nstages "$d/u3.submit")
check "u3: 4 stages, the data owner first and last" \
    bash -c 'test "$0" = 4 && stage_on "$1" 0 "$2" && stage_on "$1" 3 "$2"' "$p" "$d/u3.submit" "$OWNER"
cl_job status "$JOB" --json > "$d/u3.status"
check "u3: job status --json: committed step 20, the plan, per-stage and per-link figures" \
    bash -c 'grep -q "\"committed_step\": 20" "$0" && grep -q "\"busy\"" "$0" && grep -q "\"wire_bytes\"" "$0" && grep -q "\"predicted_iteration_s\"" "$0"' "$d/u3.status"
# lab-a has one device, lab-b two: lab-a to lab-b is measured by one device
# (both of the other side's), lab-b inside by one of its two
check "u3: each pair of sites measured by one device, every pair of devices once (RTT and bandwidth)" \
    python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["profiles"]
pairs = sorted(tuple(sorted((k, l["peer"]))) for k, v in p.items() for l in v["links"])
assert len(p) == 3 and pairs == sorted(set(pairs)) and len(pairs) == 3, pairs
assert all(l["rtt_s"] > 0 and l["bandwidth_Bps"] > 0 for v in p.values() for l in v["links"]), p
assert sorted(len(v["links"]) for v in p.values()) == [0, 1, 2], p
assert len(p[sys.argv[2]]["links"]) == 2, p
' "$d/u3.status" "$OWNER"
check "u3: the plan knows the three devices share this machine's cores and loopback (one cpu pool, one core each)" \
    python3 -c 'import json,os,sys; st=json.load(open(sys.argv[1]))["plan"]["balancer"]["stages"]; cp=[s["cpu_pool"] for s in st]; sys.exit(not (len({c["name"] for c in cp}) == 1 and len({c["net_ns"] for c in cp}) == 1 and all(c["pool_cpus"] == os.cpu_count() and c["cpus"] == 1 for c in cp)))' "$d/u3.status"
check "u3: the plan's optimizer steps are the devices' measured ones (per unit, and summed per stage)" \
    python3 -c '
import json, sys
st = json.load(open(sys.argv[1]))
prof = st["profiles"]
for s in st["plan"]["balancer"]["stages"]:
    meas = prof[s["device"]]["unit_optim_s"][s["first_unit"]:s["last_unit"] + 1]
    assert len(s["unit_optim_s"]) == len(meas) and all(abs(a - b) <= 1e-6 * b for a, b in zip(s["unit_optim_s"], meas)), (s, meas)
    assert abs(s["optim_s"] - sum(meas)) <= 1e-6 * sum(meas), s
' "$d/u3.status"
check "u3: frames were sealed (wire bytes exceed raw bytes on every link)" \
    bash -c 'tail -1 "$0" | awk -F, "{n=split(\$10,r,\";\"); split(\$11,w,\";\"); for(i=1;i<=n;i++) if (w[i]+0 <= r[i]+0) exit 1}"' \
    "$d/coord/jobs/$JOB/metrics.csv"
U3=$JOB
check "u3: every device measured its links in one task and timed its units in the next" \
    bash -c 'for f in "$0"/dev1.log "$0"/dev2.log "$0"/dev3.log; do grep "task done job=$1 kind=profile" "$f" | sed "s/.*round=//" | tr "\n" " " | grep -qx "links units " || exit 1; done' "$d" "$JOB"
# skyloom status: each device's latest job profile (5 units: embeddings, 3 layers, head;
# micro-batch 8/4 of 24 tokens; the links it measured).
# profiled FILE JOB DEVS CANDIDATES: the devices DEVS (a,b) last profiled for JOB, whose
# candidates were CANDIDATES
"$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" --json > "$d/status.json"
"$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" > "$d/status.txt"
profiled() {
  python3 - "$@" <<'PY'
import json, sys
st, job = json.load(open(sys.argv[1])), sys.argv[2]
devs = {d["device_id"]: d["job_profile"] for d in st["devices"]}
cands = set(sys.argv[4].split(","))
for dev in sys.argv[3].split(","):
    p = devs[dev]
    assert p and p["job_id"] == job and "failed" not in p, (dev, p)
    assert p["micro_batch"] == 2 and p["seq"] == 24 and p["threads"] == 1 and p["memory_bytes"] > 0, p
    assert len(p["unit_fwd_s"]) == 5 and all(x > 0 for x in p["unit_fwd_s"] + p["unit_bwd_s"]), p
    assert len(p["unit_bwd_s"]) == 5, p
    assert len(p["unit_optim_s"]) == 5 and all(x > 0 for x in p["unit_optim_s"]), p
    peers = [l["peer"] for l in p["links"]]
    assert set(peers) <= cands - {dev} and len(set(peers)) == len(peers), (dev, peers)
    assert all(l["rtt_s"] > 0 and l["bandwidth_Bps"] > 0 for l in p["links"]), p
PY
}
export -f profiled
check "status --json: every device's profile for u3 (per-unit seconds, memory, its links)" \
    profiled "$d/status.json" "$U3" "$OWNER,$MID,$LAST" "$OWNER,$MID,$LAST"
check "status: the profiles in text (forward, backward and optimizer ms per unit, links)" \
    bash -c '[ "$(grep -c "  job $1, " "$0")" = 3 ] && [ "$(grep -c "forward  *ms:" "$0")" = 3 ] && [ "$(grep -c "backward  *ms:" "$0")" = 3 ] && [ "$(grep -c "optimizer  *ms:" "$0")" = 3 ] && [ "$(grep -c "link to d.*rtt .* ms, .* MB/s" "$0")" = 3 ]' \
    "$d/status.txt" "$U3"
for dev in dev2 dev3; do
  # the device logs its end of the job after the coordinator has seen it done
  cl_poll 30 grep -q "job done here job=$JOB" "$d/$dev.log" ||
    { echo "     $dev's last lines:"; tail -5 "$d/$dev.log" | sed 's/^/       /'; }
  recv=$(grep "job done here job=$JOB" "$d/$dev.log" | grep -o 'received=.*')
  echo "     $dev (neither the data owner nor unit 0 or the head) received: $recv"
  check "u3: $dev received activations and masks, no labels, no tied gradient" \
      bash -c 'grep -q "act:[1-9]" <<<"$0" && grep -q "labels:0," <<<"$0" && grep -q "tied:0," <<<"$0"' "$recv"
done
check "the exported model evaluates" \
    bash -c '"$0" -q eval --config "$1/u3.export/config.json" --model "$1/u3.export/model.safetensors" --data "$1/text.shard" --batches 2 >/dev/null' "$SK" "$d"

# two devices: the data owner holds both ends, the other the middle
job u2 "$OWNER,$MID"
check "u2: 3 stages, the data owner first and last" \
    bash -c 'test "$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))[\"plan\"][\"stages\"]))" "$1")" = 3 && stage_on "$1" 0 "$0" && stage_on "$1" 2 "$0" && stage_on "$1" 1 "$2"' \
    "$OWNER" "$d/u2.submit" "$MID"
"$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" --json > "$d/status2.json"
check "status --json: the latest profile (u2's for the 2 devices it profiled, u3's for the third)" \
    bash -c 'profiled "$0" "$1" "$2,$3" "$2,$3" && profiled "$0" "$4" "$5" "$2,$3,$5"' \
    "$d/status2.json" "$JOB" "$OWNER" "$MID" "$U3" "$LAST"

# bf16 products: the job equals skyloom train --precision bf16 (a CPU with AVX512_BF16 or AMX)
bf16=$("$SK" --version | grep "cpu bf16")
if grep -q "precision bf16 available" <<<"$bf16"; then
  "$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 20 --batch 8 --micro-batches 4 \
      --lr 2e-3 --precision bf16 --save "$d/refbf16" >/dev/null 2>&1
  REF=$d/refbf16 job bf16 "$OWNER,$MID" --precision bf16
  check "bf16: the plan's options say bf16" \
      bash -c 'python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"plan\"][\"options\"][\"precision\"] != \"bf16\")" "$0"' "$d/bf16.submit"
else
  echo "skip bf16 job: this CPU has no bf16 products ($bf16)"
fi

# a classification job: the pooler and classifier on the data owner with
# the classes (the first and last stage), the same bytes and losses as
# skyloom train --task classify; the devices between receive no labels
"$SK" -q train --task classify --config "$d/cls.json" --data "$d/topics.shard" --steps 20 --batch 8 \
    --micro-batches 4 --lr 2e-3 --save "$d/refcls" >/dev/null 2>&1
REF=$d/refcls CFG=$d/cls.json DATA=topics job classify "$OWNER,$MID,$LAST" --task classify
check "classify: the plan's options say so, the data owner first and last" \
    bash -c 'python3 -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"plan\"][\"options\"][\"task\"] != \"classify\")" "$0" && stage_on "$0" 0 "$1" && stage_on "$0" 3 "$1"' \
    "$d/classify.submit" "$OWNER"
for dev in dev2 dev3; do
  check "classify: $dev received no labels" \
      cl_poll 30 bash -c 'grep "job done here job=$1" "$0" | grep -q "labels:0,"' "$d/$dev.log" "$JOB"
done
check "classify: the export's config.json is a BertForSequenceClassification of 3 labels" \
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(c["architectures"] != ["BertForSequenceClassification"] or c["num_labels"] != 3)' \
    "$d/classify.export/config.json"
check "classify: ... skyloom train's checkpoint's config.json byte for byte (the owner's labels as id2label)" \
    cmp -s "$d/classify.export/config.json" "$d/refcls/step-20/config.json"
text=$(awk 'NF >= 6 { print; exit }' "$d/corpus.txt")
p_ref=$("$SK" -q predict --config "$d/refcls/step-20/config.json" --model "$d/refcls/step-20/model.safetensors" \
        --vocab "$d/vocab.txt" --text "$text" --top-k 3 --json 2>&1)
p_dir=$("$SK" -q predict --model "$d/classify.export" --text "$text" --top-k 3 --json 2>&1)
check "classify: predict --model on the export folder gives the checkpoint's labels and scores" \
    bash -c '[ -n "$0" ] && [ "$0" = "$1" ] && grep -q "\"label\": \"[xyz]\"" <<<"$0"' "$p_ref" "$p_dir"

# a plain chain: the labels and the tied gradient cross to the last device
job chain "$OWNER,$MID,$LAST" --no-u-shape
# (whichever device the balancer gave the head: its log says what it received)
head_dev=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["plan"]["stages"][-1]["device"])' "$d/chain.submit" 2>/dev/null)
case $head_dev in "$MID") head_log=dev2 ;; "$LAST") head_log=dev3 ;; *) head_log=none ;; esac
check "chain: the head is off the owner ($head_log), and its device received the labels and the tied gradient" \
    cl_poll 30 bash -c '[ "$2" != none ] && grep "job done here job=$1" "$0" | grep -q "labels:[1-9][0-9]*,tied:[1-9]"' "$d/$head_log.log" "$JOB" "$head_log"
# (the lines themselves are printed when there are any: the directory is gone afterwards)
check "no frame refused, no pipeline stopped" bash -c '! grep -H "frame refused\|pipeline stopped" "$0"/dev*.log' "$d"

# job stop --at-checkpoint, then job resume: the same model and losses as an
# uninterrupted job (asked before the job trains, it stops at its first commit)
state_is() { [ "$(cl_jq "$1" 'j["state"]')" = "$2" ]; }
JOB=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 20 --batch 8 --micro-batches 4 \
      --algo even --checkpoint-every 10 --devices "$OWNER,$MID,$LAST" --lr 2e-3 --no-wait 2>/dev/null)
out=$(cl_job stop "$JOB" --at-checkpoint); rc=$?
check "stop --at-checkpoint: the job goes on to its next commit" \
    bash -c 'test $0 -eq 0 && grep -q "job $2 stops at its next commit" <<<"$1"' "$rc" "$out" "$JOB"
cl_poll 120 state_is "$JOB" stopped
cl_job status "$JOB" --json > "$d/stopped.json"
check "stop --at-checkpoint: stopped at its commit of step 10, nothing trained lost" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert (j["state"], j["committed_step"], j["reason"]) == ("stopped", 10, "stopped by the operator at its commit of step 10"), j["reason"]
' "$d/stopped.json"
out=$(cl_job resume "$JOB"); rc=$?
check "job resume: from step 11 of the same job, in a new epoch" \
    bash -c 'test $0 -eq 0 && grep -q "job $2 resumes from step 11 (committed)" <<<"$1"' "$rc" "$out" "$JOB"
out=$(cl_job resume "$JOB" 2>&1); rc=$?
check "job resume of a job that is not stopped or failed: refused" \
    bash -c 'test $0 -eq 1 && grep -q "only a stopped or failed job resumes" <<<"$1"' "$rc" "$out"
cl_job watch "$JOB" > "$d/resumed.watch"; rc=$?
cl_job export "$JOB" --out "$d/resumed.export" >/dev/null 2>&1
check "resumed: done, its model.safetensors equal to skyloom train's (and so an uninterrupted job's), byte for byte" \
    bash -c 'test $0 -eq 0 && grep -q "done after" "$1" && cmp -s "$2/model.safetensors" "$3/step-20/model.safetensors"' \
    "$rc" "$d/resumed.watch" "$d/resumed.export" "$d/ref"
check "resumed: the per-step losses equal skyloom train's, steps 1..20 once each" \
    bash -c '[ "$(tail -n +2 "$0" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | cut -d, -f1,2)" ]' \
    "$d/coord/jobs/$JOB/metrics.csv" "$d/ref/metrics.csv"
cl_job status "$JOB" --json > "$d/resumed.json"
check "resumed: its events say so (stop_requested, resume), and it trained on in epoch 2" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
kinds = [e["kind"] for e in j["events"] if e["kind"] in ("stop_requested", "resume")]
assert kinds == ["stop_requested", "resume"] and j["epoch"] == 2, (kinds, j["epoch"])
' "$d/resumed.json"

# A device asked to stop (SIGINT) while a checkpoint part is waiting to upload
# uploads it first, training on (its stages served) until the job has
# committed that step, which needs the other device's part too. The
# coordinator is paused (SIGSTOP) so that parts wait for certain: each is a
# directory until it is uploaded. The device is the data owner, which every
# plan has.
JOB=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 100000 --batch 8 \
      --micro-batches 4 --algo even --checkpoint-every 2 --devices "$OWNER,$MID" --lr 2e-3 2>/dev/null | head -1)
cl_poll 60 cl_progress "$JOB" 1 4 || echo "     the job did not run: $(cl_jq "$JOB" 'j["state"], j["reason"]')"
kill -STOP "${CL_PID_OF[coord]}"
cl_poll 60 bash -c '[ "$(ls -d "$0"/part-* 2>/dev/null | wc -l)" -ge 2 ]' "$d/dev1/jobs/$JOB"
S=$(ls -d "$d/dev1/jobs/$JOB"/part-* 2>/dev/null | sed 's/.*part-//' | sort -n | head -1)
OWNERPID=${CL_PID_OF[dev1]}
kill -INT "$OWNERPID"
cl_poll 10 grep -q "stopping once its checkpoint parts are uploaded" "$d/dev1.log"
kill -CONT "${CL_PID_OF[coord]}"
check "SIGINT with checkpoint parts waiting (step ${S:-none}): the device says it uploads them first" \
    bash -c '[ -n "$1" ] && grep -q "device: stopping once its checkpoint parts are uploaded parts=\"job $2 step [0-9]*\"" "$0"' \
    "$d/dev1.log" "$S" "$JOB"
cl_poll 60 bash -c '! kill -0 "$0" 2>/dev/null' "$OWNERPID"
wait "$OWNERPID" 2>/dev/null
check "then it stops, its parts uploaded and their step committed" \
    grep -q "device: stopping parts_uploaded=yes committed=yes" "$d/dev1.log"
committed_at_least() { [ "$(cl_jq "$1" 'int(j["committed_step"] >= '"${2:-1000000}"')')" = 1 ]; }
check "the job committed the step whose part was waiting" cl_poll 60 committed_at_least "$JOB" "$S"
cl_job stop "$JOB" >/dev/null
CL_PID_OF[dev1]=""
cl_restart dev1
cl_wait_online 3

# --init: a job that starts from a model equals skyloom train --init from it
"$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 20 --batch 8 --micro-batches 4 \
    --lr 2e-3 --init "$d/u3.export/model.safetensors" --save "$d/refinit" >/dev/null 2>&1
REF=$d/refinit job init "$OWNER,$MID" --init "$d/u3.export/model.safetensors"
# --init travels in pieces: a model of several MiB (over the coordinator's 1 MiB
# message limit) arrives whole; a file that is not this config's model is refused
# before anything is sent
cl_config "$d/wide.json" 256 2 512
"$SK" -q train --config "$d/wide.json" --data "$d/text.shard" --steps 1 --batch 8 --save "$d/wide" >/dev/null 2>&1
out=$(cl_job submit --config "$d/wide.json" --data "$OWNER:wiki" --steps 2 --batch 8 --micro-batches 4 \
      --init "$d/wide/step-1/model.safetensors" --no-wait 2>&1); rc=$?
WJOB=$(tail -1 <<<"$out")
check "--init of $(stat -c %s "$d/wide/step-1/model.safetensors") bytes: uploaded in pieces, the job starts from the same bytes" \
    bash -c 'test $0 -eq 0 && cmp -s "$1" "$2"' "$rc" "$d/wide/step-1/model.safetensors" "$d/coord/jobs/$WJOB/ckpt/step-0/model.safetensors"
cl_job stop "$WJOB" >/dev/null 2>&1
head -c 2000000 /dev/zero > "$d/zeros.safetensors"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 5 --init "$d/zeros.safetensors" 2>&1); rc=$?
echo "     $out" | tail -1
check "--init of a file that is not a safetensors model: refused, naming it" \
    bash -c 'test $0 -eq 1 && grep -q "zeros.safetensors" <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 5 --init "$d/wide/step-1/model.safetensors" 2>&1); rc=$?
echo "     $out" | tail -1
check "--init of another config's model: refused, naming the tensor and the shapes" \
    bash -c 'test $0 -eq 1 && grep -q "has shape \[.*\], the config needs" <<<"$1"' "$rc" "$out"
check "nothing of the refused uploads stays on the coordinator" \
    bash -c 'test -z "$(ls "$0")"' "$d/coord/jobs/uploads"

# the owner refuses what it cannot train on: the reason reaches submit
out=$(cl_job submit --config "$d/small.json" --data "$OWNER:wiki" --steps 5 2>&1); rc=$?
echo "     $out" | tail -1
check "a shard whose vocabulary exceeds the config: submit fails with the owner's reason" \
    bash -c 'test $0 -eq 1 && grep -q "refused wiki: .*vocab_size is 50" <<<"$1"' "$rc" "$out"
sed 's/, "num_labels": 3}/, "id2label": {"0": "y", "1": "x", "2": "z"}}/' "$d/cls.json" > "$d/mixed.json"
out=$(cl_job submit --config "$d/mixed.json" --data "$OWNER:topics" --task classify --steps 5 2>&1); rc=$?
check "a classifier whose id2label orders the shard's labels otherwise: submit fails with the owner's reason" \
    bash -c 'test $0 -eq 1 && grep -q "refused topics: .*id2label gives class 0 the name .y., the shard.s labels .x.: the classes would be mixed up" <<<"$1"' "$rc" "$out" ||
    echo "     got: $out"
out=$(cl_job submit --config "$d/cls.json" --data "$OWNER:wiki" --task classify --steps 5 2>&1); rc=$?
check "classify on a shard without labels: submit fails with the owner's reason" \
    bash -c 'test $0 -eq 1 && grep -q "refused wiki: .*the shard has no labels" <<<"$1"' "$rc" "$out" ||
    echo "     got: $out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:secret" --steps 5 2>&1); rc=$?
check "a dataset the owner does not declare: refused" \
    bash -c 'test $0 -eq 1 && grep -q "serves no dataset .secret." <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:../../etc/passwd" --steps 5 2>&1); rc=$?
check "a path instead of a dataset name: refused" bash -c 'test $0 -eq 1 && grep -q "DEVICE_ID:NAME" <<<"$1"' "$rc" "$out"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 5 --batch 6 --micro-batches 4 2>&1); rc=$?
check "bad options: refused naming them" bash -c 'test $0 -eq 1 && grep -q "multiple of micro_batches" <<<"$1"' "$rc" "$out"
cl_job list > "$d/list.txt"
check "job list shows the done job, not the submits its data owner refused" \
    bash -c 'grep -q "^$1 .* done " "$0" && ! grep -q "failed" "$0"' "$d/list.txt" "$JOB"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
# make demo runs under set -e: stopping a process that has already ended is no error there
check "cl_stop under set -e, a process already gone" \
    bash -c 'set -euo pipefail; CL=$1 SK=$2; . "$0/scripts/cluster.sh"; true & p=$!; wait $p; CL_PIDS=($p); cl_stop; echo survived' \
    "$src" "$CL" "$SK"

exit $fail
