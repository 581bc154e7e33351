#!/usr/bin/env python3
"""Reads meson's testlog.json and prints 'N passed, N failed[, N skipped]'.

Exits non-zero when any test failed or none ran, so `make test` fails too."""
import json
import sys

log = sys.argv[1]
passed = failed = skipped = 0
try:
    with open(log) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line).get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:
                failed += 1
except FileNotFoundError:
    print(f"no test log at {log}", file=sys.stderr)
    failed = 1
tail = f", {skipped} skipped" if skipped else ""
print(f"{passed} passed, {failed} failed{tail}")
sys.exit(1 if failed or passed == 0 else 0)
