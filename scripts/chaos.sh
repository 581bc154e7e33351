#!/usr/bin/env bash
# make chaos: the demo job on loopback (a coordinator, four devices at two
# sites, the fortune corpus, bert-tiny, codec none) while devices fail: every
# 30-60 s a random device is SIGKILLed and started again 10-20 s later, and
# once the coordinator is SIGKILLed and restarted. At the end it checks that
# the job finished, that the committed step only went up, that the final
# model equals `skyloom train`'s with the same settings (an uninterrupted
# run) byte for byte, and that no process is left; and it prints a report of
# every failure with its detection and recovery times (markdown, also in
# BUILD/chaos/report.md).
# Usage: scripts/chaos.sh [BUILD_DIR]   env: CHAOS_SECONDS (300): the job's
# length without failures (about); CHAOS_SEED (random)
set -uo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
SK="$build/cli/skyloom"
[ -x "$SK" ] || { echo "chaos: $SK not found: run make build first" >&2; exit 1; }
SK=$(cd "$(dirname "$SK")" && pwd)/$(basename "$SK")
secs=${CHAOS_SECONDS:-300}
RANDOM=${CHAOS_SEED:-$$}
dir="$build/chaos"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
config="$root/configs/bert-tiny.json"
vocab_size=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$config")
seq=64 batch=16 micro=4 every=10

echo "== corpus, vocabulary and shard (as make demo)"
demo="$build/demo"
mkdir -p "$demo"
[ -s "$demo/corpus.txt" ] || "$root/scripts/demo-corpus.sh" "$demo/corpus.txt"
[ -s "$demo/vocab.txt" ] || "$SK" -q data vocab --corpus "$demo/corpus.txt" --size "$vocab_size" --out "$demo/vocab.txt"
[ -s "$demo/demo.shard" ] || "$SK" -q data prepare --vocab "$demo/vocab.txt" --in "$demo/corpus.txt" --out "$demo/demo.shard" --seq "$seq"
shard=$(cd "$demo" && pwd)/demo.shard

CL="$dir/cluster"
rm -rf "$CL"
. "$root/scripts/cluster.sh"
monitor=""
cleanup() { [ -n "$monitor" ] && kill "$monitor" 2>/dev/null && wait "$monitor" 2>/dev/null; cl_stop; }
trap cleanup EXIT
trap 'echo; echo "chaos: interrupted"; exit 130' INT TERM
now_ms() { date +%s%3N; }

echo "== a coordinator and four devices on 127.0.0.1"
cl_start || exit 1
cl_device owner lab-a --threads 2 --data "fortunes=$shard" || exit 1; OWNER=$CL_ID
cl_device a2 lab-a --threads 1 || exit 1
cl_device b1 lab-b --threads 1 || exit 1
cl_device b2 lab-b --threads 1 || exit 1
cl_wait_online 4 || exit 1

# steps for about the whole time at about 0.6 of the single-process speed (the
# job's speed on these cores, measured); failures add their downtime
export OMP_WAIT_POLICY=passive
tps=$("$SK" -q train --config "$config" --data "$shard" --steps 30 --batch "$batch" \
      --micro-batches "$micro" --metrics "$dir/calibrate.csv" --json | sed -n 's/.*"tokens_per_s": *\([0-9.]*\).*/\1/p')
steps=$(awk -v t="$tps" -v s="$secs" -v n=$((batch * seq)) 'BEGIN { k = int(0.6 * t * s / n); k -= k % 10; print (k < 60 ? 60 : k) }')
echo "== the job: $steps steps of $batch x $seq tokens, $micro micro-batches, codec none, a checkpoint every $every steps"
out=$(cl_job submit --config "$config" --data "$OWNER:fortunes" --steps "$steps" --batch "$batch" \
      --micro-batches "$micro" --lr 1e-3 --checkpoint-every "$every" --json 2>&1) || { echo "$out"; exit 1; }
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
[ -n "$JOB" ] || { echo "$out"; exit 1; }
echo "   job $JOB"
t0=$(now_ms)

# the committed step, once a second, for the check that it only goes up
( while :; do
    c=$(cl_job status "$JOB" --json 2>/dev/null | sed -n 's/.*"committed_step": *\([0-9]*\).*/\1/p' | head -1)
    [ -n "$c" ] && echo "$(now_ms) $c"
    sleep 1
  done ) > "$dir/committed.txt" 2>/dev/null &
monitor=$!

job_state() { cl_job status "$JOB" --json 2>/dev/null | sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' | head -1; }
ended() { case "$(job_state)" in done|failed|stopped) return 0 ;; esac; return 1; }
# sleeps S seconds in steps of 0.5 s, returning early when the job ended
wait_or_end() { local t=$(( $1 * 2 )); while [ $t -gt 0 ]; do ended && return 1; sleep 0.5; t=$((t - 1)); done; return 0; }

