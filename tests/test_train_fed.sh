#!/usr/bin/env bash
# skyloom train with several --data (docs/federation.md): the single-device
# reference (one stage per replica) against --stages and --replica-stages
# (the same and different cuts per replica), --sync step and outer:H, codec
# none: the same model and federation state bytes and the same losses; a
# federation of one is today's run; lossy codecs are deterministic; under
# outer:H every replica holds the model's bytes at an outer step and not
# between; a run stopped anywhere (mid-interval too) and resumed under other
# cuts equals the uninterrupted run; bad input is refused naming the option.
set -u
sk="$1"; src="$2"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
d=$(mktemp -d /tmp/skyloom-fed-XXXXXX)
trap 'rm -rf "$d"' EXIT
. "$src/tests/fed_fixture.sh"
fed_fixture "$d" "$sk" "$src" || { echo "FAIL the owners' shards"; exit 1; }
base=(--config "$d/cfg.json" --lr 2e-3 --warmup 2 --clip 0.5 --micro-batches 4 --stage-threads 1)
fed=("${base[@]}" --data "$d/a.shard" --data "$d/b.shard" --owner-batch 8,4)

# run NAME ARGS...: 6 steps, saved at the end (and wherever ARGS say)
run() {
  local name="$1"; shift
  "$sk" -q train --steps 6 --save "$d/$name" "$@" >/dev/null 2>"$d/$name.err" ||
    { echo "     $name: $(tail -1 "$d/$name.err")"; return 1; }
}
# same A B [STEP]: the model and federation bytes and every loss column
same() {
  local s=${3:-6}
  cmp -s "$d/$1/step-$s/model.safetensors" "$d/$2/step-$s/model.safetensors" &&
  { [ ! -e "$d/$1/step-$s/fed.safetensors" ] ||
    cmp -s "$d/$1/step-$s/fed.safetensors" "$d/$2/step-$s/fed.safetensors"; } &&
  [ "$(cut -d, -f1-5,8- "$d/$1/metrics.csv")" = "$(cut -d, -f1-5,8- "$d/$2/metrics.csv")" ]
}

# A federation of one is today's run: --owner-batch B is --batch B, and
# --sync step with codec none changes no bit.
run one "${base[@]}" --data "$d/a.shard" --batch 8
run one-ob "${base[@]}" --data "$d/a.shard" --owner-batch 8
run one-fed "${base[@]}" --data "$d/a.shard" --sync step
check "--owner-batch 8 with one --data is --batch 8" \
    cmp -s "$d/one/step-6/model.safetensors" "$d/one-ob/step-6/model.safetensors"
check "a federation of one (--sync step, codec none) is today's run: the same model bytes" \
    cmp -s "$d/one/step-6/model.safetensors" "$d/one-fed/step-6/model.safetensors"
check "... and the same losses" \
    bash -c '[ "$(cut -d, -f1-5 "$0")" = "$(cut -d, -f1-5 "$1")" ]' "$d/one/metrics.csv" "$d/one-fed/metrics.csv"

# The single-device reference against every kind of cut.
for sync in step outer:2; do
  tag=${sync%%:*}
  run "$tag-ref" "${fed[@]}" --sync "$sync"
  check "$sync: the reference runs and writes fed.json, fed.safetensors, data.replica-1.json" \
      bash -c 'for f in fed.json fed.safetensors data.replica-1.json; do test -s "$0/step-6/$f" || exit 1; done' "$d/$tag-ref"
  for cut in "--stages 2" "--stages 0-1,2-3,4-4" "--replica-stages 0-3,4-4;0-0,1-4" \
             "--replica-stages 0-2,3-4;0-0,1-1,2-3,4-4" "--schedule gpipe --stages 4"; do
    name="$tag-$(tr ' ,;:' '____' <<<"$cut")"
    read -r -a args <<<"$cut"
    run "$name" "${fed[@]}" --sync "$sync" "${args[@]}"
    check "$sync $cut: equals the single-device reference (model, fed state, losses)" same "$tag-ref" "$name"
  done
done
check "step: the replicas read different data (their step-1 losses differ)" \
    bash -c 'IFS=, read -r _ _ _ _ _ _ _ a b _ < <(sed -n 2p "$0"); [ "$a" != "$b" ]' "$d/step-ref/metrics.csv"

