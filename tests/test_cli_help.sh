#!/usr/bin/env bash
# --help of every subcommand and every command of a family (job, certs, data,
# coordinator), found from the help texts themselves: exit 0, the usage on
# stdout and nothing on stderr, a family member's help about it alone, no
# printf escape left in a text, and the environment variables named where a
# command takes --coordinator or --pki.
# usage: test_cli_help.sh SKYLOOM
set -u
sk="$1"
fail=0
tmp=$(mktemp -d /tmp/skyloom-help-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }

# help ARGS...: runs skyloom ARGS --help; stdout in $tmp/out, stderr in $tmp/err, exit in rc
help() { "$sk" "$@" --help > "$tmp/out" 2> "$tmp/err"; rc=$?; }

cmds=$("$sk" help | sed -n '/^commands:/,/^$/p' | awk 'NF >= 2 && $1 ~ /^[a-z-]+$/ {print $1}')
check "skyloom help lists the commands" test "$(wc -w <<<"$cmds")" -ge 12
n=0
for c in $cmds; do
    help "$c"
    check "$c --help: exit 0, 'usage: skyloom $c' on stdout, stderr empty" \
        bash -c 'test $0 -eq 0 && grep -q "^usage: skyloom $1\b" "$2/out" && ! test -s "$2/err"' "$rc" "$c" "$tmp"
    check "$c --help: no printf escape (%%) in the text" bash -c '! grep -q "%%" "$0/out"' "$tmp"
    "$sk" help "$c" > "$tmp/via-help" 2>&1
    check "skyloom help $c prints the same" cmp -s "$tmp/out" "$tmp/via-help"
    # the family's members: "usage: skyloom C SUB" and the lines under it
    subs=$(grep -E "^(usage: +| +)skyloom $c [a-z][a-z-]*( |$)" "$tmp/out" | awk -v c="$c" '{for (i = 1; i < NF; i++) if ($i == c) {print $(i + 1); break}}' | sort -u)
    for s in $subs; do
        n=$((n + 1))
        help "$c" "$s"
        check "$c $s --help: exit 0, its usage first, stderr empty" \
            bash -c 'test $0 -eq 0 && head -1 "$3/out" | grep -q "^usage: skyloom $1 $2\b" && ! test -s "$3/err"' "$rc" "$c" "$s" "$tmp"
        others=$(grep -E "^(usage: +| +)skyloom $c [a-z]" "$tmp/out" | grep -vE "skyloom $c $s( |$)")
        check "$c $s --help: about $s alone (no other $c command's usage)" test -z "$others"
        check "$c $s --help: no printf escape (%%)" bash -c '! grep -q "%%" "$0/out"' "$tmp"
        case "$c" in
            job) want="SKYLOOM_COORDINATOR SKYLOOM_PKI" ;;
            certs) [ "$s" = show ] && want="" || want="SKYLOOM_PKI" ;;
            *) want="" ;;
        esac
        for v in $want; do
            check "$c $s --help names $v" grep -q "$v" "$tmp/out"
        done
    done
done
check "families found: job (9), certs (5), data (4), coordinator backup" test $n -ge 19
for c in "status:SKYLOOM_COORDINATOR SKYLOOM_PKI" "device:SKYLOOM_COORDINATOR" "coordinator:SKYLOOM_PKI" \
         "job:SKYLOOM_COORDINATOR SKYLOOM_PKI" "certs:SKYLOOM_PKI"; do
    help "${c%%:*}"
    for v in ${c#*:}; do
        check "${c%%:*} --help names $v" grep -q "$v" "$tmp/out"
    done
done
help job submit
check "job submit --help has submit's options" grep -q -- "--codec-act" "$tmp/out"
help job status JOB_ID
check "job status JOB --help: exit 0 (the help wins over a missing coordinator)" test $rc -eq 0
exit $fail
