# scripts/cluster.sh - a coordinator and devices on loopback, for tests, the
# demo and benchmarks. Source it, set SK (the skyloom binary) and CL (a
# directory of its own), then:
#   cl_start [coordinator args...]      CA, coordinator (port 0, port file); sets CL_ADDR,
#                                       and CL_HTTP (its HTTP server, also on a free port)
#   cl_device NAME SITE [device args...]  enrolls a device by token; its id in CL_ID
#   cl_wait_online N                    until N devices are online
#   cl_job ARGS...                      skyloom job ARGS with --coordinator and --pki
#   cl_kill9 NAME                       SIGKILLs device NAME (or "coord") and reaps it
#   cl_restart NAME                     starts device NAME again (its stored identity, the
#                                       same arguments); "coord": the coordinator, same port
#   cl_shard SRC                        text.shard and vocab.txt (400 words) in $CL from the
#                                       repository SRC's docs; the vocabulary's size in CL_VOCAB
#   cl_jq JOB EXPR                      EXPR (Python, over j) of `job status JOB --json`
#   cl_progress JOB EPOCH [N]           true once JOB runs in EPOCH or later with more than N
#                                       steps done in it; an ended job sets CL_POLL_STOP
#   cl_stop                             stops every process it started and waits for them
# Every process is started in the background with its log in $CL/NAME.log and
# its pid recorded; cl_stop (run it from an EXIT trap) kills and reaps them.
# Readiness is polled with deadlines, never assumed after a sleep.

CL_PIDS=()
CL_ALL=() # every pid ever started, for cl_alive
declare -A CL_PID_OF=() CL_ARGS_OF=()

cl_die() { echo "cluster: $*" >&2; return 1; }

# cl_poll SECONDS CMD...: runs CMD every 0.1 s until it succeeds (or CMD
# sets CL_POLL_STOP: it never will).
cl_poll() {
  local t=$(( $1 * 10 )); shift
  CL_POLL_STOP=
  while [ $t -gt 0 ]; do
    "$@" && return 0
    [ -n "$CL_POLL_STOP" ] && return 1
    sleep 0.1
    t=$(( t - 1 ))
  done
  return 1
}

cl_start() {
  mkdir -p "$CL"
  "$SK" -q certs init --pki "$CL/pki" >/dev/null || return 1
  CL_ARGS_OF[coord]="$*"
  _cl_coord 0 "$@"
}

# _cl_coord PORT ARGS...: the coordinator on PORT (0: a free one), its HTTP
# server on a free port
_cl_coord() {
  local port=$1; shift
  rm -f "$CL/port" "$CL/http-port"
  "$SK" coordinator --listen "127.0.0.1:$port" --pki "$CL/pki" --state "$CL/coord" \
      --port-file "$CL/port" --heartbeat 1s \
      --http-listen 127.0.0.1:0 --http-port-file "$CL/http-port" "$@" >>"$CL/coord.log" 2>&1 &
  CL_PIDS+=($!)
  CL_ALL+=($!)
  CL_PID_OF[coord]=$!
  cl_poll 20 test -s "$CL/port" || { cl_die "the coordinator did not start (see $CL/coord.log)"; return 1; }
  CL_ADDR="127.0.0.1:$(cat "$CL/port")"
  CL_HTTP=""
  [ -s "$CL/http-port" ] && CL_HTTP="127.0.0.1:$(cat "$CL/http-port")"
  return 0
}

cl_device() {
  local name=$1 site=$2; shift 2
  local tok
  tok=$("$SK" -q certs token --pki "$CL/pki" --site "$site") || return 1
  CL_ARGS_OF[$name]="--site $site $*"
  _cl_dev "$name" --token "$tok" --site "$site" "$@"
  cl_poll 30 grep -qs '^device d' "$CL/$name.log" || { cl_die "device $name did not enroll (see $CL/$name.log)"; return 1; }
  CL_ID=$(grep '^device d' "$CL/$name.log" | head -1 | cut -d' ' -f2)
}

_cl_dev() {
  local name=$1; shift
  "$SK" device --coordinator "$CL_ADDR" --state "$CL/$name" \
      --stage-listen 127.0.0.1:0 "$@" >>"$CL/$name.log" 2>&1 &
  CL_PIDS+=($!)
  CL_ALL+=($!)
  CL_PID_OF[$name]=$!
}

cl_kill9() {
  local p=${CL_PID_OF[$1]:-}
  [ -n "$p" ] || { cl_die "no process $1"; return 1; }
  kill -9 "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
  CL_PID_OF[$1]=""
  local keep=() q
  for q in "${CL_PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
  CL_PIDS=("${keep[@]}")
  return 0
}

cl_restart() {
  if [ "$1" = coord ]; then
    # shellcheck disable=SC2086
    _cl_coord "${CL_ADDR##*:}" ${CL_ARGS_OF[coord]}
  else
    # shellcheck disable=SC2086
    _cl_dev "$1" ${CL_ARGS_OF[$1]}
  fi
}

cl_online() {
  local n
  n=$("$SK" status --coordinator "$CL_ADDR" --pki "$CL/pki" --json 2>/dev/null | grep -c '"state": "online"')
  [ "${n:-0}" -ge "$1" ]
}

cl_wait_online() { cl_poll 30 cl_online "$1" || cl_die "fewer than $1 devices online"; }

cl_job() { "$SK" job "$@" --coordinator "$CL_ADDR" --pki "$CL/pki"; }

# cl_alive: 0 if any process cl_start or cl_device started is still running.
cl_alive() {
  local p
  for p in "${CL_ALL[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# (safe under set -e: a process that is gone already, or that ends by the
# signal, is not an error here)
cl_stop() {
  local p
  for p in "${CL_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${CL_PIDS[@]}"; do
    # a process that does not stop within 10 s is killed
    local t=100
    while kill -0 "$p" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  CL_PIDS=()
}

cl_shard() {
  cat "$1"/README.md "$1"/docs/*.md > "$CL/corpus.txt" &&
    "$SK" -q data vocab --corpus "$CL/corpus.txt" --size 400 --out "$CL/vocab.txt" >/dev/null &&
    "$SK" -q data prepare --vocab "$CL/vocab.txt" --in "$CL/corpus.txt" --out "$CL/text.shard" --seq 24 >/dev/null ||
    { cl_die "no shard"; return 1; }
  CL_VOCAB=$(wc -l < "$CL/vocab.txt")
}

# cl_config FILE HIDDEN LAYERS INTERMEDIATE: a small BERT config for the
# shard's vocabulary (2 heads, 24 positions, dropout 0.1).
cl_config() {
  cat > "$1" <<JSON
{"hidden_size": $2, "num_hidden_layers": $3, "num_attention_heads": 2, "intermediate_size": $4,
 "vocab_size": $CL_VOCAB, "max_position_embeddings": 24, "hidden_dropout_prob": 0.1,
 "attention_probs_dropout_prob": 0.1}
JSON
}

cl_jq() {
  cl_job status "$1" --json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin); print($2)" 2>/dev/null
}

cl_progress() {
  local v
  v=$(cl_jq "$1" '"end" if j["state"] in ("done", "failed", "stopped") else int(j["state"] == "running" and j["epoch"] >= '"$2"' and j["step"] > j["plan"]["start_step"] + '"${3:-0}"')')
  if [ "$v" = end ]; then
    echo "     the job ended early: $(cl_jq "$1" 'j["state"], j["step"], j["reason"]')"
    CL_POLL_STOP=1
  fi
  [ "$v" = 1 ]
}
