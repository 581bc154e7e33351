#!/usr/bin/env bash
# The systemd units in scripts/systemd/ (docs/deploy.md): systemd-analyze
# verify finds nothing to say about them (with ExecStart pointed at the binary
# just built, since verify checks that it exists), they keep the properties the
# deployment guide promises, and every option their ExecStart passes is one the
# subcommand knows. Skips, saying why, where systemd-analyze is missing or
# cannot verify even a trivial unit (some containers).
# usage: test_systemd_units.sh SKYLOOM SOURCE_ROOT
set -u
sk="$1"; src="$2"
if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: systemd-analyze not found (Debian package systemd)"; exit 77
fi
sk=$(readlink -f "$sk")
dir=$(mktemp -d /tmp/skyloom-units-XXXXXX); trap 'rm -rf "$dir"' EXIT
fail=0
check() { # check DESC CMD...
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
printf '[Unit]\nDescription=control\n[Service]\nExecStart=%s version\n' "$sk" > "$dir/control.service"
if ! out=$(systemd-analyze verify "$dir/control.service" 2>&1) || [ -n "$out" ]; then
    echo "SKIP: systemd-analyze verify does not work here: $(head -n 2 <<<"$out" | tr '\n' ' ')"; exit 77
fi
# the checker notices a mistake
sed 's/^Description=/Descripton=/' "$dir/control.service" > "$dir/bad.service"
out=$(systemd-analyze verify "$dir/bad.service" 2>&1)
check "verify reports a misspelt key (the check below can fail)" grep -q "Unknown key" <<<"$out"
rm -f "$dir/control.service" "$dir/bad.service"

units=("$src"/scripts/systemd/*.service)
check "two units in scripts/systemd" test ${#units[@]} -eq 2
for u in "${units[@]}"; do
    name=$(basename "$u")
    sed "s#/usr/local/bin/skyloom#$sk#g" "$u" > "$dir/$name"
    out=$(systemd-analyze verify "$dir/$name" 2>&1); rc=$?
    check "$name: systemd-analyze verify is silent" bash -c 'test $0 -eq 0 -a -z "$1" || { echo "$1"; false; }' $rc "$out"
    for want in "User=skyloom" "StateDirectoryMode=0700" "Restart=on-failure" "UMask=0077" \
                "ExecStart=/usr/local/bin/skyloom " "WantedBy=multi-user.target"; do
        check "$name: $want" grep -q "^$want" "$u"
    done
    exec=$(grep '^ExecStart=' "$u")
    cmd=$(awk '{ print $2 }' <<<"$exec")
    help=$("$sk" "$cmd" --help)
    for opt in $(grep -o -- ' --[a-z-]*' <<<"$exec"); do
        check "$name: skyloom $cmd knows $opt" grep -q -- "$opt" <<<"$help"
    done
done
exit $fail
