#!/usr/bin/env bash
# skyloom train --owner-absent (docs/federation.md, "An owner away"): the
# reference of a job whose owner went away under outer:H. While replica 1 is
# away the others' outer steps average only them (replica 0 alone: a
# federation of one, bit for bit); at its last step away, an outer step, it
# rejoins holding the outer model and replica 0's inner moments, with its
# error-feedback residual at 0; other cuts and a resume inside the window
# give the same bytes; bad input is refused naming the option.
set -u
sk="$1"; src="$2"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
d=$(mktemp -d /tmp/skyloom-away-XXXXXX)
trap 'rm -rf "$d"' EXIT
. "$src/tests/fed_fixture.sh"
fed_fixture "$d" "$sk" "$src" || { echo "FAIL the owners' shards"; exit 1; }
base=(--config "$d/cfg.json" --lr 2e-3 --warmup 2 --clip 0.5 --micro-batches 4 --stage-threads 1)
fed=("${base[@]}" --data "$d/a.shard" --data "$d/b.shard" --owner-batch 8,4 --sync outer:2)

run() { # run NAME ARGS...: 6 steps, saved every step
  local name="$1"; shift
  "$sk" -q train --steps 6 --save-every 1 --save "$d/$name" "$@" >/dev/null 2>"$d/$name.err" ||
    { echo "     $name: $(tail -1 "$d/$name.err")"; return 1; }
}

cmp_st() { # cmp_st MODE A B: MODE eq (every tensor of A equals B's under PREFIX) ...
  python3 - "$@" <<'PY'
import json, struct, sys
def read(p):
    data = open(p, "rb").read(); n = struct.unpack("<Q", data[:8])[0]; h = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
what, step = sys.argv[1], sys.argv[2]
m, o, f = (read(step + "/" + x + ".safetensors") for x in ("model", "optim", "fed"))
if what == "params":      # replica 1's parameters against the model's: 1 all equal, 0 none
    eq = [f["replica.1." + k] == v for k, v in m.items()]
elif what == "moments":   # replica 1's inner moments against replica 0's
    eq = [f["replica.1." + k] == v for k, v in o.items()]
elif what == "resid0":    # replica 1's residuals are all zero bytes; replica 0's are not
    r1 = [v for k, v in f.items() if k.startswith("replica.1.") and k.endswith(".residual")]
    r0 = [v for k, v in f.items() if k.startswith("replica.0.") and k.endswith(".residual")]
    eq = [r1 and all(v.count(0) == len(v) for v in r1) and any(v.count(0) != len(v) for v in r0)]
want = sys.argv[3] == "1"
print("     %s %s: %d of %d equal" % (step.split("/")[-1], what, sum(map(bool, eq)), len(eq)))
sys.exit(not (all(eq) if want else not any(eq)))
PY
}
col() { cut -d, -f"$2" "$d/$1/metrics.csv" | sed -n "$3"; }

# Away from step 1 to the outer step 4: replica 0 is a federation of one
# (its weight renormalised to 1) until then, bit for bit.
run away14 "${fed[@]}" --owner-absent 1:1-4
run one "${base[@]}" --data "$d/a.shard" --owner-batch 8 --sync outer:2
for s in 2 4; do
  check "replica 1 away 1-4: step $s's model is the federation of one's" \
      cmp -s "$d/away14/step-$s/model.safetensors" "$d/one/step-$s/model.safetensors"
  check "... and its inner moments" \
      cmp -s "$d/away14/step-$s/optim.safetensors" "$d/one/step-$s/optim.safetensors"
done
check "... and the loss of steps 1-4 is replica 0's alone (weight 1)" \
    bash -c '[ "$(wc -l <<<"$0")" = 4 ] && [ "$0" = "$1" ]' "$(col away14 2 2,5p)" "$(col one 2 2,5p)"
check "... and replica 1's loss column is empty while away" [ "$(col away14 9 2,5p | tr -d '\n')" = "" ]
check "... and filled again once back (step 5)" [ -n "$(col away14 9 6p)" ]
check "at its rejoin (step 4) replica 1 holds the model's bytes" cmp_st params "$d/away14/step-4" 1
check "... and replica 0's inner moments" cmp_st moments "$d/away14/step-4" 1
check "step 5: replica 1 trains apart again" cmp_st params "$d/away14/step-5" 0
check "step 6 (an outer step with both): the replicas hold the same bytes" cmp_st params "$d/away14/step-6" 1
check "... and that step is not the federation of one's (replica 1 counted again)" \
    bash -c '! cmp -s "$0" "$1"' "$d/away14/step-6/model.safetensors" "$d/one/step-6/model.safetensors"

