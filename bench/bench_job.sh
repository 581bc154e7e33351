#!/usr/bin/env bash
# A federated job on loopback against the same pipeline in one process.
#
# Config (b) (L4 H256 A4 F1024 V8192), sequences of 128 tokens from the
# fortunes corpus, batch 32 in 8 micro-batches, a coordinator and 3 device
# processes of one compute thread each (the data owner holds the first and
# the last stage), checkpoints every CKPT steps. Each round runs, one after
# the other:
#   - a job with codec none (sealed): its plan, from the devices' measured
#     profiles, and the balancer's predicted step;
#   - skyloom train --stages with that plan's cuts in one process (one thread
#     per stage, checkpoints every CKPT steps too);
#   - the same job with --codec-act int8;
#   - with BF16=1 (the default where the CPU has AVX512_BF16 or AMX), the
#     codec-none job and skyloom train --stages again with --precision bf16
#     (each planned and cut anew: the devices profile in bf16).
# The busiest device is the one the simulator gives the most forward and
# backward seconds (a data owner's two stages add up: they take turns on its
# thread); skyloom train's is the stage thread with the most CPU.
# Per run: tokens/s = batch x 128 / the median step after WARMUP steps; the
# measured step against the prediction; the busiest device's forward and
# backward seconds (metrics.csv) against the simulator's, and the CPU time
# and run-queue wait of its compute threads (schedstat) from step WARMUP to
# the last; the CPU seconds per step of all the run's processes and the
# cores other work took meanwhile (/proc/stat); bytes per step on the wire.
# Prints a JSON line per round and a markdown table of the medians.
# usage: bench_job.sh SKYLOOM SOURCE_ROOT   env: ROUNDS (5), STEPS (25), WARMUP (5), CKPT (10), BF16
set -u
SK=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); src=$2
rounds=${ROUNDS:-5} steps=${STEPS:-25} warmup=${WARMUP:-5} ckpt=${CKPT:-10}
# the CPU window runs from step WARMUP to the step before the last: it must hold steps
[ "$steps" -ge $((warmup + 9)) ] || { echo "bench_job: STEPS ($steps) must be at least WARMUP + 9 ($((warmup + 9)))" >&2; exit 2; }
B=32 M=8 T=128
if [ -z "${BF16:-}" ]; then
  BF16=0; grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && BF16=1
  [ "$BF16" = 1 ] || echo "bench_job: no AVX512_BF16 or AMX on this CPU: bf16 runs left out" >&2
fi
CL=$(mktemp -d /tmp/skyloom-bench-job-XXXXXX)
. "$src/scripts/cluster.sh"
trap 'cl_stop; rm -rf "$CL"' EXIT

"$src/bench/config_b.sh" "$SK" "$CL" $T || exit 1

cl_start || exit 1
cl_device dev1 lab --threads 1 --data "b=$CL/b.shard" || exit 1; D1=$CL_ID
cl_device dev2 lab --threads 1 || exit 1; D2=$CL_ID
cl_device dev3 lab --threads 1 || exit 1; D3=$CL_ID
cl_wait_online 3 || exit 1

