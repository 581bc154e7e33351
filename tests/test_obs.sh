#!/usr/bin/env bash
# The coordinator's HTTP side end to end, on loopback: a coordinator and
# three device processes run a 4-stage job; then
#   /metrics passes Debian's `promtool check metrics` and says what happened
#     (the job's step and commits, enrollments and a refusal by reason, link
#     bytes, stage seconds, heartbeat ages);
#   a real Prometheus server scrapes it and answers a query for the job's step;
#   `skyloom job trace --svg` writes the measured timeline of a step;
#   the dashboard renders in headless Chromium (a non-empty screenshot; the
#     job's id and its four SVGs in the DOM);
#   a non-loopback --http-listen is refused without --http-token, and with
#     one every request needs the bearer token; --http-listen off serves
#     nothing; a default address that is taken leaves the coordinator running.
# Prometheus and Chromium come from Debian packages (prometheus, chromium):
# installed here as root when missing; their checks are skipped, saying why,
# only when they cannot be installed. Every process this test starts is
# killed and reaped on every path; its directory is removed.
set -u
SK="$1"; src="$2"
CL=$(mktemp -d /tmp/skyloom-obs-XXXXXX)
. "$src/scripts/cluster.sh"
fail=0
check() { local desc="$1"; shift; if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi; }

# processes besides the cluster's: each the leader of its own process group
EXTRA=()
stop_extra() {
  local p t
  for p in "${EXTRA[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done
  for p in "${EXTRA[@]}"; do
    t=100
    while kill -0 "$p" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  EXTRA=()
}
trap 'stop_extra; cl_stop; [ -n "${KEEP:-}" ] || rm -rf "$CL"' EXIT
# start NAME CMD...: in the background, in a process group of its own, output in $CL/NAME.log
start() { local name=$1; shift; setsid "$@" >"$CL/$name.log" 2>&1 & EXTRA+=($!); LAST_PID=$!; }
# bounded SECONDS CMD...: runs CMD (its own process group) and kills the group past the deadline
bounded() {
  local secs=$1; shift
  setsid "$@" & local p=$!
  EXTRA+=($p)
  local t=$((secs * 10))
  while kill -0 "$p" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
  kill -KILL -- "-$p" 2>/dev/null
  wait "$p"; local rc=$?
  kill -KILL -- "-$p" 2>/dev/null # helpers it left behind
  return $rc
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# need CMD PACKAGE: CMD on PATH, installing PACKAGE as root if it is missing
need() {
  command -v "$1" >/dev/null && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >"$CL/apt-$2.log" 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >>"$CL/apt-$2.log" 2>&1; }
  fi
  command -v "$1" >/dev/null
}
metric() { # metric FILE 'NAME{LABELS}': its value (empty if absent)
  awk -v k="$2" '$1 == k {print $2}' "$1"
}

d=$CL
cl_shard "$src" || exit 1
V=$CL_VOCAB
cat > "$d/cfg.json" <<JSON
{"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 48,
 "vocab_size": $V, "max_position_embeddings": 24}
JSON

cl_start || exit 1
check "the coordinator serves HTTP on a free port (--http-listen 127.0.0.1:0, --http-port-file)" test -n "$CL_HTTP"
cl_device dev1 lab-a --threads 1 --data "wiki=$d/text.shard" || exit 1; OWNER=$CL_ID
cl_device dev2 lab-b --threads 1 || exit 1; MID=$CL_ID
cl_device dev3 lab-b --threads 1 || exit 1; LAST=$CL_ID
cl_wait_online 3 || exit 1

# an enrollment with a token the coordinator never issued (the CA pin right)
tok=$("$SK" -q certs token --pki "$CL/pki" --site lab-a)
case "${tok: -1}" in 0) bad="${tok%?}1" ;; *) bad="${tok%?}0" ;; esac
out=$(bounded 30 "$SK" device --coordinator "$CL_ADDR" --token "$bad" --state "$d/intruder" --site lab-a 2>&1); rc=$?
check "an unknown token is refused" bash -c 'test $0 -eq 1 && grep -q "unknown enrollment token" <<<"$1"' "$rc" "$out"

out=$(cl_job submit --config "$d/cfg.json" --data "$OWNER:wiki" --steps 12 --batch 8 --micro-batches 4 \
      --algo even --checkpoint-every 5 --devices "$OWNER,$MID,$LAST" --json 2>&1)
