#!/usr/bin/env bash
# The attacker's public text for bench/privacy: English prose that shares no
# document with the data owner's (the fortunes corpus of scripts/demo-corpus.sh):
# the GNU manuals Debian installs under /usr/share/info (coreutils, grep,
# findutils, gzip, gnupg, ...) and the licence texts of
# /usr/share/common-licenses (package base-files). Info markup is dropped
# (node headers, menus, underlines); each paragraph becomes one document
# (a blank line between documents, as demo-corpus.sh writes fortunes); the
# typographic quotes, dashes, bullets and (c) of the manuals become the ASCII
# the fortunes use, as an attacker would adapt its text to the owner's.
# Usage: bench/privacy/public-corpus.sh OUTFILE
set -euo pipefail
out=${1:?usage: public-corpus.sh OUTFILE}
files=()
for f in /usr/share/info/*.info*.gz /usr/share/common-licenses/*; do
  [ -f "$f" ] && [ ! -L "$f" ] && files+=("$f")
done
[ ${#files[@]} -gt 0 ] || { echo "public-corpus: no files under /usr/share/info or /usr/share/common-licenses" >&2; exit 1; }
tmp="$out.tmp.$$"
for f in "${files[@]}"; do
  case "$f" in *.gz) zcat "$f" ;; *) cat "$f" ;; esac
  printf '\n\n'
done | LC_ALL=C awk '
  /\x1f/ { skip = 1; next }                           # an info node separator: its header line follows
  skip && /^File: / { skip = 0; next }
  { skip = 0 }
  /^\* Menu:/ { menu = 1; next }                      # a menu runs to the next blank line
  menu && /^[ \t]*$/ { menu = 0 }
  menu { next }
  /^[ \t]*[-=*.]+[ \t]*$/ { next }                    # underlines
  /^[ \t]*$/ { if (n) print ""; n = 0; next }
  { sub(/^[ \t]+/, ""); sub(/[ \t\r]+$/, ""); print; n++ }
  END { if (n) print "" }
' | sed -e "s/[‘’]/'/g" -e 's/[“”]/"/g' -e 's/©/(c)/g' -e 's/•/*/g' -e 's/—/--/g' -e 's/–/-/g' > "$tmp"
mv "$tmp" "$out"
echo "public-corpus: wrote $out ($(wc -c < "$out") bytes from ${#files[@]} files)" >&2
