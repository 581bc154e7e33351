#!/usr/bin/env bash
# Assembles the demo corpus from the Debian package `fortunes` (the fortune
# cookie files under /usr/share/games/fortunes: quotations, jokes, literature,
# computing lore; ~2.5 MB of English). Output: one line per line of a
# fortune, a blank line between fortunes, so each fortune is one document.
# Usage: scripts/demo-corpus.sh OUTFILE [FORTUNE_DIR]
set -euo pipefail
out=${1:?usage: scripts/demo-corpus.sh OUTFILE [FORTUNE_DIR]}
dir=${2:-/usr/share/games/fortunes}
if [ ! -d "$dir" ]; then
  echo "demo-corpus: $dir not found: install the Debian package 'fortunes' (scripts/deps.sh)" >&2
  exit 1
fi
files=()
for f in "$dir"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && files+=("$f")
done
[ ${#files[@]} -gt 0 ] || { echo "demo-corpus: no fortune files in $dir" >&2; exit 1; }
tmp="$out.tmp.$$"
# A line "%" ends a fortune. Leading/trailing blanks go; blank lines inside a
# fortune are dropped so they do not split it; backspace overstrikes are left
# for the tokenizer (it drops control characters, as BERT does).
LC_ALL=C awk '
  FNR == 1 && NR > 1 { if (n) print ""; n = 0 }
  /^%[ \t]*$/ { if (n) print ""; n = 0; next }
  { sub(/^[ \t]+/, ""); sub(/[ \t\r]+$/, ""); if ($0 == "") next; print; n++ }
  END { if (n) print "" }
' "${files[@]}" > "$tmp"
mv "$tmp" "$out"
echo "demo-corpus: wrote $out ($(wc -c < "$out") bytes, ${#files[@]} files from $dir)" >&2
