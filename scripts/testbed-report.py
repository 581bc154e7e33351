#!/usr/bin/env python3
"""The testbed experiment's report (scripts/testbed run calls it).

Reads the run directory (devices.txt, config.json, and per algorithm
ALGO.status.json from `skyloom job status --json` and ALGO.metrics.csv from the
coordinator) and writes OUT/results.json, OUT/results.md and, per algorithm,
OUT/timeline-ALGO.svg: the simulated timeline of the plan, rebuilt from the
job's measured profile the way the coordinator builds the balancer's inputs
(the rebuilt plan's iteration must equal the job's prediction).

Per algorithm: the measured iteration (median step_s after the warm-up
steps), the prediction, their ratio, the speed-up over even; per link the
profiled bandwidth and RTT against the shaped values; per device its profiled
encoder time against its CPU quota."""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys


def median_hi(v):
    """The coordinator's median: element n/2 of the sorted values."""
    v = sorted(v)
    return v[len(v) // 2]


def load_devices(run):
    devs = []
    with open(os.path.join(run, "devices.txt")) as f:
        for line in f:
            name, did, site, cores, threads = line.split()
            devs.append({"name": name, "id": did, "site": site, "cores": float(cores),
                         "threads": int(threads)})
    return devs


def balancer_inputs(status, devs):
    """devices.json and network.json as the coordinator makes them from the
    profiles (coordinator/coord_jobs.c: problem_of, link_median)."""
    prof = status["profiles"]
    order = [d for d in devs if d["id"] in prof]
    out = []
    for d in order:
        p = prof[d["id"]]
        f, b = p["unit_fwd_s"], p["unit_bwd_s"]
        out.append({"id": d["name"], "site": d["site"], "backend": p.get("backend", "cpu"),
                    "memory_bytes": p["memory_bytes"],
                    "unit_seconds": {"embeddings": [f[0], b[0]], "encoder": [f[1], b[1]],
                                     "head": [f[-1], b[-1]]}})
    site = {d["id"]: d["site"] for d in order}

    def med(a, c):
        bw, lat = [], []
        for d in order:
            for l in prof[d["id"]].get("links", []):
                q = l["peer"]
                if q not in site or q == d["id"]:
                    continue
                if {site[d["id"]], site[q]} == {a, c} and (a != c or site[q] == a):
                    if l["rtt_s"] > 0 and l["bandwidth_Bps"] > 0:
                        bw.append(l["bandwidth_Bps"])
                        lat.append(l["rtt_s"] / 2)
        if not bw:
            return None
        return {"bandwidth_gbps": median_hi(bw) * 8 / 1e9,
                "latency_ms": max(median_hi(lat) * 1e3, 1e-6), "samples": len(bw)}

    sites, links = {}, []
    names = []
    for d in order:
        if d["site"] not in names:
            names.append(d["site"])
    for i, a in enumerate(names):
        m = med(a, a)
        if m:
            sites[a] = {k: m[k] for k in ("bandwidth_gbps", "latency_ms")}
        for c in names[i + 1:]:
            m = med(a, c)
            if m:
                links.append({"a": a, "b": c, **m})
    net = {"sites": sites, "links": [{k: l[k] for k in ("a", "b", "bandwidth_gbps", "latency_ms")}
                                     for l in links]}
    return {"devices": out}, net, links


def step_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skyloom", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--algos", default="even sky optimal")
    ap.add_argument("--links", required=True, help="lines 'A B MBIT ONE_WAY_MS'")
    a = ap.parse_args()
    devs = load_devices(a.run)
    name = {d["id"]: d["name"] for d in devs}
    shaped = {}
    for line in a.links.splitlines():
        if line.strip():
            x, y, mbit, ms = line.split()
            shaped[frozenset((x, y))] = (float(mbit), float(ms))
    with open(os.path.join(a.run, "config.json")) as f:
        config = json.load(f)

    res = {"algos": {}, "links": [], "devices": []}
    enc = {d["id"]: [] for d in devs}
    for algo in a.algos.split():
        st = json.load(open(os.path.join(a.run, f"{algo}.status.json")))
        rows = step_rows(os.path.join(a.run, f"{algo}.metrics.csv"))
        plan = st["plan"]
        bal = plan["balancer"]
        steady = [float(r["step_s"]) for r in rows if int(r["step"]) > a.warmup]
        meas = statistics.median(steady) if steady else float("nan")
        pred = plan["predicted_iteration_s"]
        # the profile, as the coordinator handed it to the balancer
        dj, nj, links = balancer_inputs(st, devs)
        dpath = os.path.join(a.out, f"devices-{algo}.json")
        npath = os.path.join(a.out, f"network-{algo}.json")
        cpath = os.path.join(a.out, "config.json")
        json.dump(dj, open(dpath, "w"), indent=1)
        json.dump(nj, open(npath, "w"), indent=1)
        json.dump(config, open(cpath, "w"), indent=1)
        svg = os.path.join(a.out, f"timeline-{algo}.svg")
        owner = name[plan["data"]["owner"]]
        cmd = [a.skyloom, "plan", "--config", cpath, "--seq", str(plan["seq"]),
               "--micro-batch", str(plan["batch"] // plan["micro_batches"]),
               "--devices", dpath, "--network", npath, "--micro-batches", str(plan["micro_batches"]),
               "--algo", algo, "--schedule", plan["schedule"], "--json", "--svg", svg]
        if bal.get("data_owner"):
            cmd += ["--data-owner", owner]
        rp = subprocess.run(cmd, capture_output=True, text=True)
        rebuilt = json.loads(rp.stdout)["iteration_s"] if rp.returncode == 0 else None
        if rp.returncode:
            print(f"testbed-report: skyloom plan ({algo}): {rp.stderr.strip()}", file=sys.stderr)
        stages = [{"device": name.get(s["device"], s["device"]), "site": s["site"],
                   "units": f'{s["first_unit"]}-{s["last_unit"]}', "warmup": s["warmup"],
                   "fwd_s": s["fwd_s"], "bwd_s": s["bwd_s"]} for s in bal["stages"]]
        last = st.get("last_step") or {}
        for s, ls in zip(stages, last.get("stages", [])):
            m = plan["micro_batches"]
            s["measured_last_step"] = {k: ls[k] for k in ("fwd_s", "bwd_s", "recv_s", "send_s", "finish_s", "step_s")}
            s["predicted_compute_s"] = (s["fwd_s"] + s["bwd_s"]) * m
        for s, b in zip(stages, bal["stages"]):
            s["sim_idle_s"] = b["simulated"]["idle_s"]
        res["algos"][algo] = {
            "job": st["job_id"], "state": st["state"], "steps": len(rows),
            "measured_s": meas, "measured_min_s": min(steady) if steady else None,
            "measured_max_s": max(steady) if steady else None, "step_s": [float(r["step_s"]) for r in rows],
            "predicted_s": pred, "ratio": meas / pred if pred else None, "rebuilt_predicted_s": rebuilt,
            "micro_batches": plan["micro_batches"], "stages": stages,
            "left_out": [name.get(x["device"], x["device"]) for x in bal.get("left_out", [])],
            "network": links}
        for did, p in st["profiles"].items():
            if did in enc:
                enc[did].append(p["unit_fwd_s"][1] + p["unit_bwd_s"][1])
        for l in links:
            if l["a"] == l["b"]:
                continue
            mbit, ms = shaped[frozenset((l["a"], l["b"]))]
            res["links"].append({"job": algo, "a": l["a"], "b": l["b"], "shaped_mbit": mbit,
                                 "shaped_rtt_ms": 2 * ms, "profiled_mbit": l["bandwidth_gbps"] * 1000,
                                 "profiled_rtt_ms": 2 * l["latency_ms"], "samples": l["samples"]})
    even = res["algos"].get("even", {}).get("measured_s")
    even_p = res["algos"].get("even", {}).get("predicted_s")
    for r in res["algos"].values():
        r["speedup_measured"] = even / r["measured_s"] if even else None
        r["speedup_predicted"] = even_p / r["predicted_s"] if even_p else None
    core_s = {}
    for d in devs:
        if enc[d["id"]]:
            t = statistics.median(enc[d["id"]])
            core_s[d["id"]] = t * d["cores"]
    ref = statistics.median(core_s.values()) if core_s else 0
    for d in devs:
        if d["id"] in core_s:
            t = core_s[d["id"]] / d["cores"]
            res["devices"].append({"name": d["name"], "site": d["site"], "cores": d["cores"],
                                   "threads": d["threads"], "encoder_s": t, "core_s": core_s[d["id"]],
                                   "vs_median": core_s[d["id"]] / ref - 1})

    # verdicts
    ok_links = all(abs(l["profiled_mbit"] / l["shaped_mbit"] - 1) <= 0.1 and
                   abs(l["profiled_rtt_ms"] / l["shaped_rtt_ms"] - 1) <= 0.1 for l in res["links"])
    ok_ratio = all(r["ratio"] and abs(r["ratio"] - 1) <= 0.15 for r in res["algos"].values())
    opt = res["algos"].get("optimal", {})
    ok_speed = bool(opt.get("speedup_measured") and opt["speedup_measured"] >= 1.5)
    ok_dev = all(abs(d["vs_median"]) <= 0.15 for d in res["devices"])
    res["targets"] = {"optimal_1.5x_even": ok_speed, "within_15pct": ok_ratio,
                      "links_within_10pct": ok_links, "devices_match_quota_15pct": ok_dev}
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)

    md = []
    md.append("| algo | stages | devices left out | measured s (median after warm-up) | min-max | predicted s | measured / predicted | fastest step / predicted | speed-up over even (measured) | (predicted) |")
    md.append("|---|---:|---|---:|---|---:|---:|---:|---:|---:|")
    for algo, r in res["algos"].items():
        md.append(f'| {algo} | {len(r["stages"])} | {", ".join(r["left_out"]) or "-"} | {r["measured_s"]:.3f} | '
                  f'{r["measured_min_s"]:.2f}-{r["measured_max_s"]:.2f} | {r["predicted_s"]:.3f} | {r["ratio"]:.3f} | '
                  f'{r["measured_min_s"] / r["predicted_s"]:.3f} | '
                  f'{r["speedup_measured"]:.2f}x | {r["speedup_predicted"]:.2f}x |')
    md.append("")
    for algo, r in res["algos"].items():
        md.append(f"{algo}: " + ", ".join(f'{s["device"]} {s["units"]}' for s in r["stages"]))
    md.append("")
    md.append("Per stage, the last step of each job: measured seconds against the plan's (compute: the "
              "profiled unit times x micro-batches; idle: the simulator's). *other* = receiving (waiting "
              "and opening frames) + sending (sealing frames) + finishing (the global norm's gather and "
              "the optimizer step).")
    md.append("")
    md.append("| algo | stage | device | units | compute measured | compute predicted | ratio | other measured | idle predicted | of which send | step |")
    md.append("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for algo, r in res["algos"].items():
        for i, s in enumerate(r["stages"]):
            ms = s.get("measured_last_step")
            if not ms:
                continue
            comp = ms["fwd_s"] + ms["bwd_s"]
            other = ms["recv_s"] + ms["send_s"] + ms["finish_s"]
            md.append(f'| {algo} | {i} | {s["device"]} | {s["units"]} | {comp:.3f} | {s["predicted_compute_s"]:.3f} | '
                      f'{comp / s["predicted_compute_s"]:.2f} | {other:.3f} | {s["sim_idle_s"]:.3f} | {ms["send_s"]:.3f} | '
                      f'{ms["step_s"]:.3f} |')
    md.append("")
    md.append("| job | link | shaped Mbit/s | profiled Mbit/s | error | shaped RTT ms | profiled RTT ms | error | device pairs |")
    md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for l in res["links"]:
        md.append(f'| {l["job"]} | {l["a"]}-{l["b"]} | {l["shaped_mbit"]:.0f} | {l["profiled_mbit"]:.1f} | '
                  f'{100 * (l["profiled_mbit"] / l["shaped_mbit"] - 1):+.1f}% | {l["shaped_rtt_ms"]:.0f} | '
                  f'{l["profiled_rtt_ms"]:.2f} | {100 * (l["profiled_rtt_ms"] / l["shaped_rtt_ms"] - 1):+.1f}% | {l["samples"]} |')
    md.append("")
    md.append("| device | site | CPU quota (cores) | threads | encoder fwd+bwd s (median of the jobs' profiles) | x quota (core-s) | vs median |")
    md.append("|---|---|---:|---:|---:|---:|---:|")
    for d in res["devices"]:
        md.append(f'| {d["name"]} | {d["site"]} | {d["cores"]:.2f} | {d["threads"]} | {d["encoder_s"]:.4f} | '
                  f'{d["core_s"]:.4f} | {100 * d["vs_median"]:+.1f}% |')
    md.append("")
    md.append("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in res["targets"].items()))
    text = "\n".join(md) + "\n"
    open(os.path.join(a.out, "results.md"), "w").write(text)
    print(text)
    for algo, r in res["algos"].items():
        if r["rebuilt_predicted_s"] is not None and abs(r["rebuilt_predicted_s"] / r["predicted_s"] - 1) > 1e-6:
            print(f"testbed-report: {algo}: the plan rebuilt from the profile predicts "
                  f"{r['rebuilt_predicted_s']:.4f} s, the job {r['predicted_s']:.4f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
