#!/usr/bin/env bash
# Two data owners' corpora from the Debian package `fortunes`, split by
# subject (the demo's federation and bench/bench_fed.sh): OUTDIR/hum.txt
# (literature, wisdom, love, people, politics, education, humorists, art,
# food, ethnic, men-women) and OUTDIR/tech.txt (computers, science, linux,
# debian, definitions, startrek, kids, medicine, law), each made by
# scripts/demo-corpus.sh (one fortune per document).
# Usage: scripts/fed-corpus.sh OUTDIR [FORTUNE_DIR]
set -euo pipefail
out=${1:?usage: scripts/fed-corpus.sh OUTDIR [FORTUNE_DIR]}
fort=${2:-/usr/share/games/fortunes}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$fort" ]; then
  echo "fed-corpus: $fort not found: install the Debian package 'fortunes' (scripts/deps.sh)" >&2
  exit 1
fi
mkdir -p "$out"
src=$(mktemp -d "$out/.src-XXXXXX")
trap 'rm -rf "$src"' EXIT
mkdir -p "$src/hum" "$src/tech"
for f in literature wisdom love people politics education humorists art food ethnic men-women; do
  [ -f "$fort/$f" ] && cp "$fort/$f" "$src/hum/"
done
for f in computers science linux debian definitions startrek kids medicine law; do
  [ -f "$fort/$f" ] && cp "$fort/$f" "$src/tech/"
done
"$here/demo-corpus.sh" "$out/hum.txt" "$src/hum"
"$here/demo-corpus.sh" "$out/tech.txt" "$src/tech"
