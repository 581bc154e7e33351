#!/usr/bin/env python3
"""The federated testbed experiment's report (scripts/testbed fed calls it).

Reads the run directory (devices.txt, and per job JOB.status.json from
`skyloom job status --json` and JOB.metrics.csv from the coordinator) and
writes OUT/results-fed.json and OUT/results-fed.md.

Per job (PLACEMENT-SYNC-CODEC): each replica's chain; the measured step and
tokens/s (both owners' sequences x sequence length / step); the plan's
prediction (the slowest replica's simulated iteration plus the sync round, or
1/H of it) and its parts; measured / predicted. The balanced placement's
speed-up over the equal share under the same sync (step/none), measured and
predicted.

The measured step is the wall clock per step over the steps after the
warm-up: the time `job watch` printed the last step's line less the time it
printed the warm-up's last, over the steps between (JOB.watch-times, the
moment each line arrived; watch polls twice a second), which is what the
owners get in tokens/s. Under outer:H the window is the H steps after the
warm-up, which hold exactly one outer step: the outer step amortised as the
prediction amortises it. Beside it, the median step_s (metrics.csv: a step's
slowest stage from its own start to its end), which runs above the period
at which steps complete because the stages' starts jitter; under outer:H a
step's slowest stage is the faster replica waiting at the outer step, so
step_s does not say that job's pace at all. Without JOB.watch-times (older
runs) the wall clock is watch's wall_s, whole seconds.

`testbed-fed-report.py --combine OUT1 OUT2 ...` prints the medians over
several runs' results-fed.json."""
import argparse
import csv
import json
import os
import statistics
import sys


def load_devices(run):
    devs = {}
    with open(os.path.join(run, "devices.txt")) as f:
        for line in f:
            name, did, site, cores, threads = line.split()
            devs[did] = {"name": name, "site": site, "cores": float(cores)}
    return devs


