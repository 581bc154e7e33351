#!/usr/bin/env bash
# A job attacked while it runs, on loopback with real processes: an enrolled
# device outside the job (its own certificate) and a device of the job
# posing as another or reaching past its units. Every call is refused with
# PERMISSION_DENIED and counted in /metrics; the attacked job ends with the
# model and losses of `skyloom train`, byte for byte.
set -u
SK="$1"; src="$2"; ATTACK="$3"
CL=$(mktemp -d /tmp/skyloom-attack-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
trap 'cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT
REF=

d=$CL
cl_shard "$src" || exit 1
cl_config "$d/cfg.json" 32 3 48
cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; MID=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; LAST=$CL_ID
cl_device out lab-c --threads 1 || exit 1; OUT=$CL_ID
cl_wait_online 4 || exit 1

# a job long enough to be attacked while it runs; stopped after a commit
# that follows the attacks, and compared at its committed step with the
# reference run (which saves every 10 steps)
STEPS=100000
OMP_WAIT_POLICY=passive "$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps $STEPS \
    --batch 8 --micro-batches 4 --lr 2e-3 --warmup 20 --save-every 10 --stop-at 600 --save "$d/ref" >/dev/null 2>&1 &
REF=$!
trap 'kill $REF 2>/dev/null; wait $REF 2>/dev/null; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT
JOB=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps $STEPS --batch 8 \
      --micro-batches 4 --algo even --checkpoint-every 10 --devices "$OWNER,$MID,$LAST" --lr 2e-3 \
      --warmup 20 --no-wait 2>&1 | tail -1)
running() { cl_job status "$JOB" --json 2>/dev/null | grep -q '"state": "running"'; }
check "submitted and running" cl_poll 120 running
EPOCH=$(cl_job status "$JOB" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])')

# as: NAME ACTION ARGS...: the call as device NAME (its state directory)
as() { local who=$1; shift; "$ATTACK" "$CL/$who" "$CL_ADDR" "$@" "$JOB" 2>&1; }
as_() { local who=$1 act=$2; shift 2; "$ATTACK" "$CL/$who" "$CL_ADDR" "$act" "$JOB" "$@" 2>&1; }
denied() { grep -q "^PERMISSION_DENIED" <<<"$1"; }

# an enrolled device in no part of the job
out=$(as_ out report-lost "$EPOCH" "$MID"); echo "     outsider reports $MID lost: $out"
check "an outsider's failure report naming a device of the job: refused" denied "$out"
out=$(as_ out upload "$EPOCH" 10 "model.$MID.safetensors")
check "an outsider's upload of a part: refused" denied "$out"
out=$(as_ out fetch ""); check "an outsider listing the checkpoint: refused" denied "$out"
out=$(as out plan); check "an outsider asking for the plan: refused" denied "$out"
out=$(as_ out step "$EPOCH" 0 5); check "an outsider's step report: refused" denied "$out"
# Ping: only from the devices the coordinator names as measuring their link
# to the device (while a job profiles); nobody measures now
addr=$("$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" --json |
       python3 -c 'import json,sys; print(next(d["stage_address"] for d in json.load(sys.stdin)["devices"] if d["device_id"] == sys.argv[1]))' "$MID")
out=$("$ATTACK" "$CL/out" "$addr" ping "$MID" 2>&1); echo "     outsider pings $MID: $out"
check "an outsider's Ping to a device of the job: refused, it measures no link to it" \
    bash -c 'grep -q "^FAILED_PRECONDITION device $1 is not measuring its link to this device" <<<"$0"' "$out" "$OUT"
out=$("$ATTACK" "$CL/dev1" "$addr" ping "$MID" 2>&1)
check "a neighbour's Ping outside profiling: refused too" \
    bash -c 'grep -q "^FAILED_PRECONDITION" <<<"$0"' "$out"
# a device of the job posing as another, or reaching past its own units
out=$(as_ dev3 upload "$EPOCH" 10 "model.$MID.safetensors"); echo "     $LAST uploads $MID's part: $out"
check "a member uploading a part under another device's tag: refused" denied "$out"
out=$(as_ dev3 upload "$EPOCH" 99990 "model.$LAST-u0.safetensors")
check "a member uploading tensors of a unit it does not run: refused" \
    bash -c 'grep -q "^PERMISSION_DENIED.*unit 0, which device" <<<"$0"' "$out"
out=$(as_ dev3 upload "$EPOCH" 10 "data.json")
check "a member uploading the data owner's data record: refused" denied "$out"
committed_any() { cl_job status "$JOB" --json | python3 -c 'import json,sys; sys.exit(json.load(sys.stdin)["committed_step"] < 10)'; }
cl_poll 120 committed_any
out=$(as_ dev3 fetch "model.$OWNER-u0.safetensors")
check "a member fetching the data owner's embeddings: refused" denied "$out"
out=$(as_ dev3 fetch "data.json")
check "a member fetching the data owner's data record: refused" denied "$out"
out=$(as_ dev3 fetch ""); echo "     $LAST lists: $(grep -c '^file' <<<"$out") files"
check "a member's list holds no file of the data owner's units" \
    bash -c '! grep -q "file model.$1\|file optim.$1\|file data.json" <<<"$0" && grep -q "^OK" <<<"$0"' "$out" "$OWNER"

committed() { cl_job status "$JOB" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["committed_step"])'; }
past() { [ "$(committed)" -ge "$1" ]; }
check "the attacked job commits after the attacks" cl_poll 300 past 20
cl_job stop "$JOB" >/dev/null
stopped() { cl_job status "$JOB" --json 2>/dev/null | grep -q '"state": "stopped"'; }
check "stopped" cl_poll 60 stopped
C=$(committed)
echo "     stopped; committed step $C"
# (a device whose heartbeats a loaded machine delays may be lost and the job
# recovered, exactly: only a loss on someone's word would be the attack's)
cl_job status "$JOB" --json > "$d/status.json"
check "no device of the job was declared lost on a report" \
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); bad=[e for e in j["events"] if e["kind"]=="lost" and not e["detail"].startswith("no heartbeat")]; sys.exit(bool(bad))' "$d/status.json"
cl_job export "$JOB" --out "$d/export" >/dev/null 2>&1
check "the reference run reached step $C" cl_poll 600 test -s "$d/ref/step-$C/manifest.json"
kill $REF 2>/dev/null; wait $REF 2>/dev/null
check "its model equals skyloom train's at step $C, byte for byte" \
    cmp -s "$d/export/model.safetensors" "$d/ref/step-$C/model.safetensors"
check "its per-step losses up to step $C equal skyloom train's" \
    bash -c '[ "$(tail -n +2 "$0" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,3)" = "$(tail -n +2 "$1" | awk -F, -v c="$2" "\$1 <= c" | cut -d, -f1,2)" ]' \
    "$d/coord/jobs/$JOB/metrics.csv" "$d/ref/metrics.csv" "$C"
metrics=$(curl -s "http://$CL_HTTP/metrics")
refused() { grep -o "skyloom_calls_refused_total{reason=\"$1\"} [0-9]*" <<<"$metrics" | awk '{print $2}'; }
echo "     refused: not_member=$(refused not_member) not_own_part=$(refused not_own_part) fetch_not_own_units=$(refused fetch_not_own_units)"
check "/metrics counts the refusals by reason" \
    bash -c '[ "${0:-0}" -ge 5 ] && [ "${1:-0}" -ge 3 ] && [ "${2:-0}" -ge 2 ]' \
    "$(refused not_member)" "$(refused not_own_part)" "$(refused fetch_not_own_units)"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