: > "$dir/failures.txt"
names=(owner a2 b1 b2)
kills=0 coord_done=0
deadline=$(( $(date +%s) + 3 * secs ))
while ! ended && [ "$(date +%s)" -lt "$deadline" ]; do
  wait_or_end $(( 30 + RANDOM % 31 )) || break
  if [ $coord_done = 0 ] && [ $kills -ge 2 ]; then
    cl_kill9 coord
    k=$(now_ms)
    echo "   $(( (k - t0) / 1000 )) s: SIGKILL coordinator"
    sleep "$(( 2 + RANDOM % 4 )).$((RANDOM % 10))"
    cl_restart coord || { echo "chaos: the coordinator did not restart" >&2; exit 1; }
    echo "coord $k $(now_ms)" >> "$dir/failures.txt"
    coord_done=1
    continue
  fi
  victim=${names[$((RANDOM % 4))]}
  cl_kill9 "$victim"
  k=$(now_ms)
  echo "   $(( (k - t0) / 1000 )) s: SIGKILL $victim ($(grep '^device d' "$CL/$victim.log" | head -1 | cut -d' ' -f2))"
  kills=$((kills + 1))
  back=$(( 10 + RANDOM % 11 ))
  sleep "$back"
  cl_restart "$victim"
  echo "$victim $k $(now_ms) $(grep '^device d' "$CL/$victim.log" | head -1 | cut -d' ' -f2)" >> "$dir/failures.txt"
  echo "   $(( ($(now_ms) - t0) / 1000 )) s: $victim started again (after $back s)"
done
while ! ended && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
kill "$monitor" 2>/dev/null; wait "$monitor" 2>/dev/null; monitor=""
state=$(job_state)
cl_job status "$JOB" --json > "$dir/status.json"
elapsed=$(( ($(now_ms) - t0) / 1000 ))
echo "== the job $state after $elapsed s"

echo "== the uninterrupted run: skyloom train with the same settings"
rm -rf "$dir/ref"
"$SK" -q train --config "$config" --data "$shard" --steps "$steps" --batch "$batch" \
    --micro-batches "$micro" --lr 1e-3 --save "$dir/ref" --save-every "$steps" >/dev/null 2>&1
rm -rf "$dir/model"
cl_job export "$JOB" --out "$dir/model" >/dev/null 2>&1
same=no
cmp -s "$dir/model/model.safetensors" "$dir/ref/step-$steps/model.safetensors" && same=yes
cl_stop
left=no
cl_alive && left=yes

python3 - "$dir" "$state" "$same" "$left" "$steps" "$elapsed" "$t0" <<'PY' | tee "$dir/report.md"
import json, sys
d, state, same, left, steps, elapsed, t0 = sys.argv[1:8]
t0 = int(t0)
st = json.load(open(f"{d}/status.json"))
ev = st.get("events") or []
com = [tuple(map(int, l.split())) for l in open(f"{d}/committed.txt") if len(l.split()) == 2]
up = all(b[1] >= a[1] for a, b in zip(com, com[1:]))
fails = [l.split() for l in open(f"{d}/failures.txt") if l.strip()]
print(f"| | |\n|---|---|")
print(f"| job | {state}, {steps} steps, {elapsed} s, epochs {st.get('epoch')} |")
print(f"| committed step only went up | {'yes' if up and com else 'NO'} ({len(com)} samples, last {com[-1][1] if com else '-'}) |")
print(f"| final model equals the uninterrupted run's (bytes) | {same} |")
print(f"| processes left running | {left} |")
print()
print("| t (s) | failure | committed then | detected after | next step after | how |")
print("|---:|---|---:|---:|---:|---|")
ok = True
for i, f in enumerate(fails):
    who, k = f[0], int(f[1])
    nxt = int(fails[i + 1][1]) if i + 1 < len(fails) else 1 << 62
    after = [e for e in ev if k <= e["at_ms"] < nxt]
    step = max([c for t, c in com if t <= k] + [0])
    if who == "coord":
        det = [e for e in after if e["kind"] == "coordinator_restarted"]
        how = "restarted " + (f"{(int(f[2]) - k) / 1000:.1f} s later; " if len(f) > 2 else "") + \
              (det[0]["detail"] if det else "no restart event")
    else:
        dev = f[3] if len(f) > 3 else ""
        det = [e for e in after if e["kind"] in ("lost",) and e["device"] == dev]
        how = det[0]["detail"] if det else "not in the running plan (nothing to recover)"
        w = [e for e in after if e["kind"] == "waiting" and e["device"] == dev]
        if w:
            how += "; the job waited for its data owner"
    res = [e for e in after if e["kind"] == "resumed"]
    dt = f"{(det[0]['at_ms'] - k) / 1000:.2f} s" if det else "-"
    rt = f"{(res[0]['at_ms'] - k) / 1000:.2f} s" if res else "-"
    print(f"| {(k - t0) / 1000:.0f} | {'coordinator' if who == 'coord' else who} SIGKILL | {step} | {dt} | {rt} | {how} |")
import glob, re, statistics
rs = []
for f in glob.glob(f"{d}/cluster/*.log"):
    for l in open(f, errors="replace"):
        m = re.search(r"device: restored .* step=([0-9]+) .*bytes=([0-9]+) seconds=([0-9.]+)", l)
        if m and int(m.group(1)) > 0:
            rs.append((int(m.group(2)), float(m.group(3))))
if rs:
    print()
    print(f"Restoring a committed step from the coordinator (FetchFile: every file of the step; "
          f"each device then loads its new stages by name): {len(rs)} restores, median {statistics.median(b for b, _ in rs) / 1e6:.2f} MB "
          f"in {statistics.median(t for _, t in rs):.3f} s (max {max(t for _, t in rs):.3f} s).")
print()
print("Events (coordinator):")
print()
print("```")
for e in ev:
    print(f"{(e['at_ms'] - t0) / 1000:8.2f} s  epoch {e['epoch']:<3} committed {e['committed_step']:<5} {e['kind']:<21} {e['device'][:17]:<17} {e['detail']}")
print("```")
sys.exit(0 if state == "done" and up and same == "yes" and left == "no" else 1)
PY
