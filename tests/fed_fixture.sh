# Sourced by the federation tests of the trainer: two owners with different
# text (the README and half the docs, the rest), one 400-word vocabulary,
# a shard each of 24-token sequences (DIR/a.shard, DIR/b.shard) and a
# model small enough for seconds (DIR/cfg.json).
# usage: fed_fixture DIR SKYLOOM SOURCE_ROOT
fed_fixture() {
  local d=$1 sk=$2 src=$3 half o V
  ls "$src"/docs/*.md | sort > "$d/docs"
  half=$(( $(wc -l < "$d/docs") / 2 ))
  cat "$src"/README.md $(head -n "$half" "$d/docs") > "$d/a.txt"
  cat $(tail -n +"$((half + 1))" "$d/docs") > "$d/b.txt"
  cat "$d/a.txt" "$d/b.txt" > "$d/all.txt"
  "$sk" -q data vocab --corpus "$d/all.txt" --size 400 --out "$d/vocab.txt" >/dev/null || return 1
  for o in a b; do
    "$sk" -q data prepare --vocab "$d/vocab.txt" --in "$d/$o.txt" --out "$d/$o.shard" --seq 24 >/dev/null ||
      return 1
  done
  V=$(wc -l < "$d/vocab.txt")
  cat > "$d/cfg.json" <<JSON
{"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 48,
 "vocab_size": $V, "max_position_embeddings": 24, "hidden_dropout_prob": 0.1,
 "attention_probs_dropout_prob": 0.1}
JSON
}
