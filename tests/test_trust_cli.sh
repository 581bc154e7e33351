#!/usr/bin/env bash
# skyloom certs / coordinator / device / status end to end on 127.0.0.1,
# a free port chosen by the coordinator; then certificate lifetimes, a device
# renewing certificates of 6 seconds on its own, and rotating the
# coordinator's certificate under an enrolled device. Leaves no process behind.
set -u
sk="$1"
fail=0
tmp=$(mktemp -d /tmp/skyloom-trustcli-XXXXXX)
cpid=""
dpid=""
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    [ -n "$cpid" ] && kill "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
check() { # check DESC CMD...
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
start_coord() { # start_coord [PKI STATE HEARTBEAT]
    rm -f "$tmp/port"
    "$sk" coordinator --listen 127.0.0.1:0 --pki "${1:-$tmp/pki}" --state "${2:-$tmp/state}" \
        --port-file "$tmp/port" --heartbeat "${3:-60s}" 2>>"$tmp/coord.log" &
    cpid=$!
    for _ in $(seq 600); do [ -s "$tmp/port" ] && break; sleep 0.05; done
    port=$(cat "$tmp/port" 2>/dev/null)
}
stop_coord() { kill "$cpid"; wait "$cpid"; local rc=$?; cpid=""; return $rc; }

for c in certs coordinator device status; do
    "$sk" $c --help | grep -q "usage: skyloom $c"; check "$c --help" test $? -eq 0
done
"$sk" certs init --pki "$tmp/pki" --name coord --san IP:10.0.0.9,DNS:coord.example >/dev/null
check "certs init" test $? -eq 0
check "keys are 0600" test "$(stat -c %a "$tmp/pki/ca.key") $(stat -c %a "$tmp/pki/coordinator.key")" = "600 600"
out=$("$sk" certs init --pki "$tmp/pki" 2>&1); rc=$?
check "certs init refuses to overwrite" bash -c '[ $0 -eq 1 ] && grep -q "refusing to overwrite" <<<"$1"' "$rc" "$out"
out=$("$sk" certs init --pki "$tmp/bad" --san FOO:x 2>&1); rc=$?
check "certs init rejects a bad --san" bash -c '[ $0 -eq 1 ] && [ "$1" = "skyloom certs: --san entry '"'FOO:x'"' must start with IP: or DNS:" ]' "$rc" "$out"
"$sk" certs show --json "$tmp/pki/coordinator.crt" | grep -q '"IP:10.0.0.9"'
check "certs show lists the SANs" test $? -eq 0
"$sk" certs token --pki "$tmp/pki" --site lab --ttl 0s >/dev/null 2>&1
check "certs token rejects --ttl 0s" test $? -eq 2
tok=$("$sk" certs token --pki "$tmp/pki" --site lab --ttl 10m)
check "certs token carries the CA fingerprint" grep -q "^skyloom1\.$("$sk" certs show --json "$tmp/pki/ca.crt" | grep -o '"sha256": "[0-9a-f]*"' | cut -d'"' -f4)\." <<<"$tok"

chmod 0777 "$tmp/pki"
start_coord
check "coordinator writes its port" test -n "$port"
check "an open PKI directory is made private, and the log says so" \
    bash -c '[ "$(stat -c %a "$0")" = 700 ] && grep -q "PKI directory was open to group or others" "$1"' "$tmp/pki" "$tmp/coord.log"
id=$(umask 000; "$sk" -q device --coordinator 127.0.0.1:$port --token "$tok" --state "$tmp/dev" --site lab --once | sed -n 's/^device //p')
check "device enrolls" grep -Eq '^d[0-9a-f]{16}$' <<<"$id"
check "under umask 000 device.json is 0644, device.key 0600, the directory 0700" \
    test "$(stat -c %a "$tmp/dev/device.json") $(stat -c %a "$tmp/dev/device.key") $(stat -c %a "$tmp/dev")" = "644 600 700"
out=$("$sk" coordinator --listen 127.0.0.1:0 --pki "$tmp/pki" --state "$tmp/state2" 2>&1); rc=$?
check "a second coordinator on the same PKI is refused" \
    bash -c '[ $0 -eq 1 ] && grep -q "PKI directory .* is in use by another coordinator (pid $2)" <<<"$1"' "$rc" "$out" "$cpid"
# A FIFO in the spool neither blocks the heartbeat that imports the spool nor
# the shutdown; it is set aside with its reason.
fifo="$tmp/pki/spool/token-$(printf '%064d' 0)"
mkfifo "$fifo"
check "a heartbeat is answered with a FIFO in the spool" \
    timeout 20 "$sk" -q device --coordinator 127.0.0.1:$port --state "$tmp/dev" --site lab --once >/dev/null
check "the FIFO is renamed .bad and the log says why" \
    bash -c '[ -p "$0.bad" ] && grep -q "entry=token-0*.*not a regular file" "$1"' "$fifo" "$tmp/coord.log"
"$sk" -q device --coordinator 127.0.0.1:$port --state "$tmp/dev" --site lab --once \
    --stage-listen 127.0.0.1:0 --stage-advertise 127.0.0.1:7777 >/dev/null
check "device restarts from its stored certificate (serving Stage)" test $? -eq 0
out=$("$sk" -q device --coordinator 127.0.0.1:$port --token "$tok" --state "$tmp/dev2" --site lab --once 2>&1); rc=$?
check "a used token is refused" bash -c '[ $0 -eq 1 ] && grep -q "skyloom device: Enroll refused: UNAUTHENTICATED: enrollment token already used" <<<"$1"' "$rc" "$out"
js=$("$sk" status --coordinator 127.0.0.1:$port --pki "$tmp/pki" --json)
check "status --json shows the device online" bash -c 'grep -q "\"device_id\": \"$1\"" <<<"$0" && grep -q "\"state\": \"online\"" <<<"$0"' "$js" "$id"
check "status --json shows where it serves Stage" grep -q '"stage_address": "127.0.0.1:7777"' <<<"$js"
"$sk" certs revoke --pki "$tmp/pki" "$id" >/dev/null
check "certs revoke" test $? -eq 0
out=$("$sk" -q device --coordinator 127.0.0.1:$port --state "$tmp/dev" --site lab --once 2>&1); rc=$?
check "a revoked device is refused" bash -c '[ $0 -eq 1 ] && grep -q "UNAUTHENTICATED: device $2 is revoked" <<<"$1"' "$rc" "$out" "$id"
out=$("$sk" coordinator backup --state "$tmp/state" --out "$tmp/backup.db" 2>&1)
check "coordinator backup while it runs" bash -c '[ $? -eq 0 ] && grep -q "(1 devices)" <<<"$0"' "$out"
out=$("$sk" coordinator backup --state "$tmp/state" --out "$tmp/backup.db" 2>&1)
check "coordinator backup does not overwrite" grep -q "exists already" <<<"$out"
stop_coord; check "coordinator stops cleanly on SIGTERM" test $? -eq 0
start_coord
"$sk" status --coordinator 127.0.0.1:$port --pki "$tmp/pki" | grep -q "^$id .*revoked"
check "after a restart the device is still there and still revoked" test $? -eq 0
stop_coord
mkdir -m 700 "$tmp/restored" && cp "$tmp/backup.db" "$tmp/restored/coordinator.db"
start_coord "$tmp/pki" "$tmp/restored"
"$sk" status --coordinator 127.0.0.1:$port --pki "$tmp/pki" | grep -q "^$id .*revoked"
check "a coordinator on the restored backup knows the device" test $? -eq 0
stop_coord

# State that is not there is not an empty registry.
refused() { # DESC PATTERN: the coordinator refuses $tmp/state as it is now
    local out rc
    out=$(timeout 20 "$sk" coordinator --listen 127.0.0.1:0 --pki "$tmp/pki" --state "$tmp/state" 2>&1); rc=$?
    check "$1" bash -c '[ $0 -eq 1 ] && grep -q "$2" <<<"$1"' "$rc" "$out" "$2"
}
cp "$tmp/state/coordinator.db" "$tmp/db.good"
: > "$tmp/state/coordinator.db"
refused "an emptied coordinator.db is refused" "coordinator.db is empty (0 bytes), but .*coordinator.id shows"
rm "$tmp/state/coordinator.db"
refused "a deleted coordinator.db is refused" "coordinator.db is missing, but"
head -c 8192 "$tmp/db.good" > "$tmp/state/coordinator.db"
refused "a truncated coordinator.db is refused" "malformed.*restore it from a backup"
cp "$tmp/db.good" "$tmp/state/coordinator.db"
printf 'garbage' | dd of="$tmp/state/coordinator.db" conv=notrunc status=none
refused "a damaged first page is refused" "not an SQLite database"

# A flood of connections under a low descriptor limit does not wedge the
# listener: once it ends, the coordinator serves again.
cp "$tmp/db.good" "$tmp/state/coordinator.db"
rm -f "$tmp/port"
(ulimit -n 128; exec "$sk" coordinator --listen 127.0.0.1:0 --pki "$tmp/pki" --state "$tmp/state" \
    --port-file "$tmp/port" 2>>"$tmp/flood.log") &
cpid=$!
for _ in $(seq 600); do [ -s "$tmp/port" ] && break; sleep 0.05; done
port=$(cat "$tmp/port" 2>/dev/null)
python3 - "$port" "$tmp/flood.log" <<'PY'
import socket, sys, time
port, log = int(sys.argv[1]), sys.argv[2]
socks = []
for _ in range(400):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    socks.append(s)
end = time.time() + 30
while time.time() < end and "descriptor limit" not in open(log).read():
    time.sleep(0.05)
for s in socks:
    s.close()
PY
check "the coordinator under ulimit -n 128 reached its limit" grep -q "descriptor limit reached" "$tmp/flood.log"
ok=1
for _ in $(seq 30); do
    "$sk" -q status --coordinator 127.0.0.1:$port --pki "$tmp/pki" >/dev/null 2>&1 && { ok=0; break; }
    sleep 0.5
done
check "after the flood the coordinator answers again" test $ok -eq 0
stop_coord

# ---- certificates that last -------------------------------------------------
p2="$tmp/pki2"
"$sk" certs init --pki "$p2" --cert-days 0 >/dev/null 2>&1
check "certs init --cert-days 0: exit 2" test $? -eq 2
"$sk" certs init --pki "$p2" --cert-days 3 --cert-seconds 9 >/dev/null 2>&1
check "--cert-days and --cert-seconds together: exit 2" test $? -eq 2
"$sk" certs init --pki "$p2" --cert-days 30 >/dev/null
check "certs init --cert-days 30 sets the PKI's default" test "$(cat "$p2/device-cert-seconds" 2>/dev/null)" = 2592000
start_coord "$p2" "$tmp/state2" 1s
js=$("$sk" certs token --pki "$p2" --site lab --cert-seconds 6 --json)
check "certs token --cert-seconds 6 --json" grep -q '"cert_s": 6}' <<<"$js"
tok6=$(grep -o 'skyloom1\.[0-9a-f.]*' <<<"$js")
"$sk" device --coordinator 127.0.0.1:$port --token "$tok6" --state "$tmp/d6" --site lab \
    --stage-listen 127.0.0.1:0 > "$tmp/d6.out" 2> "$tmp/d6.log" &
dpid=$!
for _ in $(seq 400); do [ "$(grep -c 'certificate renewed' "$tmp/d6.log")" -ge 2 ] && break; sleep 0.1; done
check "a device with 6 s certificates renews them on its own (twice within 40 s)" \
    test "$(grep -c 'certificate renewed' "$tmp/d6.log")" -ge 2
nb=$("$sk" certs show --json "$tmp/d6/device.crt" | grep -o '"not_before": "[^"]*"' | cut -d'"' -f4)
na=$("$sk" certs show --json "$tmp/d6/device.crt" | grep -o '"not_after": "[^"]*"' | cut -d'"' -f4)
check "the renewed certificate keeps the token's lifetime (6 s)" test $(( $(date -d "$na" +%s) - $(date -d "$nb" +%s) )) -eq 6
id6=$(sed -n 's/^device //p' "$tmp/d6.out")
check "the renewing device stays online" bash -c '"$0" status --coordinator 127.0.0.1:$1 --pki "$2" | grep -q "^$3 .*online"' "$sk" "$port" "$p2" "$id6"
kill "$dpid"; wait "$dpid"; rc=$?; dpid=""
check "the renewing device stops cleanly on SIGTERM" test $rc -eq 0
check "no heartbeat failed" bash -c '! grep -q "heartbeat failed\|renewal failed" "$0"' "$tmp/d6.log"
tok=$("$sk" certs token --pki "$p2" --site lab)
idr=$("$sk" -q device --coordinator 127.0.0.1:$port --token "$tok" --state "$tmp/dr" --site lab --once | sed -n 's/^device //p')
check "a device enrolls before the rotation" grep -Eq '^d[0-9a-f]{16}$' <<<"$idr"
na=$("$sk" certs show --json "$tmp/dr/device.crt" | grep -o '"not_after": "[^"]*"' | cut -d'"' -f4)
check "its certificate has the PKI's default lifetime (30 days)" test $(( $(date -d "$na" +%s) - $(date +%s) )) -gt $((29 * 86400))
fp0=$("$sk" certs show --json "$p2/coordinator.crt" | grep -o '"sha256": "[0-9a-f]*"' | head -1)
out=$("$sk" certs rotate-coordinator --pki "$p2"); rc=$?
check "certs rotate-coordinator" bash -c 'test $0 -eq 0 && grep -q "new coordinator certificate" <<<"$1"' $rc "$out"
fp1=$("$sk" certs show --json "$p2/coordinator.crt" | grep -o '"sha256": "[0-9a-f]*"' | head -1)
check "the coordinator's certificate changed, the old one is kept" bash -c 'test "$0" != "$1" && test -s "$2/coordinator.crt.prev" && test -s "$2/coordinator.key.prev"' "$fp0" "$fp1" "$p2"
stop_coord; check "coordinator stops" test $? -eq 0
start_coord "$p2" "$tmp/state2" 1s
"$sk" -q device --coordinator 127.0.0.1:$port --state "$tmp/dr" --site lab --once >/dev/null
check "the device enrolled before the rotation heartbeats to the restarted coordinator" test $? -eq 0
stop_coord
"$sk" certs rotate-coordinator --pki "$p2" --days 0 >/dev/null 2>&1
check "rotate-coordinator --days 0: exit 2" test $? -eq 2
out=$("$sk" certs revoke --pki "$p2" --cert-days 3 "$idr" 2>&1); rc=$?
check "revoke --cert-days: exit 2" bash -c 'test $0 -eq 2 && grep -q "revoke takes no --cert-days" <<<"$1"' $rc "$out"
exit $fail
