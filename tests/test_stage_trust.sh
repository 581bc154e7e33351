#!/usr/bin/env bash
# What devices hold against other enrolled devices and a stolen coordinator
# key, on real processes: a coordinator, a data owner and two devices that
# train, and an enrolled outsider.
#  (1) The outsider floods a device's Stage server with Exchange streams that
#      never send a hello (stage_flood, 100 at a time) from before a job
#      starts: each is refused at the door, and the job's first 12 steps have
#      the losses of `skyloom train` (the same options: its schedule follows
#      --steps).
#  (2) The flooded device, running a job, stops on SIGTERM (exit 0) well
#      before cl_stop would SIGKILL it, and says what it refused.
#  (3) A device the coordinator revokes while the owner runs a plan with it:
#      the owner stops that run (its streams closed), and the coordinator
#      takes the device out (the owner's failure report names it, or the
#      job manager lost it as revoked when it imported the revocation).
#  (4) The coordinator's key is rotated; devices take the new certificate from
#      their heartbeats; then a coordinator holding the rotated-out pair
#      answers at the same address: the plan it signs when it plans the job
#      again is refused.
#  (5) job export into a directory whose .export-JOB is a symbolic link, or
#      belongs to another user (as root): refused, nothing written through it.
set -u
SK="$1"; src="$2"; FLOOD="$3"
CL=$(mktemp -d /tmp/skyloom-stagetrust-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }
FPID=
trap '[ -n "$FPID" ] && kill $FPID 2>/dev/null && wait $FPID; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT

d=$CL
cl_shard "$src" || exit 1
cl_config "$d/cfg.json" 32 3 48

cl_start || exit 1
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; MID=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; LAST=$CL_ID
cl_device evil lab-c --threads 1 || exit 1; EVIL=$CL_ID
cl_wait_online 4 || exit 1

# the reference: skyloom train with the job's options (its schedule follows
# --steps), stopped once it has written 12 steps' metrics
REF=$d/ref
OMP_WAIT_POLICY=passive "$SK" -q train --config "$d/cfg.json" --data "$d/text.shard" --steps 100000 \
    --batch 8 --micro-batches 4 --lr 2e-3 --save-every 100000 --save "$REF" >/dev/null 2>&1 &
RPID=$!
ref12() { [ "$(tail -n +2 "$REF/metrics.csv" 2>/dev/null | wc -l)" -ge 12 ]; }
cl_poll 120 ref12 || { echo "FAIL the reference run wrote no 12 steps"; fail=1; }
kill "$RPID" 2>/dev/null; wait "$RPID" 2>/dev/null

addr_of() {
  "$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" --json |
    python3 -c 'import json,sys; print(next(d["stage_address"] for d in json.load(sys.stdin)["devices"] if d["device_id"] == sys.argv[1]))' "$1"
}
jq_() { cl_jq "$JOB" "$1"; }

# (1) the flood, from before a long job starts; the job's first 12 steps are
# compared with skyloom train's
"$FLOOD" "$CL/evil" "$(addr_of "$MID")" "$MID" 100 600 > "$d/flood.log" 2>&1 &
FPID=$!
check "(1) the outsider's 100 streams are open" cl_poll 30 grep -qs flooding "$d/flood.log"
out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 100000 --batch 8 --micro-batches 4 \
      --algo even --checkpoint-every 6 --devices "$OWNER,$MID,$LAST" --lr 2e-3 --json 2>&1)
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
check "(1) submitted under the flood and running" bash -c '[ -n "$0" ] && grep -q "\"state\": \"running\"" <<<"$1"' "$JOB" "$out"
M=$d/coord/jobs/$JOB/metrics.csv
rows12() { [ "$(tail -n +2 "$M" 2>/dev/null | wc -l)" -ge 12 ]; }
check "(1) the job trains 12 steps under the flood" cl_poll 180 rows12
check "(1) ... with the same per-step losses as skyloom train" \
    bash -c '[ "$(tail -n +2 "$0" | head -12 | cut -d, -f1,3)" = "$(tail -n +2 "$1" | head -12 | cut -d, -f1,2)" ]' \
    "$M" "$REF/metrics.csv"
check "(1) no frame refused, no pipeline stopped on the job's devices" \
    bash -c '! grep -q "frame refused\|pipeline stopped" "$0"/dev1.log "$0"/dev2.log "$0"/dev3.log' "$d"

# (2) SIGTERM to the flooded device while it runs the job (the flood goes on)
P2=${CL_PID_OF[dev2]}
kill -TERM "$P2"
gone() { ! kill -0 "$P2" 2>/dev/null; }
check "(2) the flooded device stops on SIGTERM while running the job" cl_poll 8 gone
wait "$P2"; rc=$?
check "(2) ... and exits 0" test "$rc" = 0
[ "$rc" = 0 ] || { echo "     dev2 exited $rc; the end of its log:"; tail -n 25 "$d/dev2.log" | sed 's/^/     | /'; }
CL_PID_OF[dev2]=""
check "(2) ... having refused the outsider's streams at the door" \
    bash -c 'grep "Exchange streams refused" "$0" | grep -q "not_admitted=[1-9]"' "$d/dev2.log"