# snap NAME=PID...: every thread's CPU time and run-queue wait (schedstat, ns),
# every CPU's busy time (/proc/stat, ticks), the time
snap() {
  local x t c w rest
  for x in "$@"; do
    for t in /proc/${x#*=}/task/*; do
      read -r c w rest < "$t/schedstat" 2>/dev/null && echo "${x%%=*} ${t##*/} $c $w"
    done
  done
  awk '/^cpu /{print "busy - " $2 + $3 + $4 + $7 + $8 + $9 " 0"}' /proc/stat
  echo "time - $(date +%s%N) 0"
}
# rows FILE: the metrics rows written so far
rows() { local n; n=$(wc -l < "$1" 2>/dev/null) || n=1; echo $(( n > 0 ? n - 1 : 0 )); }
# window NAME METRICS PID NAME=PID...: snapshots when the run has passed WARMUP
# steps and when it is one step from the end (NAME.snap1, NAME.snap2), and the
# load average then; returns when PID has exited
window() {
  local name=$1 m=$2 pid=$3; shift 3
  cl_poll 600 bash -c '[ "$(wc -l 2>/dev/null < "$0" || echo 0)" -gt "$1" ] || ! kill -0 "$2" 2>/dev/null' "$m" "$warmup" "$pid"
  snap "$@" > "$CL/$name.snap1"; rows "$m" > "$CL/$name.rows1"
  cut -d' ' -f1 /proc/loadavg > "$CL/$name.load"
  cl_poll 600 bash -c '[ "$(wc -l 2>/dev/null < "$0" || echo 0)" -gt "$1" ] || ! kill -0 "$2" 2>/dev/null' "$m" $((steps - 1)) "$pid"
  snap "$@" > "$CL/$name.snap2"; rows "$m" > "$CL/$name.rows2"
}

# job NAME CODEC [PRECISION]: a job; NAME.status (job status --json), NAME.metrics, the snapshots
job() {
  local name=$1 codec=$2 prec=${3:-fp32} out id w
  out=$(cl_job submit --config "$CL/b.json" --data "$D1:b" --devices "$D1,$D2,$D3" --steps "$steps" \
        --batch $B --micro-batches $M --codec-act "$codec" --checkpoint-every "$ckpt" \
        --precision "$prec" 2>"$CL/submit.err") ||
    { echo "bench_job: submit failed: $(tail -1 "$CL/submit.err")" >&2; return 1; }
  id=$(head -1 <<<"$out")
  cl_job watch "$id" >/dev/null & w=$!
  window "$name" "$CL/coord/jobs/$id/metrics.csv" "$w" "coord=${CL_PID_OF[coord]}" \
      "$D1=${CL_PID_OF[dev1]}" "$D2=${CL_PID_OF[dev2]}" "$D3=${CL_PID_OF[dev3]}"
  wait "$w" || { echo "bench_job: job $id did not finish" >&2; return 1; }
  cl_job status "$id" --json > "$CL/$name.status"
  cl_job trace "$id" --json > "$CL/$name.trace" 2>/dev/null || echo '{}' > "$CL/$name.trace"
  cp "$CL/coord/jobs/$id/metrics.csv" "$CL/$name.metrics"
}

cuts_of() { python3 -c 'import json,sys; print(",".join("%d-%d" % (s["first_unit"], s["last_unit"]) for s in json.load(open(sys.argv[1]))["plan"]["stages"]))' "$1"; }

# train NAME CUTS PRECISION: skyloom train --stages with a job's cuts, as NAME
train() {
  local tp
  OMP_WAIT_POLICY=passive "$SK" -q train --config "$CL/b.json" --data "$CL/b.shard" --steps "$steps" \
      --batch $B --micro-batches $M --stages "$2" --stage-threads 1 --save "$CL/$1" --precision "$3" \
      --save-every "$ckpt" --metrics "$CL/$1.metrics" >/dev/null & tp=$!
  window "$1" "$CL/$1.metrics" "$tp" "train=$tp"
  wait "$tp" || { echo "bench_job: skyloom train failed" >&2; return 1; }
  rm -rf "${CL:?}/$1"
}

for r in $(seq "$rounds"); do
  job "none$r" none || exit 1
  train "train$r" "$(cuts_of "$CL/none$r.status")" fp32 || exit 1
  job "int8$r" int8 || exit 1
  if [ "$BF16" = 1 ]; then
    job "bf$r" none bf16 || exit 1
    train "trainbf$r" "$(cuts_of "$CL/bf$r.status")" bf16 || exit 1
  fi
done

python3 - "$CL" "$rounds" "$warmup" $((B * T)) "$(nproc)" "$(getconf CLK_TCK)" "$BF16" <<'PY'
import collections, csv, json, statistics as st, sys
d, rounds, warm, tok, ncpu, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
bf16 = sys.argv[7] == "1"
med = st.median

def snap(f):
    s = {}
    for l in open(f):
        proc, tid, a, b = l.split()
        s[(proc, tid)] = (int(a), int(b))
    return s

def window(name):
    """CPU and run-queue wait per step of each process (and of its compute
    threads: those with a tenth of its CPU or more) between the snapshots."""
    a, b = snap(f"{d}/{name}.snap1"), snap(f"{d}/{name}.snap2")
    n = int(open(f"{d}/{name}.rows2").read()) - int(open(f"{d}/{name}.rows1").read())
    wall = (b[("time", "-")][0] - a[("time", "-")][0]) / 1e9
    th = collections.defaultdict(list)
    for k in b:
        if k in a and k[0] not in ("time", "busy"):
            th[k[0]].append(((b[k][0] - a[k][0]) / 1e9, (b[k][1] - a[k][1]) / 1e9))
    proc = {}
    for p, v in th.items():
        cpu = sum(c for c, _ in v)
        comp = [x for x in v if x[0] >= 0.1 * cpu]
        proc[p] = dict(cpu=cpu / n, comp_cpu=sum(c for c, _ in comp) / n, comp_wait=sum(w for _, w in comp) / n,
                       top_cpu=max(c for c, _ in v) / n, top_wait=max(v)[1] / n)
    ours = sum(x["cpu"] for x in proc.values()) * n
    busy = (b[("busy", "-")][0] - a[("busy", "-")][0]) / hz
    return dict(n=n, wall=wall, proc=proc, cpu_step=ours / n, cores=ours / wall,
                others=max(0.0, busy - ours) / wall, load=float(open(f"{d}/{name}.load").read()))

def steady(name, col):
    rs = [r for r in csv.DictReader(open(f"{d}/{name}.metrics")) if int(r["step"]) > warm]
    return rs, med(float(r[col]) for r in rs)

def job(name):
    s, x = json.load(open(f"{d}/{name}.status")), window(name)
    rs, step = steady(name, "step_s")
    plan = s["plan"]
    busy = [[float(v) * float(r["step_s"]) for v in r["stage_busy"].split(";")] for r in rs]
    meas = [med(b[i] for b in busy) for i in range(len(busy[0]))]
    sim = [t["simulated"]["fwd_s"] + t["simulated"]["bwd_s"] for t in plan["balancer"]["stages"]]
    # per device (the data owner's two stages take turns on its thread)
    devs = [t["device"] for t in plan["stages"]]
    sim_d = {v: sum(sim[i] for i in range(len(devs)) if devs[i] == v) for v in devs}
    meas_d = {v: sum(meas[i] for i in range(len(devs)) if devs[i] == v) for v in devs}
    k = max(sim_d, key=lambda v: sim_d[v])
    dev = x["proc"][k]
    total = lambda r, e: sum(int(v) for c in ("link_%s_bytes" % e, "link_%s_bytes_back" % e)
                             for v in r[c].split(";") if v) + int(r["side_%s_bytes" % e])
    x.update(step=step, tps=tok / step, pred=plan["predicted_iteration_s"], k=devs.index(k), sim_k=sim_d[k],
             meas_k=meas_d[k],
             k_cpu=dev["comp_cpu"], k_wait=dev["comp_wait"], wire=med(total(r, "wire") for r in rs),
             raw=med(total(r, "raw") for r in rs), act=[int(v) for v in rs[-1]["link_wire_bytes"].split(";")],
             cuts=",".join("%d-%d" % (t["first_unit"], t["last_unit"]) for t in plan["stages"]))
    return x

def train(name):
    x = window(name)
    rs, step = steady(name, "seconds")
    p = x["proc"]["train"]
    x.update(step=step, tps=tok / step, k_cpu=p["top_cpu"], k_wait=p["top_wait"])
    return x

R = [(job(f"none{r}"), train(f"train{r}"), job(f"int8{r}")) for r in range(1, rounds + 1)]
for i, (n, t, q) in enumerate(R, 1):
    print(json.dumps({"round": i, "cuts": n["cuts"], "int8_cuts": q["cuts"], "train_tps": round(t["tps"]),
                      "job_tps": round(n["tps"]), "ratio": round(n["tps"] / t["tps"], 3),
                      "predicted_s": round(n["pred"], 3), "measured_s": round(n["step"], 3),
                      "measured_over_predicted": round(n["step"] / n["pred"], 3),
                      "busiest_device_first_stage": n["k"], "busiest_compute_sim_s": round(n["sim_k"], 3),
                      "busiest_compute_measured_s": round(n["meas_k"], 3),
                      "busiest_cpu_s": round(n["k_cpu"], 3), "busiest_runqueue_wait_s": round(n["k_wait"], 3),
                      "train_busiest_cpu_s": round(t["k_cpu"], 3), "train_busiest_runqueue_wait_s": round(t["k_wait"], 3),
                      "cpu_s_per_step": [round(n["cpu_step"], 3), round(t["cpu_step"], 3), round(q["cpu_step"], 3)],
                      "cores_used": [round(n["cores"], 2), round(t["cores"], 2), round(q["cores"], 2)],
                      "cores_others": [round(n["others"], 2), round(t["others"], 2), round(q["others"], 2)],
                      "load": [n["load"], t["load"], q["load"]], "int8_tps": round(q["tps"]),
                      "int8_predicted_s": round(q["pred"], 3), "int8_measured_s": round(q["step"], 3),
                      "wire_bytes": [n["wire"], q["wire"]], "raw_bytes": n["raw"],
                      "act_wire_bytes": [n["act"], q["act"]]}))
m = lambda f: med(f(x) for x in R)
per = lambda f: ", ".join("%.2f" % f(x) for x in R)
print()
print(f"{ncpu} CPUs; {rounds} rounds of (job none, train --stages, job int8); each figure the median over the rounds "
      f"of the run's median step after {warm} steps; CPU figures per step between step {warm} and the last")
print()
print("| | `skyloom train --stages` | job, codec none | job, int8 activations |")
print("|---|---|---|---|")
print("| tokens/s | %.0f | %.0f = **%.2f×** train (rounds: %s) | %.0f (%.2f× none) |" % (
    m(lambda x: x[1]["tps"]), m(lambda x: x[0]["tps"]), m(lambda x: x[0]["tps"] / x[1]["tps"]),
    per(lambda x: x[0]["tps"] / x[1]["tps"]), m(lambda x: x[2]["tps"]), m(lambda x: x[2]["tps"] / x[0]["tps"])))
print("| step: measured / predicted | %.3f s / – | %.3f / %.3f s = **%.2f×** (rounds: %s) | %.3f / %.3f s = %.2f× |" % (
    m(lambda x: x[1]["step"]), m(lambda x: x[0]["step"]), m(lambda x: x[0]["pred"]),
    m(lambda x: x[0]["step"] / x[0]["pred"]), per(lambda x: x[0]["step"] / x[0]["pred"]),
    m(lambda x: x[2]["step"]), m(lambda x: x[2]["pred"]), m(lambda x: x[2]["step"] / x[2]["pred"])))
print("| busiest device's forward + backward: measured / simulated | – | %.3f / %.3f s = %.2f× | %.3f / %.3f s = %.2f× |" % (
    m(lambda x: x[0]["meas_k"]), m(lambda x: x[0]["sim_k"]), m(lambda x: x[0]["meas_k"] / x[0]["sim_k"]),
    m(lambda x: x[2]["meas_k"]), m(lambda x: x[2]["sim_k"]), m(lambda x: x[2]["meas_k"] / x[2]["sim_k"])))
print("| busiest device's compute thread(s): CPU + run-queue wait per step | %.3f + %.3f s | %.3f + %.3f s | %.3f + %.3f s |" % (
    m(lambda x: x[1]["k_cpu"]), m(lambda x: x[1]["k_wait"]), m(lambda x: x[0]["k_cpu"]), m(lambda x: x[0]["k_wait"]),
    m(lambda x: x[2]["k_cpu"]), m(lambda x: x[2]["k_wait"])))
print("| busiest device's compute CPU / simulated forward + backward | – | %.2f× | %.2f× |" % (
    m(lambda x: x[0]["k_cpu"] / x[0]["sim_k"]), m(lambda x: x[2]["k_cpu"] / x[2]["sim_k"])))
print("| CPU seconds per step, all processes | %.3f | %.3f (%.2f× train) | %.3f |" % (
    m(lambda x: x[1]["cpu_step"]), m(lambda x: x[0]["cpu_step"]), m(lambda x: x[0]["cpu_step"] / x[1]["cpu_step"]),
    m(lambda x: x[2]["cpu_step"])))
print("| cores: this run's / other work's (load average) | %.2f / %.2f (%.1f) | %.2f / %.2f (%.1f) | %.2f / %.2f (%.1f) |" % tuple(
    v for i in (1, 0, 2) for v in (m(lambda x: x[i]["cores"]), m(lambda x: x[i]["others"]), m(lambda x: x[i]["load"]))))
print("| bytes per step on the wire, all links both ways (raw fp32: %.1f MB) | – | %.1f MB | %.1f MB (%.2f×) |" % (
    m(lambda x: x[0]["raw"]) / 1e6, m(lambda x: x[0]["wire"]) / 1e6, m(lambda x: x[2]["wire"]) / 1e6,
    m(lambda x: x[2]["wire"] / x[0]["wire"])))
print("| activations per step per link, on the wire (last round) | – | %s B | %s B |" % (
    " / ".join(str(v) for v in R[-1][0]["act"]), " / ".join(str(v) for v in R[-1][2]["act"])))

# where a step's time went: the measured ops of a recent step (skyloom job
# trace), seconds per stage and kind, in the median round's codec-none job
kinds = {1: "recv", 2: "fwd", 3: "send", 4: "recv", 5: "bwd", 6: "send", 7: "send", 8: "recv", 9: "sync", 10: "optim"}
i = sorted(range(len(R)), key=lambda i: R[i][0]["step"])[len(R) // 2]
t = json.load(open(f"{d}/none{i + 1}.trace"))
if t.get("stages"):
    print()
    print("step %d of round %d's codec-none job (predicted %.3f s), seconds per stage:" % (t["step"], i + 1, R[i][0]["pred"]))
    print()
    print("| stage | device | forward | backward | receive | send | sync | optimizer | idle | step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in t["stages"]:
        tot = collections.Counter()
        for k, mb, a, b in x["ops"]:
            tot[kinds.get(k, "?")] += b - a
        print("| %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
            x["stage"], x["device"], tot["fwd"], tot["bwd"], tot["recv"], tot["send"], tot["sync"],
            tot["optim"], max(0.0, x["step_s"] - sum(tot.values())), x["step_s"]))
# bf16 against fp32, side by side in the same rounds
if bf16:
    Q = [(job(f"bf{r}"), train(f"trainbf{r}")) for r in range(1, rounds + 1)]
    for i, (j, t) in enumerate(Q, 1):
        print(json.dumps({"round": i, "bf16_cuts": j["cuts"], "bf16_train_tps": round(t["tps"]),
                          "bf16_job_tps": round(j["tps"]), "bf16_predicted_s": round(j["pred"], 3),
                          "bf16_measured_s": round(j["step"], 3), "load": [j["load"], t["load"]]}))
    mq = lambda f: med(f(R[i], Q[i]) for i in range(len(R)))
    perq = lambda f: ", ".join("%.2f" % f(R[i], Q[i]) for i in range(len(R)))
    print()
    print("bf16 against fp32 (`--precision bf16` for the job and for skyloom train; the same rounds):")
    print()
    print("| | `skyloom train --stages` fp32 | bf16 | job, codec none, fp32 | bf16 |")
    print("|---|---|---|---|---|")
    print("| tokens/s | %.0f | %.0f = **%.2f×** fp32 (rounds: %s) | %.0f | %.0f = **%.2f×** fp32 (rounds: %s) |" % (
        mq(lambda r, q: r[1]["tps"]), mq(lambda r, q: q[1]["tps"]), mq(lambda r, q: q[1]["tps"] / r[1]["tps"]),
        perq(lambda r, q: q[1]["tps"] / r[1]["tps"]), mq(lambda r, q: r[0]["tps"]), mq(lambda r, q: q[0]["tps"]),
        mq(lambda r, q: q[0]["tps"] / r[0]["tps"]), perq(lambda r, q: q[0]["tps"] / r[0]["tps"])))
    print("| job / train | – | – | %.2f× | %.2f× |" % (
        mq(lambda r, q: r[0]["tps"] / r[1]["tps"]), mq(lambda r, q: q[0]["tps"] / q[1]["tps"])))
    print("| step: measured / predicted | – | – | %.3f / %.3f s = %.2f× | %.3f / %.3f s = %.2f× (rounds: %s) |" % (
        mq(lambda r, q: r[0]["step"]), mq(lambda r, q: r[0]["pred"]), mq(lambda r, q: r[0]["step"] / r[0]["pred"]),
        mq(lambda r, q: q[0]["step"]), mq(lambda r, q: q[0]["pred"]), mq(lambda r, q: q[0]["step"] / q[0]["pred"]),
        perq(lambda r, q: q[0]["step"] / q[0]["pred"])))
    print("| busiest device's forward + backward: measured / simulated | – | – | %.3f / %.3f s | %.3f / %.3f s = %.2f× |" % (
        mq(lambda r, q: r[0]["meas_k"]), mq(lambda r, q: r[0]["sim_k"]), mq(lambda r, q: q[0]["meas_k"]),
        mq(lambda r, q: q[0]["sim_k"]), mq(lambda r, q: q[0]["meas_k"] / q[0]["sim_k"])))
    print("| cores: this run's / other work's (load average) | %.2f / %.2f (%.1f) | %.2f / %.2f (%.1f) | %.2f / %.2f (%.1f) | %.2f / %.2f (%.1f) |" % tuple(
        v for g in ((0, 1), (1, 1), (0, 0), (1, 0)) for v in (
            mq(lambda r, q: (r, q)[g[0]][g[1]]["cores"]), mq(lambda r, q: (r, q)[g[0]][g[1]]["others"]),
            mq(lambda r, q: (r, q)[g[0]][g[1]]["load"]))))
    print("| cuts (last round) | the fp32 job's | the bf16 job's | %s | %s |" % (R[-1][0]["cuts"], Q[-1][0]["cuts"]))
PY
