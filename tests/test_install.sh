#!/usr/bin/env bash
# make install into a staging directory (DESTDIR), as a package build does:
# an executable PREFIX/bin/skyloom that runs from anywhere and prints its
# version, the systemd units pointing at it, the docs; nothing outside
# DESTDIR/PREFIX. The build directory's own prefix is kept (so the test
# configures nothing anew).
# usage: test_install.sh SOURCE_ROOT BUILD_ROOT
set -u
src="$1"; build="$2"
if ! command -v make >/dev/null; then
    echo "SKIP: make not found (Debian package make)"; exit 77
fi
fail=0
tmp=$(mktemp -d /tmp/skyloom-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }

prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
stage="$tmp/stage"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$src" install BUILD="$build" PREFIX="$prefix" DESTDIR="$stage" > "$tmp/install.log" 2>&1; rc=$?
check "make install DESTDIR=... PREFIX=$prefix succeeds" bash -c 'test $0 -eq 0 || { tail -20 "$1"; false; }' "$rc" "$tmp/install.log"
bin="$stage$prefix/bin/skyloom"
check "an executable skyloom in DESTDIR$prefix/bin" test -x "$bin"
out=$(cd / && env -i PATH="$stage$prefix/bin:/usr/bin:/bin" skyloom --version 2>&1); rc=$?
check "the installed skyloom, found on PATH from /, prints its version" \
    bash -c 'test $0 -eq 0 && grep -q "^skyloom [0-9][0-9.]*$" <<<"$(head -1 <<<"$1")"' "$rc" "$out"
check "it is the version the build has" \
    test "$(head -1 <<<"$out")" = "$("$build/cli/skyloom" --version | head -1)"
for u in skyloom-coordinator skyloom-device; do
    f="$stage$prefix/lib/systemd/system/$u.service"
    check "$u.service installed, ExecStart at $prefix/bin/skyloom" grep -q "^ExecStart=$prefix/bin/skyloom " "$f"
done
check "the docs installed (README.md and docs/jobs.md under share/doc/skyloom)" \
    test -s "$stage$prefix/share/doc/skyloom/README.md" -a -s "$stage$prefix/share/doc/skyloom/docs/jobs.md"
outside=$(cd "$stage" && find . -mindepth 1 \( -type f -o -type l \) | grep -v "^\.$prefix/" | head -5)
check "nothing installed outside DESTDIR$prefix" test -z "$outside"
exit $fail