kill -TERM "$FPID"; wait "$FPID"; FPID=
check "(1) every stream of the outsider was refused at the door, none waited for a hello" \
    bash -c 'grep -q "streams=[1-9][0-9]* refused=[1-9][0-9]* timed_out=0 " "$0"' "$d/flood.log"
echo "     outsider: $(tail -1 "$d/flood.log")"

# (3) the job goes on without dev2 (epoch 2: the owner and dev3); dev3 is revoked
check "(3) the job runs again without the stopped device" cl_poll 120 cl_progress "$JOB" 2 1
# dev3 is held (SIGSTOP) so that it cannot leave by itself when its own
# heartbeat is refused. The revocation reaches both sides at once: the
# coordinator imports it on the next device call and loses dev3 (revoked);
# the owner's heartbeat reply carries it. Which acts first depends on which
# call comes first: the owner leaves the plan naming the revoked neighbour,
# or is told to leave by the coordinator that lost it.
P3=${CL_PID_OF[dev3]}
kill -STOP "$P3"
E=$(cl_job status "$JOB" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])')
"$SK" certs revoke --pki "$CL/pki" "$LAST" >/dev/null
check "(3) the owner leaves the plan with the revoked neighbour (naming it, or told by the coordinator)" \
    cl_poll 30 grep -Eq "(leaving job|pipeline stopped|job failed) job=$JOB epoch=$E " "$d/dev1.log"
# the coordinator takes it out either from the owner's report or, having
# imported the revocation first, as lost (revoked) at once
check "(3) ... and the coordinator takes it out of the job: named by the report, or lost as revoked" \
    cl_poll 30 grep -Eq "run failure reported job=$JOB .*suspect=$LAST .*revoked|job event job=$JOB kind=lost device=$LAST .*detail=\"revoked\"" "$d/coord.log"
echo "     owner: $(grep -Eo "(leaving job|pipeline stopped|job failed) job=$JOB epoch=$E .*" "$d/dev1.log" | head -1)"
kill -CONT "$P3"

# (4) rotation, then the rotated-out pair answering as the coordinator
"$SK" -q certs rotate-coordinator --pki "$CL/pki" >/dev/null
check "(4) the owner took the new coordinator certificate from a heartbeat" \
    cl_poll 30 cmp -s "$CL/pki/coordinator.crt" "$CL/dev1/coordinator.crt"
kill -TERM "${CL_PID_OF[coord]}"; wait "${CL_PID_OF[coord]}" 2>/dev/null
cp "$CL/pki/coordinator.key.prev" "$CL/pki/coordinator.key"
cp "$CL/pki/coordinator.crt.prev" "$CL/pki/coordinator.crt"
cl_restart coord || exit 1
check "(4) the owner heartbeats to the coordinator of the old pair" \
    cl_poll 30 grep -q "heartbeat reply is not used.*older than" "$d/dev1.log"
# the restarted coordinator plans the job again from its committed step;
# the plan it signs with the old key is refused
check "(4) a plan signed by the rotated-out key is refused" \
    cl_poll 120 grep -q "the plan of job $JOB is refused: coordinator certificate .* older than" "$d/dev1.log"
cl_job stop "$JOB" >/dev/null 2>&1
J1=$JOB

# (5) job export: the staging directory may not be a link or another user's
mkdir -p "$d/out1" "$d/elsewhere"
ln -s "$d/elsewhere" "$d/out1/.export-$J1"
err=$(cl_job export "$J1" --out "$d/out1" 2>&1); rc=$?
check "(5) export refuses a .export directory that is a symbolic link" \
    bash -c 'test $0 -ne 0 && grep -q "symbolic link" <<<"$1" && [ -z "$(ls -A "$2")" ]' $rc "$err" "$d/elsewhere"
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$d/out2/.export-$J1" && chown 65534:65534 "$d/out2/.export-$J1"
  err=$(cl_job export "$J1" --out "$d/out2" 2>&1); rc=$?
  check "(5) export refuses a .export directory of another user" \
      bash -c 'test $0 -ne 0 && grep -q "belongs to uid 65534" <<<"$1" && [ -z "$(ls -A "$2")" ]' $rc "$err" "$d/out2/.export-$J1"
else
  echo "     (another user's directory: not root, not checked)"
fi
err=$(cl_job export "../$J1" --out "$d/out3" 2>&1); rc=$?
check "(5) export refuses a job id that is not a plain name" \
    bash -c 'test $0 -ne 0 && grep -q "cannot be a file name" <<<"$1" && [ ! -e "$2" ]' $rc "$err" "$d/out3"

cl_stop
if cl_alive; then echo "FAIL every process stopped"; fail=1; else echo "ok   every process stopped"; fi
exit $fail
