#!/usr/bin/env bash
# skyloom plan: a good run (table, JSON, SVG, compare, deterministic) and its error paths.
set -u
sk="$1"
ex="$2/docs/examples"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check DESC CMD... : CMD must succeed
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
args=(--config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$ex/devices.json"
      --network "$ex/network.json")

out=$("$sk" plan "${args[@]}"); rc=$?
check "good run exits 0" test $rc -eq 0
check "table names the algorithm and schedule" grep -q '^optimal, 1f1b, ' <<<"$out"
check "table has the simulated iteration" grep -q '^iteration [0-9.]* s (simulated), bubble' <<<"$out"
check "table lists left-out devices with a reason" grep -q '^left out: eu-cpu: ' <<<"$out"
check "table has the lower bound and the certified gap" grep -q '^lower bound [0-9.]* s for any plan at [0-9]* micro-batches: certified gap [0-9.]*%' <<<"$out"

"$sk" plan "${args[@]}" --json >"$tmp/a.json"; rc=$?
check "--json exits 0" test $rc -eq 0
check "--json is JSON with stages covering all units" /usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
st = p["stages"]
assert st[0]["first_unit"] == 0 and st[-1]["last_unit"] == p["units"] - 1
assert all(a["last_unit"] + 1 == b["first_unit"] for a, b in zip(st, st[1:]))
assert p["iteration_s"] > 0 and 0 <= p["bubble"] < 1
assert all(s["simulated"]["peak_memory_bytes"] <= s["memory_bytes"] for s in st)
# per-unit times: one per unit of the (inclusive) range, adding up to the stage time
for s in st:
    n = s["last_unit"] - s["first_unit"] + 1
    assert len(s["unit_fwd_s"]) == n and len(s["unit_bwd_s"]) == n
    assert abs(sum(s["unit_fwd_s"]) - s["fwd_s"]) <= 1e-9 * s["fwd_s"]
    assert abs(sum(s["unit_bwd_s"]) - s["bwd_s"]) <= 1e-9 * s["bwd_s"]
    assert s["simulated"]["peak_memory_bytes"] == s["static_bytes"] + s["simulated"]["peak_inflight"] * s["stash_bytes"]
assert 0 < p["lower_bound_s"] <= p["iteration_s"] and p["certified_gap"] >= 0
assert p["data_owner"] is None
' "$tmp/a.json"
"$sk" plan "${args[@]}" --json >"$tmp/b.json"
check "same input, same output" cmp -s "$tmp/a.json" "$tmp/b.json"

"$sk" plan "${args[@]}" --algo sky --schedule gpipe --micro-batches 6 --svg "$tmp/t.svg" >"$tmp/out.txt"; rc=$?
check "--algo sky --schedule gpipe --svg exits 0" test $rc -eq 0
check "gpipe with 6 micro-batches" grep -q '^sky, gpipe, 6 micro-batches' "$tmp/out.txt"
check "svg has a legend with forward, backward, send and idle" bash -c \
    'grep -q "<svg" "$1" && grep -q ">forward<" "$1" && grep -q ">backward<" "$1" && grep -q ">send activation<" "$1" && grep -q ">idle<" "$1"' _ "$tmp/t.svg"

out=$("$sk" plan "${args[@]}" --compare); rc=$?
check "--compare exits 0" test $rc -eq 0
check "--compare shows even, sky, optimal" bash -c \
    'grep -q "^even " <<<"$1" && grep -q "^sky " <<<"$1" && grep -q "^optimal " <<<"$1"' _ "$out"
"$sk" plan "${args[@]}" --compare --json | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)
assert set(p) == {"even", "sky", "optimal"}
assert p["optimal"]["iteration_s"] <= min(p["even"]["iteration_s"], p["sky"]["iteration_s"])
assert len({p[a]["micro_batches"] for a in p}) == 1
'; check "--compare --json: optimal is fastest at one micro-batch count" test $? -eq 0

"$sk" plan "${args[@]}" --data-owner us-laptop --json | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)
st = p["stages"]
assert p["data_owner"] == "us-laptop"
assert st[0]["device"] == "us-laptop" and st[-1]["device"] == "us-laptop"
assert st[0]["first_unit"] == 0 and st[-1]["last_unit"] == p["units"] - 1
assert len(st) == 1 or len(st) >= 3
assert len({s["device"] for s in st[1:-1]} | {"us-laptop"}) == len(st) - (len(st) > 1)
'; check "--data-owner: the owner runs the first and the last stage" test $? -eq 0
"$sk" plan "${args[@]}" --first-device us-laptop --compare --json | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)
for a in ("even", "sky", "optimal"):
    st = p[a]["stages"]
    assert st[0]["device"] == "us-laptop" and st[0]["first_unit"] == 0, a
    assert all(s["device"] != "us-laptop" for s in st[1:]) and p[a]["data_owner"] is None, a
assert p["optimal"]["iteration_s"] <= min(p["even"]["iteration_s"], p["sky"]["iteration_s"])
'; check "--first-device --compare: every algorithm starts the plain chain there" test $? -eq 0
"$sk" plan "${args[@]}" --data-owner eu-a100 --compare --json | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)
for a in ("even", "sky", "optimal"):
    st = p[a]["stages"]
    assert st[0]["device"] == "eu-a100" and st[-1]["device"] == "eu-a100", a