JOB=$(grep -o '"job_id": "j[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
check "a 4-stage job submitted" test -n "$JOB"
cl_job watch "$JOB" > "$d/watch.txt"; rc=$?
check "the job ran to done" bash -c 'test $0 -eq 0 && grep -q "done after" "$1"' "$rc" "$d/watch.txt"
cl_job metrics "$JOB" > "$d/job-metrics.csv"
check "one data owner: no replica in job watch; metrics.csv has no replica losses and 0 sync bytes at every step" \
    bash -c '! grep -q "^replica=\|replica_loss=\|sync_raw=" "$0" &&
             head -1 "$1" | grep -q ",replica_loss,sync_raw_bytes,sync_wire_bytes$" &&
             [ "$(tail -n +2 "$1" | grep -c ",,0,0$")" = 12 ]' "$d/watch.txt" "$d/job-metrics.csv"

# ---- /metrics --------------------------------------------------------------
code=$(curl -s -o "$d/metrics.txt" -w '%{http_code}' "http://$CL_HTTP/metrics")
check "GET /metrics: 200" test "$code" = 200
echo "     $(grep -vc '^#' "$d/metrics.txt") samples in $(grep -c '^# TYPE' "$d/metrics.txt") families"
if need promtool prometheus; then
  lint=$(promtool check metrics < "$d/metrics.txt" 2>&1); rc=$?
  [ -n "$lint" ] && echo "$lint" | head -20 | sed 's/^/     /'
  check "promtool check metrics: no problem" bash -c 'test $0 -eq 0 && test -z "$1"' "$rc" "$lint"
else
  echo "SKIP promtool check metrics: the Debian package prometheus cannot be installed (see $CL/apt-prometheus.log)"
fi
m="$d/metrics.txt"
check "the job's step, committed step and target" bash -c \
  'test "$1" = 12 && test "$2" = 12 && test "$3" = 12' _ \
  "$(metric "$m" "skyloom_job_step{job_id=\"$JOB\"}")" "$(metric "$m" "skyloom_job_committed_step{job_id=\"$JOB\"}")" \
  "$(metric "$m" "skyloom_job_steps{job_id=\"$JOB\"}")"
check "3 checkpoints committed (steps 5, 10, 12), their bytes and seconds counted" bash -c \
  'test "$1" = 3 && test "${2:-0}" -gt 100000 && awk -v s="$3" "BEGIN{exit !(s > 0)}"' _ \
  "$(metric "$m" "skyloom_job_checkpoints_committed_total{job_id=\"$JOB\"}")" \
  "$(metric "$m" "skyloom_job_checkpoint_upload_bytes_total{job_id=\"$JOB\"}")" \
  "$(metric "$m" "skyloom_job_checkpoint_upload_seconds_total{job_id=\"$JOB\"}")"
check "enrollments: 3 accepted, the unknown token refused by reason" bash -c \
  'test "$1" = 3 && test "$2" = 1 && test "$3" = 0' _ "$(metric "$m" skyloom_enrollments_total)" \
  "$(metric "$m" 'skyloom_enrollment_refusals_total{reason="unknown_token"}')" \
  "$(metric "$m" 'skyloom_enrollment_refusals_total{reason="token_used"}')"
check "devices by site and state, a heartbeat age for each" bash -c \
  'test "$1" = 1 && test "$2" = 2 && test "$(grep -c "^skyloom_device_heartbeat_age_seconds{" "$3")" = 3' _ \
  "$(metric "$m" 'skyloom_devices{site="lab-a",state="online"}')" \
  "$(metric "$m" 'skyloom_devices{site="lab-b",state="online"}')" "$m"
check "the jobs by state: one done" test "$(metric "$m" 'skyloom_jobs{state="done"}')" = 1
raw=$(metric "$m" "skyloom_job_link_bytes_total{job_id=\"$JOB\",from_stage=\"0\",to_stage=\"1\",encoding=\"raw\"}")
wire=$(metric "$m" "skyloom_job_link_bytes_total{job_id=\"$JOB\",from_stage=\"0\",to_stage=\"1\",encoding=\"wire\"}")
echo "     link 0 -> 1: $raw bytes raw, $wire on the wire"
check "link bytes raw and on the wire (sealed: more on the wire)" bash -c 'test "${1:-0}" -gt 0 && test "${2:-0}" -gt "${1:-0}"' _ "$raw" "$wire"
check "every stage's busy seconds and steps" bash -c \
  'test "$(grep -c "^skyloom_job_stage_seconds_total{job_id=\"$1\",stage=\"[0-3]\",device=\"d[0-9a-f]*\",activity=\"busy\"} [0-9.e-]*[1-9]" "$2")" = 4 &&
   test "$(grep -c "^skyloom_job_stage_steps_total{job_id=\"$1\",.*} 12$" "$2")" = 4' _ "$JOB" "$m"
check "no frame refused on these links" bash -c '! grep -q "^skyloom_frames_refused_total{" "$0"' "$m"

# ---- Prometheus scraping it --------------------------------------------------
if need prometheus prometheus; then
  pport=$(free_port)
  mkdir -p "$d/prom"
  cat > "$d/prom/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: skyloom
    static_configs:
      - targets: ['$CL_HTTP']
YML
  start prometheus prometheus --config.file="$d/prom/prometheus.yml" --storage.tsdb.path="$d/prom/data" \
      --web.listen-address="127.0.0.1:$pport" --log.level=warn
  cl_poll 60 curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready"
  check "prometheus started" curl -sf -o /dev/null "http://127.0.0.1:$pport/-/ready"
  query() {
    curl -s --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=skyloom_job_step{job_id=\"$JOB\"}" > "$d/prom/answer.json" &&
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["data"]["result"]; sys.exit(not (len(r) == 1 and r[0]["value"][1] == "12"))' "$d/prom/answer.json" 2>/dev/null
  }
  cl_poll 60 query
  echo "     $(head -c 300 "$d/prom/answer.json")"
  check "prometheus scraped the coordinator: its API answers the job's step, 12" query
  stop_extra
else
  echo "SKIP prometheus: the Debian package prometheus cannot be installed (see $CL/apt-prometheus.log)"
fi

# ---- skyloom job trace --------------------------------------------------------
out=$(cl_job trace "$JOB" --svg "$d/trace.svg" 2>&1); rc=$?
echo "     $out"
check "job trace --svg: written" bash -c 'test $0 -eq 0 && grep -q "4 stages" <<<"$1"' "$rc" "$out"
check "the trace is an SVG document with 4 stage rows and every forward and backward" python3 -c '
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
texts = [t.text or "" for t in root.iter(ns + "text")]
titles = [t.text or "" for t in root.iter(ns + "title")]
rows = [t for t in texts if t.startswith("stage ")]
fwd = [t for t in titles if t.startswith("forward mb")]
bwd = [t for t in titles if t.startswith("backward mb")]
print("     %d rows, %d forwards, %d backwards" % (len(rows), len(fwd), len(bwd)))
sys.exit(not (root.tag == ns + "svg" and len(rows) == 4 and len(fwd) == 16 and len(bwd) == 16))
' "$d/trace.svg"
out=$(cl_job trace "$JOB" --json 2>&1); rc=$?
check "job trace --json: every stage's ops" bash -c 'test $0 -eq 0 && test "$(grep -c "\"stage\":" <<<"$1")" = 4' "$rc" "$out"
out=$(cl_job trace j0123456789abcdef --svg "$d/none.svg" 2>&1); rc=$?
check "job trace of an unknown job: refused" bash -c 'test $0 -eq 1 && grep -q "no job" <<<"$1" && ! test -e "$2"' "$rc" "$out" "$d/none.svg"

# ---- the dashboard ---------------------------------------------------------------
code=$(curl -s -o "$d/index.html" -w '%{http_code}' "http://$CL_HTTP/")
check "GET /: the devices and the job" bash -c 'test "$0" = 200 && grep -q "$1" "$2" && grep -q "$3" "$2" && grep -q "lab-b" "$2"' "$code" "$JOB" "$d/index.html" "$MID"
code=$(curl -s -o "$d/job.html" -w '%{http_code}' "http://$CL_HTTP/job/$JOB")
check "GET /job/ID: loss, plan, measured and predicted timelines" bash -c \
  'test "$0" = 200 && test "$(grep -o "<svg" "$1" | wc -l)" = 4 && grep -q "class=\"measured\"" "$1" && grep -q "class=\"predicted\"" "$1"' "$code" "$d/job.html"
check "GET /job/ID of one data owner: no replica table; /metrics: no sync bytes" bash -c \
  '! grep -q "id=\"replicas\"" "$0" && ! grep -q "^skyloom_job_sync_bytes_total{" "$1"' "$d/job.html" "$d/metrics.txt"
check "POST is refused (405), an unknown path is 404" bash -c \
  'test "$(curl -s -o /dev/null -w "%{http_code}" -X POST "http://$0/metrics")" = 405 && test "$(curl -s -o /dev/null -w "%{http_code}" "http://$0/nothing")" = 404' "$CL_HTTP"
if need chromium chromium; then
  chrome() { # chrome PROFILE ARGS...: headless, a fresh profile, nothing fetched from outside
    local prof=$1; shift
    bounded 90 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
      --disable-background-networking --disable-component-update --disable-sync \
      --user-data-dir="$d/$prof" "$@"
  }
  chrome chrome1 --window-size=1400,2600 --screenshot="$d/job.png" "http://$CL_HTTP/job/$JOB" >"$d/chrome1.log" 2>&1
  size=$(stat -c %s "$d/job.png" 2>/dev/null || echo 0)
  echo "     screenshot: $size bytes"
  check "headless Chromium renders the job page (a PNG screenshot, not empty)" bash -c \
    'test "$1" -gt 20000 && test "$(head -c 8 "$0" | od -An -tx1 | tr -d " \n")" = 89504e470d0a1a0a' "$d/job.png" "$size"
  chrome chrome2 --dump-dom "http://$CL_HTTP/job/$JOB" >"$d/dom.html" 2>"$d/chrome2.log"
  check "the rendered DOM holds the job's id and its four SVGs" bash -c \
    'grep -q "id=\"job-id\">$1<" "$0" && test "$(grep -o "<svg" "$0" | wc -l)" = 4 && grep -q "class=\"chain\"" "$0"' "$d/dom.html" "$JOB"
  chrome chrome3 --dump-dom "http://$CL_HTTP/" >"$d/dom-index.html" 2>"$d/chrome3.log"
  check "the rendered overview lists the three devices" bash -c \
    'test "$(grep -o "<td class=\"online\">online</td>" "$0" | wc -l)" = 3' "$d/dom-index.html"
else
  echo "SKIP chromium: the Debian package chromium cannot be installed (see $CL/apt-chromium.log)"
fi
cl_stop

# ---- who may reach it ---------------------------------------------------------------
"$SK" -q certs init --pki "$d/pki2" >/dev/null
out=$(bounded 30 "$SK" coordinator --listen 127.0.0.1:0 --pki "$d/pki2" --state "$d/st2" \
      --http-listen 0.0.0.0:0 2>&1); rc=$?
check "a non-loopback --http-listen without --http-token: refused" bash -c \
  'test $0 -eq 2 && grep -q "not a loopback address.*--http-token" <<<"$1"' "$rc" "$out"
printf 'short\n' > "$d/short.tok"
out=$(bounded 30 "$SK" coordinator --listen 127.0.0.1:0 --pki "$d/pki2" --state "$d/st2" \
      --http-listen 0.0.0.0:0 --http-token "$d/short.tok" 2>&1); rc=$?
check "a token shorter than 16 characters: refused" bash -c 'test $0 -eq 2 && grep -q "16 to" <<<"$1"' "$rc" "$out"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$d/http.tok"; echo >> "$d/http.tok"
chmod 600 "$d/http.tok"
start c2 "$SK" coordinator --listen 127.0.0.1:0 --pki "$d/pki2" --state "$d/st2" --port-file "$d/c2.port" \
    --http-listen 0.0.0.0:0 --http-token "$d/http.tok" --http-port-file "$d/c2.http"
cl_poll 20 test -s "$d/c2.port"
hp=$(cat "$d/c2.http" 2>/dev/null)
T=$(tr -d '\n' < "$d/http.tok")
check "with a token: a request without it is 401" test "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$hp/metrics")" = 401
check "with a token: a wrong one is 401" test "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer x$T" "http://127.0.0.1:$hp/metrics")" = 401
check "with a token: the right one is served" bash -c \
  'test "$(curl -s -o "$2" -w "%{http_code}" -H "Authorization: Bearer $1" "http://127.0.0.1:$0/metrics")" = 200 && grep -q "^skyloom_enrollments_total 0$" "$2"' \
  "$hp" "$T" "$d/c2.metrics"