# Under outer:H every replica holds the model's bytes at an outer step, and
# its own between them.
python_rep() { # python_rep DIR EQUAL(1|0): replica 1's parameters against model.safetensors
  python3 - "$@" <<'PY'
import json, struct, sys
def read(p):
    f = open(p, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    data = open(p, "rb").read()
    return {k: data[base + v["data_offsets"][0]:base + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
m = read(sys.argv[1] + "/model.safetensors"); f = read(sys.argv[1] + "/fed.safetensors")
eq = [f["replica.1." + k] == v for k, v in m.items()]
print("     %s: %d of %d tensors of replica 1 equal the model's" % (sys.argv[1].split("/")[-1], sum(eq), len(eq)))
sys.exit(not (all(eq) if sys.argv[2] == "1" else not any(eq)))
PY
}
run outer "${fed[@]}" --sync outer:2 --save-every 1
for s in 1 2 3 4 5 6; do
  if [ $((s % 2)) = 0 ]; then
    check "outer:2, step $s (an outer step): replica 1 holds the model's bytes" python_rep "$d/outer/step-$s" 1
  else
    check "outer:2, step $s: replica 1 trains apart" python_rep "$d/outer/step-$s" 0
  fi
done

# Lossy codecs: deterministic, and the replicas still agree (step: always).
for v in "step|int8" "step|topk:0.05" "step|fp16" "outer:3|int8" "outer:2|topk:0.1"; do
  sync=${v%%|*} codec=${v#*|}
  tag="lossy-${sync%%:*}-${codec%%:*}"
  run "$tag-1" "${fed[@]}" --sync "$sync" --codec-sync "$codec"
  run "$tag-2" "${fed[@]}" --sync "$sync" --codec-sync "$codec" --replica-stages "0-1,2-4;0-3,4-4"
  check "$sync --codec-sync $codec: two runs (other cuts) give the same bytes" same "$tag-1" "$tag-2"
done
check "step/int8 sends fewer bytes than step/none (sync_bytes column)" \
    bash -c '[ "$(tail -1 "$0" | rev | cut -d, -f1 | rev)" -lt "$(tail -1 "$1" | rev | cut -d, -f1 | rev)" ]' \
    "$d/lossy-step-int8-1/metrics.csv" "$d/step-ref/metrics.csv"

# Resume: stopped anywhere (between outer steps too), continued under other
# cuts, the uninterrupted run's bytes and losses.
for v in "step|none|3" "step|topk:0.05|3" "outer:2|int8|3" "outer:2|fp16|4" "outer:3|topk:0.1|2"; do
  IFS='|' read -r sync codec at <<<"$v"
  tag="res-${sync%%:*}-${codec%%:*}-$at"
  run "$tag-u" "${fed[@]}" --sync "$sync" --codec-sync "$codec"
  "$sk" -q train --steps 6 "${fed[@]}" --sync "$sync" --codec-sync "$codec" --save "$d/$tag" \
      --stop-at "$at" --stages 2 >/dev/null 2>&1
  "$sk" -q train --steps 6 "${fed[@]}" --sync "$sync" --codec-sync "$codec" --save "$d/$tag" \
      --resume "$d/$tag/step-$at" --replica-stages "0-0,1-4;0-2,3-3,4-4" >/dev/null 2>"$d/$tag.err"
  check "$sync $codec: stopped at step $at, resumed under other cuts: the uninterrupted run" \
      same "$tag-u" "$tag"
done

# Bad input: exit 2 and one line naming the option.
bad() { # bad DESC PATTERN ARGS...
  local desc="$1" pat="$2"; shift 2
  local out rc
  out=$("$sk" train --steps 6 "${base[@]}" "$@" 2>&1 >/dev/null); rc=$?
  check "$desc: exit 2 naming it ($out)" bash -c '[ "$0" = 2 ] && grep -q -- "$1" <<<"$2" && [ "$(wc -l <<<"$2")" = 1 ]' "$rc" "$pat" "$out"
}
two=(--data "$d/a.shard" --data "$d/b.shard")
bad "--owner-batch count not matching --data" "--owner-batch 8,4,4 lists 3 batches for 2 --data" "${two[@]}" --owner-batch 8,4,4
bad "--owner-batch not a multiple of --micro-batches" "owner 2's batch 6 is not a multiple of --micro-batches" "${two[@]}" --owner-batch 8,6
bad "several --data without --owner-batch" "need --owner-batch" "${two[@]}"
bad "--batch with --owner-batch" "--batch and --owner-batch exclude each other" "${two[@]}" --owner-batch 8,4 --batch 8
bad "--sync outer:0" "--sync must be step or outer:H" "${two[@]}" --owner-batch 8,4 --sync outer:0
bad "--sync outer:H with H > --steps" "--sync outer:7: H is more than --steps 6" "${two[@]}" --owner-batch 8,4 --sync outer:7
bad "--sync bad" "--sync must be step or outer:H" "${two[@]}" --owner-batch 8,4 --sync every
for c in int4 topk topk:0 topk:2 "topk:x"; do
  bad "--codec-sync $c" "--codec-sync must be none, fp16, bf16, int8 or topk:F" "${two[@]}" --owner-batch 8,4 --codec-sync "$c"
done
bad "--codec-sync without a federation" "--codec-sync applies to a federation" --data "$d/a.shard" --codec-sync int8
bad "--outer-lr under --sync step" "--outer-lr applies to --sync outer:H" "${two[@]}" --owner-batch 8,4 --outer-lr 0.5
bad "--replica-stages with a cut too few" "--replica-stages 2 lists 1 cut for 2 --data" "${two[@]}" --owner-batch 8,4 --replica-stages 2
bad "--replica-stages with --stages" "--stages and --replica-stages exclude each other" "${two[@]}" --owner-batch 8,4 --replica-stages "2;2" --stages 2
out=$("$sk" -q train --steps 6 "${fed[@]}" --sync outer:3 --resume "$d/step-ref/step-6" 2>&1 >/dev/null); rc=$?
check "resuming with another --sync: exit 1 naming --sync ($out)" bash -c '[ "$0" = 1 ] && grep -q -- "(--sync)" <<<"$1"' "$rc" "$out"
out=$("$sk" -q train --steps 6 "${base[@]}" --data "$d/a.shard" --batch 8 --resume "$d/step-ref/step-6" 2>&1 >/dev/null); rc=$?
check "resuming a federation's checkpoint as one owner: exit 1 saying so ($out)" bash -c '[ "$0" = 1 ] && grep -q "was a federation" <<<"$1"' "$rc" "$out"
out=$("$sk" -q train --steps 6 "${fed[@]}" --owner-batch 4,4 --resume "$d/step-ref/step-6" 2>&1 >/dev/null); rc=$?
check "resuming with another --owner-batch: refused naming it ($out)" bash -c '[ "$0" != 0 ] && grep -q -- "--owner-batch" <<<"$1"' "$rc" "$out"
exit $fail