assert p["optimal"]["iteration_s"] <= min(p["even"]["iteration_s"], p["sky"]["iteration_s"])
'; check "--data-owner --compare: every algorithm keeps the owner at both ends" test $? -eq 0

"$sk" plan --help | grep -q 'usage: skyloom plan'; check "--help" test $? -eq 0

expect_fail() { # expect_fail DESC CODE PATTERN ARGS...
    local desc="$1" code="$2" pat="$3"; shift 3
    local err rc
    err=$("$sk" plan "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -eq "$code" ] && [ "$(wc -l <<<"$err")" -eq 1 ] && grep -q -- "$pat" <<<"$err"; then
        echo "ok   $desc"
    else
        echo "FAIL $desc (rc $rc: $err)"; fail=1
    fi
}
expect_fail "missing options" 2 "skyloom plan: --config, --seq" --config "$ex/bert-base.json"
expect_fail "unknown algorithm" 2 "unknown --algo 'best'" "${args[@]}" --algo best
expect_fail "unknown schedule" 2 "unknown --schedule" "${args[@]}" --schedule zigzag
expect_fail "bad --seq" 2 "--seq must be" "${args[@]}" --seq zero
expect_fail "unknown option" 2 "unknown option '--frob'" "${args[@]}" --frob
expect_fail "unknown data owner" 1 "--data-owner: no device 'mars-1'" "${args[@]}" --data-owner mars-1
expect_fail "unknown first device" 1 "--first-device: no device 'mars-1'" "${args[@]}" --first-device mars-1
expect_fail "a data owner and a first device" 2 "exclude each other" "${args[@]}" --data-owner eu-a100 --first-device eu-a100
expect_fail "missing file" 1 "nope.json: No such file" --config "$tmp/nope.json" --seq 128 \
    --micro-batch 8 --devices "$ex/devices.json" --network "$ex/network.json"
printf '{"devices": [\n  {"id": "a", "memory_gib": 8, "flops": 1e12},\n  {"id": "b", "memory_gib": -1, "flops": 1e12}\n]}\n' >"$tmp/bad.json"
expect_fail "malformed devices: file, line, field" 1 "bad.json:3: devices\[1\].memory_gib: must be between" \
    --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$tmp/bad.json" --network "$ex/network.json"
printf '{"links": [\n' >"$tmp/net.json"
expect_fail "network syntax error: file and line" 1 "net.json:2:" \
    --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$ex/devices.json" --network "$tmp/net.json"
printf '[{"id": "t1", "site": "eu", "memory_bytes": 100000000, "flops": 1e12},\n {"id": "t2", "site": "us", "memory_bytes": 100000000, "flops": 1e12}]\n' >"$tmp/tiny.json"
expect_fail "infeasible: shortfall and largest model" 1 "short by [0-9]* bytes.*largest model that fits" \
    --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$tmp/tiny.json" --network "$ex/network.json"
printf '{"hidden_size": 64, "num_hidden_layers": 0, "num_attention_heads": 2,\n "intermediate_size": 128, "vocab_size": 100}\n' >"$tmp/zero.json"
expect_fail "0 layers refused" 1 "zero.json:1: num_hidden_layers: must be between 1 and 256, got 0" \
    --config "$tmp/zero.json" --seq 16 --micro-batch 2 --devices "$ex/devices.json" --network "$ex/network.json"
printf '[{"id": "z", "memory_gib": 8, "unit_seconds": {"embeddings": [0, 0], "encoder": [0, 0], "head": [0, 0]}}]\n' >"$tmp/zeros.json"
expect_fail "all-zero unit_seconds refused" 1 "zeros.json:1: \[0\].unit_seconds: are all zero" \
    --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$tmp/zeros.json" --network "$ex/network.json"
printf '{"links": [{"a": "eu", "b": "us", "bandwidth_gbps": 1, "latency_ms": 9},\n {"a": "us", "b": "eu", "bandwidth_gbps": 9, "latency_ms": 1}]}\n' >"$tmp/twice.json"
expect_fail "a site pair linked twice refused" 1 "twice.json:2: links\[1\]: links\[0\] already joins" \
    --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$ex/devices.json" --network "$tmp/twice.json"
printf '{"devices": [{"id": "a\x1b[31m", "memory_gib": 8, "flops": 1e12}]}\n' >"$tmp/esc.json"
err=$("$sk" plan --config "$ex/bert-base.json" --seq 128 --micro-batch 8 --devices "$tmp/esc.json" --network "$ex/network.json" 2>&1 >/dev/null)
if LC_ALL=C grep -q "$(printf '\x1b')" <<<"$err" || ! grep -q 'x1b' <<<"$err"; then
    echo "FAIL a control byte from a file is escaped ($err)"; fail=1
else echo "ok   a control byte from a file is escaped"; fi
expect_fail "seq above max_position_embeddings" 1 "exceeds max_position_embeddings" \
    --config "$ex/bert-base.json" --seq 4096 --micro-batch 8 --devices "$ex/devices.json" --network "$ex/network.json"
exit $fail
