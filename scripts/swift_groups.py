#!/usr/bin/env python3
"""Recovery time with the quiescent Gloo groups kept against rebuilt (issue 19).

Runs `memento launch --recovery undo` of the reference trainer (DP x PP on
--nodes nodes, the tiny preset), one rank SIGKILLed at --kill-step just
before a collective (--fail-point: grad-norm, the default, is where every
group the lost rank is not in is kept; grad-allreduce keeps the PP and TP
groups; update keeps little), in pairs: once as it is (the survivors keep
the groups no lost rank is in) and once with `memento-trainer
--rebuild-all-groups` (every group connected again), the order alternating
from pair to pair. Per run it takes from the launcher's --summary-json the
recovery's resume_s (from reaping the killed rank to the first step completed
after the recovery) and total_s, and from the ranks' logs the largest
survivor's recover_s (its Reconnect and undo) and what each kept. A run that
did not recover in process (a fallback to the restart) fails the script.
Prints one JSON object: per variant the median and every value, the
medians' ratios, and the load average (1 min) before each run.

  scripts/swift_groups.py --pairs 8            # from the repo root, build/ built

With --step-cost it measures instead what keeping groups costs a step: the
gradient norm's commit round, which the trainer runs only where groups can
be kept (docs/swift.md). Failure-free `memento-trainer --launch --recovery
undo` runs (DP x PP, --preset, --steps), in pairs with and without
--rebuild-all-groups (no commit round), alternating; per run the trainer's
median step time.

  scripts/swift_groups.py --step-cost --pairs 8 --steps 200
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile


def run_once(args, variant, index, root):
    d = os.path.join(root, f"{variant}-{index}")
    os.makedirs(d)
    cmd = [
        args.memento, "launch", "--quiet", "--job", f"sg-{os.getpid()}-{variant}-{index}",
        "--nodes", str(args.nodes), "--ranks-per-node", str(args.dp * args.pp // args.nodes),
        "--run-dir", os.path.join(d, "run"),
        "--summary-json", os.path.join(d, "summary.json"),
        "--dp", str(args.dp), "--pp", str(args.pp), "--recovery", "undo",
        "--", args.trainer, "--quiet", "--preset", "tiny", "--layers", str(args.layers),
        "--batch", "8", "--micro-batches", "4", "--steps", str(args.steps),
        "--comm-timeout", "60", "--fail-rank", str(args.kill_rank),
        "--fail-at-step", str(args.kill_step), "--fail-point", args.fail_point,
    ]
    if variant == "rebuild":
        cmd.append("--rebuild-all-groups")
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit(f"{variant} run {index} exited {out.returncode}:\n{out.stdout[-4000:]}")
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    recs = summary.get("recoveries", [])
    if len(recs) != 1 or recs[0].get("mode") != "undo" or recs[0].get("fallback"):
        sys.exit(f"{variant} run {index}: not one in-process undo recovery: {recs}")
    rec = recs[0]
    recover_s, kept = 0.0, []
    logs = os.path.join(d, "run", "logs")
    for name in sorted(os.listdir(logs)):
        text = open(os.path.join(logs, name), errors="replace").read()
        for m in re.finditer(r'"swift_recovery": (\{[^}]*\})', text):
            r = json.loads(m.group(1))
            if not r.get("replacement"):
                recover_s = max(recover_s, r["recover_s"])
        for m in re.finditer(r"kept Gloo group\(s\): ([^\n]*)", text):
            kept.append(m.group(1))
    return {"resume_s": rec["resume_s"], "total_s": rec["total_s"],
            "survivor_recover_s": recover_s, "load1": load,
            "groups_kept": sum(0 if k == "none" else len(k.split()) for k in kept)}


def step_cost_once(args, variant):
    d = tempfile.mkdtemp(prefix="swift-step-cost-")
    cmd = [args.trainer, "--launch", "--dp", str(args.dp), "--pp", str(args.pp),
           "--preset", args.preset, "--steps", str(args.steps), "--recovery", "undo",
           "--rendezvous", d, "--json", "--quiet"]
    if args.preset == "tiny":
        cmd += ["--layers", str(args.layers)]
    if variant == "no_commit":
        cmd.append("--rebuild-all-groups")
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shutil.rmtree(d, ignore_errors=True)
    m = re.search(r'"median_step_s": ([0-9.]+)', out.stdout)
    if out.returncode != 0 or m is None:
        sys.exit(f"{variant} run exited {out.returncode}:\n{out.stdout[-4000:]}")
    return {"median_step_s": float(m.group(1)), "load1": load}


def step_cost(args):
    runs = {"commit": [], "no_commit": []}
    for i in range(args.pairs):
        order = ["commit", "no_commit"] if i % 2 == 0 else ["no_commit", "commit"]
        for v in order:
            runs[v].append(step_cost_once(args, v))
    result = {"setup": {k: getattr(args, k) for k in ("dp", "pp", "preset", "steps", "pairs")}}
    for v, rs in runs.items():
        result[v] = {key: {"median": statistics.median([r[key] for r in rs]),
                           "all": [r[key] for r in rs]} for key in ("median_step_s", "load1")}
    diffs = [c["median_step_s"] - n["median_step_s"]
             for c, n in zip(runs["commit"], runs["no_commit"])]
    result["commit_minus_no_commit_s"] = {"median": statistics.median(diffs), "all": diffs,
                                          "commit_slower_in": sum(d > 0 for d in diffs)}
    result["commit_cost_pct"] = 100.0 * statistics.median(diffs) / result["no_commit"][
        "median_step_s"]["median"]
    print(json.dumps(result, indent=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memento", default="build/tools/memento")
    p.add_argument("--trainer", default="build/examples/trainer/memento-trainer")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--kill-step", type=int, default=10)
    p.add_argument("--kill-rank", type=int, default=4)
    p.add_argument("--fail-point", default="grad-norm")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--step-cost", action="store_true",
                   help="measure the commit round's cost per step instead (no failure)")
    p.add_argument("--preset", default="tiny", help="with --step-cost: the model preset")
    args = p.parse_args()
    if args.step_cost:
        step_cost(args)
        return
    root = tempfile.mkdtemp(prefix="swift-groups-")
    runs = {"keep": [], "rebuild": []}
    try:
        for i in range(args.pairs):
            order = ["keep", "rebuild"] if i % 2 == 0 else ["rebuild", "keep"]
            for v in order:
                runs[v].append(run_once(args, v, i, root))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    result = {"setup": {k: getattr(args, k) for k in
                        ("dp", "pp", "nodes", "layers", "steps", "kill_step", "kill_rank",
                         "fail_point", "pairs")}}
    for v, rs in runs.items():
        result[v] = {}
        for key in ("resume_s", "total_s", "survivor_recover_s", "groups_kept", "load1"):
            vals = [r[key] for r in rs]
            result[v][key] = {"median": statistics.median(vals), "all": vals}
    for key in ("resume_s", "total_s", "survivor_recover_s"):
        result[f"{key}_keep_vs_rebuild"] = (result["keep"][key]["median"] /
                                            result["rebuild"][key]["median"])
    # Paired: within a pair the two runs share the machine's load.
    diffs = [k["resume_s"] - r["resume_s"] for k, r in zip(runs["keep"], runs["rebuild"])]
    result["resume_s_paired_diff"] = {"median": statistics.median(diffs), "all": diffs,
                                      "keep_faster_in": sum(d < 0 for d in diffs)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
