#!/usr/bin/env bash
# skyloom certs / coordinator / device / status end to end on 127.0.0.1,
# a free port chosen by the coordinator. Leaves no process behind.
set -u
sk="$1"
fail=0
tmp=$(mktemp -d /tmp/skyloom-trustcli-XXXXXX)
cpid=""
cleanup() { [ -n "$cpid" ] && kill "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
check() { # check DESC CMD...
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
start_coord() {
    rm -f "$tmp/port"
    "$sk" -q coordinator --listen 127.0.0.1:0 --pki "$tmp/pki" --state "$tmp/state" \
        --port-file "$tmp/port" --heartbeat 60s &
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
"$sk" certs init --pki "$tmp/bad" --san FOO:x >/dev/null 2>&1
check "certs init rejects a bad --san" test $? -eq 1
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
exit $fail
