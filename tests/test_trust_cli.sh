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
    "$sk" -q coordinator --listen 127.0.0.1:0 --pki "${1:-$tmp/pki}" --state "${2:-$tmp/state}" \
        --port-file "$tmp/port" --heartbeat "${3:-60s}" &
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

start_coord
check "coordinator writes its port" test -n "$port"
id=$("$sk" -q device --coordinator 127.0.0.1:$port --token "$tok" --state "$tmp/dev" --site lab --once | sed -n 's/^device //p')
check "device enrolls" grep -Eq '^d[0-9a-f]{16}$' <<<"$id"
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
stop_coord; check "coordinator stops cleanly on SIGTERM" test $? -eq 0
start_coord
"$sk" status --coordinator 127.0.0.1:$port --pki "$tmp/pki" | grep -q "^$id .*revoked"
check "after a restart the device is still there and still revoked" test $? -eq 0
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
