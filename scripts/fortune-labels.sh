#!/usr/bin/env bash
# A labelled corpus from the Debian package `fortunes`: one line per fortune,
# "SUBJECT<TAB>TEXT", the subject being the fortune's file (computers, food,
# linux, ...) and the text its lines joined by spaces (blanks trimmed, as
# scripts/demo-corpus.sh reads them). For skyloom data prepare --labels.
# Usage: scripts/fortune-labels.sh OUTFILE [FORTUNE_DIR]
set -euo pipefail
out=${1:?usage: scripts/fortune-labels.sh OUTFILE [FORTUNE_DIR]}
dir=${2:-/usr/share/games/fortunes}
if [ ! -d "$dir" ]; then
  echo "fortune-labels: $dir not found: install the Debian package 'fortunes' (scripts/deps.sh)" >&2
  exit 1
fi
files=()
for f in "$dir"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && files+=("$f")
done
[ ${#files[@]} -gt 0 ] || { echo "fortune-labels: no fortune files in $dir" >&2; exit 1; }
tmp="$out.tmp.$$"
# A line "%" ends a fortune; tabs inside a fortune become spaces (the tab
# separates the label).
LC_ALL=C awk '
  function flush() { if (text != "") print subject "\t" text; text = "" }
  FNR == 1 { flush(); subject = FILENAME; sub(/.*\//, "", subject) }
  /^%[ \t]*$/ { flush(); next }
  { gsub(/\t/, " "); sub(/^[ ]+/, ""); sub(/[ \r]+$/, ""); if ($0 == "") next
    text = text == "" ? $0 : text " " $0 }
  END { flush() }
' "${files[@]}" > "$tmp"
mv "$tmp" "$out"
echo "fortune-labels: wrote $out ($(wc -l < "$out") fortunes, ${#files[@]} subjects from $dir)" >&2