stop_extra

start c3 "$SK" coordinator --listen 127.0.0.1:0 --pki "$d/pki2" --state "$d/st2" --port-file "$d/c3.port" \
    --http-listen off
cl_poll 20 test -s "$d/c3.port"
check "--http-listen off: gRPC serves, HTTP does not" bash -c \
  'kill -0 $0 && ! grep -q "HTTP serving" "$1"' "$LAST_PID" "$CL/c3.log"
stop_extra

# the default address taken (by this test, or by anyone): the coordinator runs on without HTTP
start holder python3 -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", 7401)); s.listen(1)
except OSError:
    pass
print("tried", flush=True)
time.sleep(120)'
cl_poll 20 grep -qs tried "$CL/holder.log"
start c4 "$SK" coordinator --listen 127.0.0.1:0 --pki "$d/pki2" --state "$d/st2" --port-file "$d/c4.port"
c4=$LAST_PID
cl_poll 20 test -s "$d/c4.port"
if grep -q "HTTP serving" "$CL/c4.log"; then
  echo "     (127.0.0.1:7401 was free after all: the coordinator took it)"
  check "the default address: served" grep -q "HTTP serving listen=127.0.0.1:7401" "$CL/c4.log"
else
  check "the default address taken: a warning, the coordinator runs on" bash -c \
    'kill -0 $0 && grep -q "no dashboard or metrics" "$1"' "$c4" "$CL/c4.log"
fi
stop_extra

exit $fail
