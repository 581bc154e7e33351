#!/usr/bin/env bash
# The testbed's own check (scripts/testbed): the RTT and bandwidth measured
# between two of its network namespaces are within 10% of what was set, and
# nothing of a run is left behind: not after a normal exit, not after a
# SIGTERM, and after a SIGKILL the next run removes what the killed one left.
# Skipped (77) when not root or without network namespaces.
set -u
src=$1 build=$2
tb="$src/scripts/testbed"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }

out=$("$tb" check "$build" 2>&1); rc=$?
echo "$out"
[ $rc -eq 77 ] && exit 77
check "the links measure what they were set to (within 10%)" test $rc -eq 0
check "the check measured two links" test "$(grep -c '^link a-' <<<"$out")" -eq 2

# left: the namespaces, cgroups, temporary files and processes of run ID
left() {
  local id=$1
  ip netns list | grep -q "^$id-" && return 0
  [ -e "/sys/fs/cgroup/cpu/$id" ] || [ -e "/sys/fs/cgroup/$id" ] || [ -e "/tmp/$id" ] && return 0
  pgrep -f "/tmp/$id/" >/dev/null && return 0
  return 1
}
export -f left
id=$(grep -o 'run skytb[0-9]*' <<<"$out" | cut -d' ' -f2)
check "a run names its id" test -n "$id"
check "nothing of run $id is left after it ended" bash -c '! left "$0"' "$id"

# up: the WAN stays until a signal; wait until its sites exist
up_until_sites() {
  "$tb" up "$build" 60 > "$1" 2>&1 &
  local pid=$! t=200
  while [ $t -gt 0 ] && ! grep -q '^site asia' "$1"; do sleep 0.1; t=$((t - 1)); done
  echo "$pid"
}
tmp=$(mktemp -d /tmp/test-testbed-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

pid=$(up_until_sites "$tmp/up1.log")
id="skytb$pid"
check "up: the sites exist" bash -c 'ip netns list | grep -q "^$0-asia"' "$id"
kill -TERM "$pid"
t=100; while kill -0 "$pid" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
check "SIGTERM: the run ended within 10 s" bash -c '! kill -0 "$0" 2>/dev/null' "$pid"
check "SIGTERM: nothing of run $id is left" bash -c '! left "$0"' "$id"

pid=$(up_until_sites "$tmp/up2.log")
id="skytb$pid"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
check "SIGKILL: the run left its namespaces and its relay behind" \
    bash -c 'ip netns list | grep -q "^$0-" && pgrep -f "/tmp/$0/" >/dev/null' "$id"
"$tb" clean > "$tmp/clean.log" 2>&1
check "the next run (clean) removes what run $id left" bash -c '! left "$0"' "$id"
check "  and says so" grep -q "removing what run $id left behind" "$tmp/clean.log"

exit $fail