def combine(outs):
    """The median over several runs' results-fed.json, per job: measured and
    predicted step, their ratio, the placement's speed-up."""
    runs = [json.load(open(os.path.join(o, "results-fed.json"))) for o in outs]
    md = [f"Medians over {len(runs)} runs ({', '.join(outs)}):", "",
          "| job | measured s/step (wall clock) | measured tokens/s | predicted s/step | predicted tokens/s | "
          "measured / predicted (time): median | each run | median step_s / predicted: median | each run |",
          "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for job in runs[0]["jobs"]:
        js = [r["jobs"][job] for r in runs if job in r["jobs"]]
        m = statistics.median(j["measured_s"] for j in js)
        p = statistics.median(j["predicted_s"] for j in js)
        each = ", ".join("%.3f" % j["ratio"] for j in js)
        md.append(f'| {job} | {m:.3f} | {js[0]["batch"] * js[0]["seq"] / m:.0f} | {p:.3f} | '
                  f'{js[0]["batch"] * js[0]["seq"] / p:.0f} | '
                  f'{statistics.median(j["ratio"] for j in js):.3f} | {each} | '
                  f'{statistics.median(j["median_ratio"] for j in js):.3f} | '
                  f'{", ".join("%.3f" % j["median_ratio"] for j in js)} |')
    sp = [r["placement_speedup"] for r in runs if "placement_speedup" in r]
    if sp:
        md.append("")
        md.append("balanced over equal share (step/none): measured (wall clock) "
                  f'{statistics.median(x["measured"] for x in sp):.2f}x '
                  f'(each run {", ".join("%.2f" % x["measured"] for x in sp)}), by the median step_s '
                  f'{statistics.median(x["median"] for x in sp):.2f}x '
                  f'(each run {", ".join("%.2f" % x["median"] for x in sp)}), predicted '
                  f'{statistics.median(x["predicted"] for x in sp):.2f}x '
                  f'(each run {", ".join("%.2f" % x["predicted"] for x in sp)})')
    print("\n".join(md))
    return 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--combine":
        return combine(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--seq", type=int, required=True)
    a = ap.parse_args()
    devs = load_devices(a.run)

    def dname(i):
        return devs.get(i, {}).get("name", i)

    res = {"jobs": {}}
    for job in a.jobs.split():
        st = json.load(open(os.path.join(a.run, f"{job}.status.json")))
        with open(os.path.join(a.run, f"{job}.metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        plan = st["plan"]
        sync = plan["sync"]
        H = sync["every"]
        steps = {int(r["step"]): float(r["step_s"]) for r in rows}
        wall = {}
        times = os.path.join(a.run, f"{job}.watch-times")
        with open(times if os.path.exists(times) else os.path.join(a.run, f"{job}.watch")) as f:
            for line in f:
                t, _, rest = line.partition(" ") if os.path.exists(times) else (None, "", line)
                kv = dict(x.split("=", 1) for x in rest.split() if "=" in x)
                if rest.startswith("step=") and "wall_s" in kv:
                    wall.setdefault(int(kv["step"]), float(t) if t else float(kv["wall_s"]))
        w0, w1 = a.warmup, a.warmup + (H if sync["mode"] == "outer" else len(rows) - a.warmup)
        wall_s = (wall[w1] - wall[w0]) / (w1 - w0) if w0 in wall and w1 in wall and w1 > w0 else None
        after = [steps[s] for s in sorted(steps) if s > a.warmup]
        med = statistics.median(after) if after else float("nan")
        meas = wall_s if wall_s else float("nan")
        if sync["mode"] == "outer":
            window = [steps[s] for s in range(a.warmup + 1, a.warmup + H + 1) if s in steps]
            outer_steps = [s for s in range(a.warmup + 1, a.warmup + H + 1) if s % H == 0]
            # the window's wall clock beyond H median steps: the outer round
            outer_extra = meas * H - H * med if wall_s else None
        else:
            window, outer_steps, outer_extra = after, [], None
        batch = plan["batch"]
        pred = plan["predicted_iteration_s"]
        reps = []
        for r, rp in enumerate(plan["replicas"]):
            first, n = rp["first_stage"], rp["stages"]
            bst = rp["balancer"]["stages"]
            chain = []
            for k in range(n):
                s = plan["stages"][first + k]
                chain.append({"device": dname(s["device"]), "units": f'{s["first_unit"]}-{s["last_unit"]}',
                              "predicted_compute_s": (bst[k]["fwd_s"] + bst[k]["bwd_s"]) * plan["micro_batches"]})
            reps.append({"owner": dname(rp["owner"]), "predicted_s": rp["predicted_iteration_s"],
                         "chain": chain, "first_stage": first})
        last = (st.get("last_step") or {}).get("stages", [])
        for rp in reps:
            for k, c in enumerate(rp["chain"]):
                i = rp["first_stage"] + k
                if i < len(last):
                    c["last_step"] = {x: last[i][x] for x in ("fwd_s", "bwd_s", "recv_s", "send_s",
                                                              "finish_s", "step_s")}
        res["jobs"][job] = {
            "job": st["job_id"], "state": st["state"], "steps": len(rows), "sync": sync["mode"],
            "every": H, "codec": sync["codec"], "placement": plan["options"].get("placement", "balanced"),
            "batch": batch, "seq": a.seq, "measured_s": meas, "median_s": med,
            "wall_s": wall_s, "min_s": min(window) if window else None, "max_s": max(window) if window else None,
            "outer_steps": outer_steps, "outer_extra_s": outer_extra,
            "measured_tokens_s": batch * a.seq / meas if meas else None,
            "predicted_s": pred, "predicted_tokens_s": batch * a.seq / pred if pred else None,
            "slowest_replica_s": sync.get("slowest_replica_s"),
            "round_s": sync.get("predicted_round_s"), "round_bytes": sync.get("round_bytes"),
            "round_link_s": sync.get("round_link_s"), "round_cpu_s": sync.get("round_cpu_s"),
            "ratio": meas / pred if pred else None,
            "median_ratio": med / pred if pred else None, "replicas": reps,
            "step_s": [steps[s] for s in sorted(steps)]}
    eq = res["jobs"].get("equal-step-none")
    pl = res["jobs"].get("place-step-none")
    if eq and pl:
        res["placement_speedup"] = {"measured": eq["measured_s"] / pl["measured_s"],
                                    "median": eq["median_s"] / pl["median_s"],
                                    "predicted": eq["predicted_s"] / pl["predicted_s"]}
    ok = all(j["ratio"] and abs(j["ratio"] - 1) <= 0.15 for j in res["jobs"].values())
    res["targets"] = {"within_15pct": ok}
    json.dump(res, open(os.path.join(a.out, "results-fed.json"), "w"), indent=1)

    md = ["| job | placement | sync | codec | measured s/step (wall clock) | median step_s (min-max) | "
          "measured tokens/s | predicted s/step | = slowest replica | + sync round (links + CPU) | / H | "
          "predicted tokens/s | measured / predicted (time) | median step_s / predicted |",
          "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for job, j in res["jobs"].items():
        parts = (f' ({j["round_link_s"]:.3f} + {j["round_cpu_s"]:.3f})'
                 if j.get("round_link_s") is not None and j.get("round_cpu_s") is not None else "")
        md.append(f'| {job} | {j["placement"]} | {j["sync"]}{":" + str(j["every"]) if j["sync"] == "outer" else ""} | '
                  f'{j["codec"]} | {j["measured_s"]:.3f} | {j["median_s"]:.3f} ({j["min_s"]:.2f}-{j["max_s"]:.2f}) | '
                  f'{j["measured_tokens_s"]:.0f} | {j["predicted_s"]:.3f} | {j["slowest_replica_s"]:.3f} | '
                  f'{j["round_s"]:.3f}{parts} | {j["every"]} | {j["predicted_tokens_s"]:.0f} | {j["ratio"]:.3f} | '
                  f'{j["median_ratio"]:.3f} |')
    md.append("")
    if "placement_speedup" in res:
        s = res["placement_speedup"]
        md.append(f'balanced placement over the equal share (step/none): measured {s["measured"]:.2f}x '
                  f'(wall clock), {s["median"]:.2f}x (median step_s), predicted {s["predicted"]:.2f}x')
        md.append("")
    for job, j in res["jobs"].items():
        for r, rp in enumerate(j["replicas"]):
            md.append(f'{job} replica {r} ({rp["owner"]}, predicted {rp["predicted_s"]:.3f} s): ' +
                      ", ".join(f'{c["device"]} {c["units"]}' for c in rp["chain"]))
        if j["outer_steps"]:
            md.append(f'{job}: median step_s {j["median_s"]:.3f} s (slowest replica predicted '
                      f'{j["slowest_replica_s"]:.3f} s); the {j["every"]} steps after the warm-up, with the outer '
                      f'step{"s" if len(j["outer_steps"]) > 1 else ""} {", ".join(map(str, j["outer_steps"]))}, '
                      f'took {j["outer_extra_s"]:.1f} s of wall clock beyond {j["every"]} median steps '
                      f'(sync round predicted {j["round_s"]:.3f} s); step_s of the outer step (the faster '
                      f'replica waiting): {max(j["step_s"][s - 1] for s in j["outer_steps"]):.2f} s')
    md.append("")
    md.append("Per stage, the last step of each job (seconds): compute measured (forward + backward) against "
              "the plan's (profiled unit times x micro-batches); recv, send and finish (the sync round, the "
              "global norm's gather and the optimizer step) measured.")
    md.append("")
    md.append("| job | replica | device | units | compute measured | compute predicted | ratio | recv | send | finish | step |")
    md.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for job, j in res["jobs"].items():
        for r, rp in enumerate(j["replicas"]):
            for c in rp["chain"]:
                m = c.get("last_step")
                if not m:
                    continue
                comp = m["fwd_s"] + m["bwd_s"]
                md.append(f'| {job} | {r} | {c["device"]} | {c["units"]} | {comp:.3f} | '
                          f'{c["predicted_compute_s"]:.3f} | {comp / c["predicted_compute_s"]:.2f} | '
                          f'{m["recv_s"]:.3f} | {m["send_s"]:.3f} | {m["finish_s"]:.3f} | {m["step_s"]:.3f} |')
    md.append("")
    md.append("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in res["targets"].items()))
    text = "\n".join(md) + "\n"
    open(os.path.join(a.out, "results-fed.md"), "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
