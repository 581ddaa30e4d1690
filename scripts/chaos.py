#!/usr/bin/env python3
"""Seeded chaos campaign over `memento launch` (issue 21, section 5; docs/chaos.md).

Many runs of `memento launch` with memento-test-workload as the trainer, each
with random injected failures (kill-rank, kill-agent, kill-node, corrupt-rank,
kill-store at a random step; kill-store, kill-agent and kill-node in the middle
of a recovery, and kill-agent and kill-node while a recovery moves bytes
(@transfer=K); two and three node losses at once; a durable tier in some runs,
with corrupt-durable in some of those). For every run it checks:

  exit      the launcher's exit status is the one the plan predicts: 0 (every
            failure recovered), or 3 exactly when one recovery's loss set is one
            that `memento plan layout --fail` says memory cannot rebuild and it
            did not restore a durable version (30% of runs have a durable tier);
  identical every rank of a run that exited 0 ends with the digest of the
            uninterrupted computation (the workload's --reference), and no rank
            ever restored a state that differs from its recomputation;
  lost      per recovery, steps lost = the newest committed step at the failure
            (the recovery's `committed`) - the step restored; at most --max-lost
            (2) from memory; from the durable tier (--persist-every P) at most
            2 P + --max-lost (3 P after a corrupt-durable);
  lag       per failure, how far commits lagged behind the job when it was
            injected: in steps (the step the job had reached - the newest
            commit) and in seconds (how long the attempt had gone without a
            commit, the launcher's `commits quiet for T s`); the seconds at most
            --max-lag-s (10). Steps lost and lag are apart: under load the
            commits lag more steps behind a job of short steps, which a
            recovery cannot undo, while a recovery that restores less than
            the newest commit loses steps it could have kept.
  spurious  every recovery has an injected cause (no failure nobody injected);
  gap       the largest commit gap of the run (the summary's `commits`), shown;
            with --max-gap-s it is checked too.

One line per run, a summary table at the end. A failing run names the command
that reproduces it alone (`--run-seed S`). Exit status: 0 when every run passed,
1 when one failed, 2 for bad arguments.

  scripts/chaos.py --build build --runs 300 --seed 1        # the long campaign
  scripts/chaos.py --build build --run-seed 0x1234abcd      # one run again
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KINDS = ["kill-rank", "kill-agent", "kill-node", "corrupt-rank", "kill-store"]
# Counted in the summary too; not drawn among the kinds above.
EXTRA_KINDS = ["corrupt-durable"]


def log(msg):
    print(msg, flush=True)


class Run:
    """One generated run: the job's shape and its injections."""

    def __init__(self, seed, short=False, recovery_kills=True, durable=True, transfer_kills=True):
        self.seed = seed
        rng = random.Random(seed)
        self.nodes = rng.choice([4, 4, 4, 5]) if not short else 4
        self.dp = self.nodes
        self.zero = 1
        self.steps = rng.choice([50, 60, 70]) if not short else 40
        self.step_ms = rng.choice([5, 10, 15, 25, 40])  # kills land in different phases
        self.elements = rng.choice([4096, 16384, 65536])
        self.warmup_ms = 500
        self.persist_every = 0  # the durable tier's interval (--persist-every); 0: none
        scenario = rng.choices(
            ["mixed", "double", "triple", "xor-double", "recovery-store"],
            weights=[50, 20, 8, 7, 15])[0] if not short else [
                "mixed", "double", "triple", "recovery-node", "durable"][(seed - 3) % 5]
        self.scenario = scenario
        self.policy = "xor" if scenario == "xor-double" else "rs:2"
        self.inject = []  # (kind, target, step or None, recovery or None)
        self.transfer = []  # (kind, node, recovery): kill-agent|kill-node:I@transfer=K
        lo, hi = 8, self.steps - 8
        if scenario == "recovery-node":
            # Short only, fixed: a node lost and an agent killed during the
            # first recovery; a node lost during the second.
            self.inject = [("kill-node", 1, 12, None), ("kill-agent", 3, None, 0),
                           ("kill-rank", 0, 24, None), ("kill-node", 2, None, 1)]
            return
        if scenario == "durable":
            # Short only, fixed: a durable tier (persist every 5 steps); node 1 lost and node
            # 2's agent killed while recovery 0 moves node 1's bytes; the newest durable
            # version corrupted; then three nodes lost at once, which rs:2 memory cannot
            # rebuild: the fallback must restore the newest durable version that verifies.
            self.persist_every = 5
            self.step_ms = 60
            self.inject = [("kill-node", 1, 8, None), ("corrupt-durable", 0, 12, None)] + [
                ("kill-node", n, 26, None) for n in (0, 2, 3)]
            self.transfer = [("kill-agent", 2, 0)]
            return
        if scenario in ("double", "triple", "xor-double"):
            k = 3 if scenario == "triple" else 2
            nodes = rng.sample(range(self.nodes), k)
            step = rng.randint(lo, hi - 10)
            # Sometimes a software failure first, so the losses hit a restarted job.
            if rng.random() < 0.5:
                first = max(lo, step - rng.randint(8, 14))
                if first + 6 <= step:
                    kind = rng.choice(["kill-rank", "kill-agent", "kill-store"])
                    self.inject.append((kind, rng.randrange(self.nodes), first, None))
            for n in nodes:
                self.inject.append(("kill-node", n, step, None))
        else:
            count = rng.randint(2, 5)
            step = lo - rng.randint(0, 3)
            for _ in range(count):
                step += rng.randint(6, 12)
                if step > hi:
                    break
                kind = rng.choices(KINDS, weights=[25, 20, 25, 15, 15])[0]
                self.inject.append((kind, rng.randrange(self.nodes), step, None))
            if scenario == "recovery-store" or rng.random() < 0.2:
                # The store host lost in the middle of a recovery.
                failures = sum(1 for i in self.inject if i[0] not in ("kill-store", "corrupt-rank"))
                if failures > 0:
                    self.inject.append(("kill-store", 0, None, rng.randrange(failures)))
        if not any(i[0] not in ("kill-store", "corrupt-rank") for i in self.inject):
            # Every run has at least one failure to recover from.
            self.inject.append(("kill-rank", rng.randrange(self.nodes), rng.randint(lo, hi), None))
        if recovery_kills and not short:
            # An agent or a node lost in the middle of a recovery (after the
            # agents restarted, before the inventory). Drawn from a second
            # generator so that the draws above stay what they were before
            # (--no-recovery-kills reproduces a run of an older campaign).
            rng2 = random.Random(seed ^ 0x5eed5eed)
            failures = sum(1 for i in self.inject
                           if i[0] not in ("kill-store", "corrupt-rank") and i[3] is None)
            if rng2.random() < 0.3:
                kind = rng2.choice(["kill-agent", "kill-node"])
                self.inject.append((kind, rng2.randrange(self.nodes), None,
                                    rng2.randrange(failures)))
        if not short:
            # A durable tier, and kills while a recovery moves bytes: each from a generator of
            # its own, so the draws above stay what they were (--no-durable and
            # --no-transfer-kills reproduce a run of an older campaign).
            failures = sum(1 for i in self.inject
                           if i[0] not in ("kill-store", "corrupt-rank") and i[3] is None)
            rng3 = random.Random(seed ^ 0xd0ab1e5)
            if durable and rng3.random() < 0.3:
                self.persist_every = rng3.choice([5, 10])
                # A version's slot must outlive its write to the durable directory.
                self.step_ms = max(self.step_ms, 60)
                if rng3.random() < 0.3:
                    self.inject.append(("corrupt-durable", 0, rng3.randint(lo, hi), None))
            rng4 = random.Random(seed ^ 0x7a45f3)
            if transfer_kills and rng4.random() < 0.25:
                kind = rng4.choice(["kill-agent", "kill-node"])
                self.transfer.append((kind, rng4.randrange(self.nodes),
                                      rng4.randrange(failures)))

    def inject_text(self):
        out = []
        for kind, target, step, recovery in self.inject:
            where = "@step=%d" % step if recovery is None else "@recovery=%d" % recovery
            out.append(kind + ("" if kind in ("kill-store", "corrupt-durable") else ":%d" % target) +
                       where)
        for kind, node, recovery in self.transfer:
            out.append("%s:%d@transfer=%d" % (kind, node, recovery))
        return ",".join(out)