# Away in the middle (3-4): other cuts give the same bytes (the rejoin copies
# moments by tensor name), a resume inside the window equals the
# uninterrupted run, and the absence changed the result.
run mid "${fed[@]}" --owner-absent 1:3-4
run mid-cut "${fed[@]}" --owner-absent 1:3-4 --replica-stages "0-1,2-4;0-0,1-3,4-4"
run all "${fed[@]}"
same() { cmp -s "$d/$1/step-$3/model.safetensors" "$d/$2/step-$3/model.safetensors" &&
         cmp -s "$d/$1/step-$3/fed.safetensors" "$d/$2/step-$3/fed.safetensors" &&
         [ "$(cut -d, -f1-5,8-9 "$d/$1/metrics.csv")" = "$(cut -d, -f1-5,8-9 "$d/$2/metrics.csv")" ]; }
for s in 4 6; do
  check "away 3-4 under other cuts: the reference's bytes at step $s (model, fed state, losses)" same mid mid-cut $s
done
check "away 3-4: step 2 is the run without absence's" \
    cmp -s "$d/mid/step-2/model.safetensors" "$d/all/step-2/model.safetensors"
check "... step 4 is not (replica 1's steps 3-4 were left out)" \
    bash -c '! cmp -s "$0" "$1"' "$d/mid/step-4/model.safetensors" "$d/all/step-4/model.safetensors"
"$sk" -q train --steps 6 "${fed[@]}" --owner-absent 1:3-4 --save "$d/res" --stop-at 3 --stages 2 >/dev/null 2>&1
"$sk" -q train --steps 6 "${fed[@]}" --owner-absent 1:3-4 --save "$d/res" --resume "$d/res/step-3" \
    --replica-stages "0-0,1-4;0-2,3-4" >/dev/null 2>"$d/res.err"
check "away 3-4, stopped at step 3 and resumed under other cuts: the uninterrupted run" \
    bash -c 'cmp -s "$0/step-6/model.safetensors" "$1/step-6/model.safetensors" &&
             cmp -s "$0/step-6/fed.safetensors" "$1/step-6/fed.safetensors"' "$d/mid" "$d/res"

# A lossy codec: the residual of the replica back starts at 0.
run lossy "${fed[@]}" --codec-sync int8 --owner-absent 1:3-4
check "int8, away 3-4: at step 4 replica 1's residuals are 0 (replica 0's are not)" \
    cmp_st resid0 "$d/lossy/step-4" 1

# Bad input: exit 2, one line naming the option.
bad() { # bad DESC PATTERN ARGS...
  local desc="$1" pat="$2"; shift 2
  local out rc
  out=$("$sk" train --steps 6 "${base[@]}" --data "$d/a.shard" --data "$d/b.shard" --owner-batch 8,4 "$@" 2>&1 >/dev/null); rc=$?
  check "$desc: exit 2 naming it ($out)" bash -c '[ "$0" = 2 ] && grep -q -- "$1" <<<"$2" && [ "$(wc -l <<<"$2")" = 1 ]' "$rc" "$pat" "$out"
}
bad "--owner-absent under --sync step" "--owner-absent 1:1-2 needs --sync outer:H" --owner-absent 1:1-2
bad "--owner-absent ending between outer steps" "E = 3 is not an outer step" --sync outer:2 --owner-absent 1:1-3
bad "--owner-absent past --steps" "1 <= S <= E <= --steps 6" --sync outer:2 --owner-absent 1:2-8
bad "--owner-absent of a replica that is not there" "replica 2 of 2" --sync outer:2 --owner-absent 2:1-2
bad "--owner-absent malformed" "expected R:S-E" --sync outer:2 --owner-absent 1:2
bad "--owner-absent twice for one replica" "replica 1 is already away" --sync outer:2 --owner-absent 1:1-2 --owner-absent 1:3-4
out=$("$sk" -q train --steps 6 "${fed[@]}" --owner-absent 0:1-2 --owner-absent 1:2-4 2>&1 >/dev/null); rc=$?
check "every replica away at once: refused ($out)" bash -c '[ "$0" = 1 ] && grep -q "every replica is away at step 2" <<<"$1"' "$rc" "$out"
exit $fail