class Campaign:
    def __init__(self, args):
        self.args = args
        self.memento = os.path.join(args.build, "tools", "memento")
        self.workload = os.path.join(args.build, "tests", "cluster", "memento-test-workload")
        for b in (self.memento, self.workload):
            if not os.access(b, os.X_OK):
                raise SystemExit("chaos.py: %s is missing: build the targets memento and "
                                 "memento-test-workload first" % b)
        self.plan_cache = {}
        self.ref_cache = {}

    def recoverable(self, run, failed):
        if not failed:
            return True  # no node lost: `plan layout` without --fail reports no recovery
        key = (run.policy, run.nodes, run.zero, tuple(sorted(failed)))
        if key not in self.plan_cache:
            cmd = [self.memento, "plan", "layout", "--dp", str(run.dp), "--tp", "1", "--pp", "1",
                   "--zero", str(run.zero), "--ranks-per-node", "1", "--policy", run.policy,
                   "--fail", ",".join(str(n) for n in sorted(failed)), "--json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            self.plan_cache[key] = bool(json.loads(out)["recoverable"])
        return self.plan_cache[key]

    def reference(self, run, rank):
        key = (run.steps, run.elements, run.dp, run.zero, rank)
        if key not in self.ref_cache:
            cmd = [self.workload, "--reference", "--steps", str(run.steps), "--elements",
                   str(run.elements), "--rank", str(rank), "--dp", str(run.dp), "--tp", "1",
                   "--pp", "1", "--zero", str(run.zero)]
            self.ref_cache[key] = subprocess.run(cmd, capture_output=True, text=True,
                                                 check=True).stdout.strip()
        return self.ref_cache[key]

    def launch(self, run, work):
        out = os.path.join(work, "out")
        os.makedirs(out)
        job = "chaos%x" % (run.seed & 0xffffffff)
        cmd = [self.memento, "launch", "--job", job, "--nodes", str(run.nodes),
               "--ranks-per-node", "1", "--zero", str(run.zero), "--policy", run.policy,
               "--max-restarts", "10", "--store-down-s", "0.3",
               "--run-dir", os.path.join(work, "run"),
               "--summary-json", os.path.join(work, "summary.json")]
        if run.inject or run.transfer:
            cmd += ["--inject", run.inject_text()]
        if run.transfer:
            # @transfer=K hooks the launcher's own rebuild (RecoverOptions::on_transfer); the
            # other runs use the default, the agents' recovery leader (or --recovery-by).
            cmd += ["--recovery-by", "launcher"]
        elif self.args.recovery_by:
            cmd += ["--recovery-by", self.args.recovery_by]
        if run.persist_every > 0:
            cmd += ["--durable-dir", os.path.join(work, "durable"),
                    "--agent-arg=--persist-every=%d" % run.persist_every]
        if any(i[0] == "kill-store" for i in run.inject):
            cmd += ["--store-process"]
        cmd += ["--", self.workload, "--steps", str(run.steps), "--elements", str(run.elements),
                "--step-ms", str(run.step_ms), "--warmup-ms", str(run.warmup_ms), "--out", out]
        with open(os.path.join(work, "launch.log"), "w") as logf:
            p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                code = p.wait(timeout=self.args.run_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                code = None
        text = open(os.path.join(work, "launch.log"), errors="replace").read()
        summary = None
        try:
            with open(os.path.join(work, "summary.json")) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            pass
        return cmd, code, text, summary, out

    def check(self, run, work):
        """Runs `run` in `work`; returns (ok, line, stats)."""
        t0 = time.monotonic()
        cmd, code, text, summary, out = self.launch(run, work)
        wall = time.monotonic() - t0
        problems = []
        # Injections as they fired, grouped by the failure (recovery) they led to.
        fired = []      # every "injecting" line: (kind, target, reached)
        groups = []     # per recovery: {"nodes": set, "corrupt": set, "reached": int or None}
        current = {"nodes": set(), "corrupt": set(), "reached": None, "committed": None, "quiet_s": 0.0,
                   "injected": False}
        pending_corrupt = set()
        not_applied = []  # corrupt-rank/corrupt-durable that said "did not fire"
        for line in text.splitlines():
            m = re.search(r"\[launch\] injecting ([a-z-]+)(?::(\d+))?@(step|recovery|transfer)=(\d+)"
                          r"(?: \(job at step (-?\d+)(?:; committed (-?\d+), commits quiet for "
                          r"([\d.]+) s)?\))?", line)
            if m:
                kind, target = m.group(1), int(m.group(2) or 0)
                reached = int(m.group(5)) if m.group(5) is not None else None
                fired.append((kind, target, reached, m.group(3)))
                if m.group(3) in ("recovery", "transfer") and kind in ("kill-agent", "kill-node"):
                    # Lost during recovery K (@transfer: while it moved bytes): part of that
                    # recovery's loss set, not a failure of its own (its "failure:" line came
                    # before).
                    k = int(m.group(4))
                    if k < len(groups) and kind == "kill-node":
                        groups[k]["nodes"].add(target)
                    elif k >= len(groups):
                        problems.append("%s fired before recovery %d began" % (m.group(0), k))
                    continue
                if kind == "kill-node":
                    current["nodes"].add(target)
                if kind == "corrupt-rank":
                    pending_corrupt.add(target)  # ranks = nodes here (1 rank per node)
                if kind in ("kill-rank", "kill-agent", "kill-node"):
                    current["injected"] = True
                    if reached is not None:
                        r = current["reached"]
                        if r is None or reached < r:
                            # The first failure of the group: the lag there.
                            current["reached"] = reached
                            if m.group(6) is not None:
                                current["committed"] = int(m.group(6))
                        if m.group(7) is not None:
                            current["quiet_s"] = max(current["quiet_s"], float(m.group(7)))
                continue
            m = re.search(r"\[launch\] (corrupt-rank|corrupt-durable)(?::\d+)? did not fire", line)
            if m:
                # Injected but never applied: no failure (or durable fallback) came after
                # it, or its node lost its memory in the same failure.
                not_applied.append(m.group(1))
                continue
            if "[launch] failure: " in line:
                current["corrupt"] = set(pending_corrupt)
                pending_corrupt = set()
                groups.append(current)
                current = {"nodes": set(), "corrupt": set(), "reached": None, "committed": None, "quiet_s": 0.0,
                   "injected": False}
        # The plan's prediction: the first recovery whose loss set memory cannot rebuild ends the
        # job with exit 3, unless the run has a durable tier and that recovery restored a durable
        # version (then the job goes on). A corrupted rank counts as a loss of its node's data
        # (1 rank per node).
        recoveries = summary["recoveries"] if summary else []
        want = 0
        ambiguous = False
        fatal_at = None
        corrupt_durable = any(f[0] == "corrupt-durable" for f in fired)
        for n, g in enumerate(groups):
            rec = recoveries[n] if n < len(recoveries) else {}
            if not g["nodes"] and not g["corrupt"]:
                if rec.get("source") == "durable":
                    problems.append("recovery %d fell back to the durable tier with no node "
                                    "lost" % n)
                continue
            if self.recoverable(run, g["nodes"] | g["corrupt"]):
                if rec.get("source") == "durable":
                    problems.append("recovery %d fell back to the durable tier although memory "
                                    "can rebuild nodes %s" % (n, sorted(g["nodes"] | g["corrupt"])))
                continue
            if g["corrupt"] - g["nodes"] and self.recoverable(run, g["nodes"]):
                # Only a node's own data is corrupted, not its redundancy: the plan's
                # node-granular answer does not decide this case.
                ambiguous = True
                break
            if run.persist_every > 0 and rec.get("source") == "durable":
                continue  # memory could not rebuild; the durable tier did
            if (run.persist_every > 0 and not corrupt_durable and
                    rec.get("committed", -1) >= 4 * run.persist_every):
                problems.append("recovery %d: memory cannot rebuild and no durable version to "
                                "fall back to, with step %d committed (persist every %d)" %
                                (n, rec["committed"], run.persist_every))
            want = 3
            fatal_at = n
            break
        if code is None:
            problems.append("timed out after %d s" % self.args.run_timeout_s)
        elif not ambiguous and code != want:
            problems.append("exit %d, the plan predicts %d" % (code, want))
        elif ambiguous and code not in (0, 3):
            problems.append("exit %d, expected 0 or 3" % code)
        if code == 3 and "memory cannot rebuild" not in text:
            problems.append("exit 3 without 'memory cannot rebuild' in the output")
        if summary is None and code is not None:
            problems.append("no summary JSON")
        # Spurious failures: every recovery follows an injected rank/agent/node kill.
        for n, g in enumerate(groups):
            if not g["injected"]:
                cause = recoveries[n]["cause"] if n < len(recoveries) else "?"
                problems.append("recovery %d without an injected failure (%s)" % (n, cause))
        # Steps lost per failure, below the newest commit at the failure; the commit lag
        # (how far commits were behind the job when it was injected) apart.
        max_lost = 0
        max_lag_steps, max_lag_s = 0, 0.0
        for n, g in enumerate(groups):
            if g["reached"] is not None and g["committed"] is not None and g["committed"] >= 0:
                max_lag_steps = max(max_lag_steps, g["reached"] - g["committed"])
            max_lag_s = max(max_lag_s, g["quiet_s"])
            if self.args.max_lag_s > 0 and g["quiet_s"] > self.args.max_lag_s:
                problems.append("failure %d: commits had been quiet for %.2f s (limit %.2f s)" %
                                (n, g["quiet_s"], self.args.max_lag_s))
        for n, rec in enumerate(recoveries):
            if n >= len(groups) or fatal_at is not None and n >= fatal_at:
                continue
            if code == 3 and n == len(recoveries) - 1:
                continue  # the recovery that ended the job: nothing was restored
            if groups[n]["reached"] is None:
                continue
            committed = rec.get("committed", -1)
            if rec.get("step", -1) < 0:
                if committed >= 0:
                    problems.append("recovery %d restarted from scratch with step %d committed" %
                                    (n, committed))
                continue
            if committed < 0:
                continue
            lost = committed - rec["step"]
            limit = self.args.max_lost
            if rec.get("source") == "durable" and run.persist_every > 0:
                # Memory could not rebuild: the newest durable version that verifies, at most
                # two persist intervals below the newest commit (one being written, one
                # complete), three when corrupt-durable spoilt the newest.
                limit += run.persist_every * (3 if corrupt_durable else 2)
            else:
                max_lost = max(max_lost, lost)
            if lost > limit:
                problems.append("recovery %d lost %d steps below the newest commit (reached %d, "
                                "committed %d, restored %d from %s; limit %d)" %
                                (n, lost, groups[n]["reached"], committed, rec["step"],
                                 rec.get("source", "?"), limit))
        # Bit-identity.
        identical = "-"
        if code == 0:
            bad = []
            for r in range(run.dp):
                prefix = os.path.join(out, "rank%d" % r)
                want_digest = "%d %s" % (run.steps, self.reference(run, r))
                try:
                    got = open(prefix + ".digest").read().strip()
                except OSError:
                    got = "(none)"
                if got != want_digest:
                    bad.append("rank %d digest %s, want %s" % (r, got, want_digest))
            identical = "yes" if not bad else "NO"
            problems.extend(bad)
        for r in range(run.dp):
            mm = os.path.join(out, "rank%d.mismatch" % r)
            if os.path.exists(mm):
                problems.append("rank %d restored a wrong state: %s" %
                                (r, open(mm).read().strip()))
        gap_s, gap_steps = -1.0, -1
        if summary and "commits" in summary:
            gap_s = float(summary["commits"].get("gap_max_s", -1))
            gap_steps = int(summary["commits"].get("gap_max_steps", -1))
            if self.args.max_gap_s > 0 and gap_s > self.args.max_gap_s:
                problems.append("largest commit gap %.2f s > %.2f s" % (gap_s, self.args.max_gap_s))
        stats = {
            "fired": fired, "not_applied": not_applied, "recoveries": len(recoveries),
            "code": code, "want": want,
            "ambiguous": ambiguous, "max_lost": max_lost, "gap_s": gap_s, "gap_steps": gap_steps,
            "lag_steps": max_lag_steps, "lag_s": max_lag_s,
            "durable_recoveries": sum(1 for r in recoveries if r.get("source") == "durable"),
            "identical": identical, "wall": wall, "problems": problems,
        }
        line = ("run seed=0x%08x %-14s %s n=%d steps=%d step_ms=%d%s: %s -> exit %s (want %s) "
                "recoveries %d, lost<=%d, lag<=%d steps/%.2f s, gap %.2f s/%d steps, identical %s, "
                "%.1f s%s" %
                (run.seed, run.scenario, run.policy, run.nodes, run.steps, run.step_ms,
                 (" persist_every=%d" % run.persist_every if run.persist_every else "") +
                 (" recovery_by=launcher" if run.transfer else ""),
                 run.inject_text(), code, "0|3" if ambiguous else want, len(recoveries), max_lost,
                 max_lag_steps, max_lag_s, gap_s, gap_steps, identical, wall,
                 "" if not problems else
                 " FAIL: " + "; ".join(problems)))
        return not problems, line, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--build", default="build", help="the build directory (default: build)")
    ap.add_argument("--seed", type=lambda s: int(s, 0), default=1,
                    help="campaign seed: run k uses a seed derived from it (default 1)")
    ap.add_argument("--runs", type=int, default=10, help="number of runs (default 10)")
    ap.add_argument("--failures", type=int, default=0,
                    help="keep going until this many injections fired (overrides --runs)")
    ap.add_argument("--run-seed", type=lambda s: int(s, 0), action="append", default=[],
                    help="run exactly this run seed (repeatable): reproduces one run")
    ap.add_argument("--short", action="store_true",
                    help="small jobs (4 nodes, 40 steps) and fixed scenarios, for `make test`")
    ap.add_argument("--no-durable", action="store_true",
                    help="no durable tier in any run (reproduces a run seed of a campaign made "
                         "before runs had one)")
    ap.add_argument("--no-transfer-kills", action="store_true",
                    help="no kill-agent/kill-node@transfer=K (likewise)")
    ap.add_argument("--no-recovery-kills", action="store_true",
                    help="no kill-agent/kill-node@recovery=K (reproduces a run seed of a campaign "
                         "made before they existed)")
    ap.add_argument("--max-lost", type=int, default=2,
                    help="steps a recovery from memory may lose below the newest commit at the "
                         "failure (default 2)")
    ap.add_argument("--max-lag-s", type=float, default=10,
                    help="fail a run where commits had been quiet longer than this when a failure "
                         "was injected (default 10; 0: only shown)")
    ap.add_argument("--max-gap-s", type=float, default=0,
                    help="fail a run whose largest commit gap is longer (default: only shown)")
    ap.add_argument("--run-timeout-s", type=int, default=300, help="per run (default 300)")
    ap.add_argument("--max-wall-s", type=float, default=0,
                    help="start no run after this many seconds, then print the summary (a "
                         "campaign that must end by a deadline; default: no limit)")
    ap.add_argument("--work-dir", default="",
                    help="where runs keep their logs (default: a fresh directory in $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the logs of passing runs too")
    ap.add_argument("--recovery-by", choices=["agents", "launcher"], default="",
                    help="memento launch --recovery-by for runs without a transfer kill (those "
                         "always use the launcher's); default: launch's default (agents)")
    args = ap.parse_args()
    if args.runs < 1 and not args.run_seed and args.failures < 1:
        ap.error("--runs must be >= 1")

    camp = Campaign(args)
    extra = (" --short" if args.short else "") + (
        " --no-recovery-kills" if args.no_recovery_kills else "") + (
        " --no-durable" if args.no_durable else "") + (
        " --no-transfer-kills" if args.no_transfer_kills else "")
    work_root = args.work_dir or tempfile.mkdtemp(prefix="memento-chaos-")
    os.makedirs(work_root, exist_ok=True)
    log("chaos: campaign seed %d, logs under %s" % (args.seed, work_root))
    if args.run_seed:
        seeds = list(args.run_seed)
    else:
        master = random.Random(args.seed)
        seeds = None
    totals = {"runs": 0, "passed": 0, "fired": {}, "recoveries": 0, "exit0": 0, "exit3": 0,
              "want3": 0, "identical": 0, "max_lost": 0, "max_gap_s": 0.0, "wall": 0.0,
              "max_lag_steps": 0, "max_lag_s": 0.0, "in_recovery": 0, "in_transfer": 0,
              "durable_runs": 0, "durable_recoveries": 0, "not_applied": {}}
    failing = []
    fired_total = 0
    k = 0
    started = time.monotonic()
    while True:
        if args.max_wall_s > 0 and time.monotonic() - started > args.max_wall_s:
            log("chaos: --max-wall-s %.0f reached; no more runs" % args.max_wall_s)
            break
        if seeds is not None:
            if k >= len(seeds):
                break
            seed = seeds[k]
        else:
            if args.failures > 0:
                if fired_total >= args.failures:
                    break
            elif k >= args.runs:
                break
            seed = master.getrandbits(32)
        k += 1
        run = Run(seed, short=args.short, recovery_kills=not args.no_recovery_kills,
                  durable=not args.no_durable, transfer_kills=not args.no_transfer_kills)
        work = os.path.join(work_root, "seed-0x%08x" % seed)
        if os.path.exists(work):
            shutil.rmtree(work)
        os.makedirs(work)
        ok, line, st = camp.check(run, work)
        log(line)
        totals["runs"] += 1
        totals["passed"] += ok
        for kind, _, _, where in st["fired"]:
            totals["fired"][kind] = totals["fired"].get(kind, 0) + 1
            totals["in_recovery"] += where in ("recovery", "transfer")
            totals["in_transfer"] += where == "transfer"
        for kind in st["not_applied"]:
            totals["not_applied"][kind] = totals["not_applied"].get(kind, 0) + 1
        totals["durable_runs"] += run.persist_every > 0
        totals["durable_recoveries"] += st["durable_recoveries"]
        fired_total += len(st["fired"])
        totals["recoveries"] += st["recoveries"]
        totals["exit0"] += st["code"] == 0
        totals["exit3"] += st["code"] == 3
        totals["want3"] += st["want"] == 3
        totals["identical"] += st["identical"] == "yes"
        totals["max_lost"] = max(totals["max_lost"], st["max_lost"])
        totals["max_gap_s"] = max(totals["max_gap_s"], st["gap_s"])
        totals["max_lag_steps"] = max(totals["max_lag_steps"], st["lag_steps"])
        totals["max_lag_s"] = max(totals["max_lag_s"], st["lag_s"])
        totals["wall"] += st["wall"]
        if ok:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        else:
            failing.append(seed)
            log("  logs: %s  reproduce: %s --build %s --run-seed 0x%08x%s" %
                (work, sys.argv[0], args.build, seed, extra))
    log("")
    log("chaos summary (campaign seed %d)" % args.seed)
    log("  %-34s %d" % ("runs", totals["runs"]))
    log("  %-34s %d" % ("runs passed", totals["passed"]))
    log("  %-34s %d" % ("injected failures (fired)", fired_total))
    for kind in KINDS + EXTRA_KINDS:
        log("    %-32s %d" % (kind, totals["fired"].get(kind, 0)))
    if totals["not_applied"]:
        log("    %-32s %s" % ("corruptions that did not apply", ", ".join(
            "%s %d" % (k, v) for k, v in sorted(totals["not_applied"].items()))))
    log("    %-32s %d" % ("of them during a recovery", totals["in_recovery"]))
    log("    %-32s %d" % ("of them while it moved bytes", totals["in_transfer"]))
    log("  %-34s %d" % ("runs with a durable tier", totals["durable_runs"]))
    log("  %-34s %d" % ("recoveries from the durable tier", totals["durable_recoveries"]))
    log("  %-34s %d" % ("recoveries", totals["recoveries"]))
    log("  %-34s %d" % ("runs exit 0", totals["exit0"]))
    log("  %-34s %d (plan predicted %d)" % ("runs exit 3", totals["exit3"], totals["want3"]))
    log("  %-34s %d of %d" % ("bit-identical (exit 0 runs)", totals["identical"],
                              totals["exit0"]))
    log("  %-34s %d" % ("most steps lost below a commit", totals["max_lost"]))
    log("  %-34s %d steps, %.2f s" % ("largest commit lag at a failure", totals["max_lag_steps"],
                                       totals["max_lag_s"]))
    log("  %-34s %.2f s" % ("largest commit gap", totals["max_gap_s"]))
    log("  %-34s %.0f s" % ("wall time", totals["wall"]))
    if failing:
        log("  failing seeds: " + " ".join("0x%08x" % s for s in failing))
        log("  reproduce one: %s --build %s --run-seed 0x%08x%s" %
            (sys.argv[0], args.build, failing[0], extra))
    if not args.work_dir and not failing and not args.keep:
        shutil.rmtree(work_root, ignore_errors=True)
    return 0 if not failing else 1


if __name__ == "__main__":
    sys.exit(main())
