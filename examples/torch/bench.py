#!/usr/bin/env python3
"""memento bench torch: what checkpointing every step costs a PyTorch training loop.

Trains examples/torch/train.py's GPT (one process, CPU; --preset bench is
about 92M parameters) and measures, in the same run and interleaved round by
round, the step time of four modes:

  off         no checkpointing
  memento     memento.torch.Checkpointer.snapshot() every step (the copy runs
              in the background; fence() before optimizer.step())
  torch_save  torch.save() of the model's and optimizer's state_dict to
              /dev/shm every step (what a user would otherwise write)
  sync_copy   a blocking copy of every tensor into preallocated tensors
              (DLRover's flash-checkpoint copy into shared memory)

and the time each blocks the training loop per step. Prints one JSON object:
{"modes": {"off": {"step_s"}, "memento": {"step_s", "overhead_pct",
"blocking_s", ...}, ...}, "blocking_ratio": memento blocking_s / torch_save
blocking_s, ...}. Per mode: the median over rounds of the round's mean step
time, and the spread (min, max) of the rounds.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(train.PRESETS), default="bench")
    p.add_argument("--steps", type=int, default=4, help="measured steps per mode and round")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps before each mode's round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--memento-bin", default=os.environ.get("MEMENTO_BIN", "memento"))
    p.add_argument("--shm-dir", default="/dev/shm")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = train.PRESETS[args.preset]
    torch.manual_seed(0)
    model = train.GPT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    data = train.SyntheticData(0, 0, cfg["vocab"], cfg["seq"], cfg["batch"])
    params = sum(p.numel() for p in model.parameters())

    job = f"bench-torch-{os.getpid()}"
    root = tempfile.mkdtemp(prefix=f"memento-{job}-", dir=args.shm_dir)
    save_path = os.path.join(args.shm_dir, f"{job}.pt")
    agent = subprocess.Popen([args.memento_bin, "agent", "--job", job, "--root", root, "--remove-on-exit"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if "ready" not in agent.stdout.readline():
            raise SystemExit("bench torch: the agent did not start")
        from memento.torch import Checkpointer

        ckpt = Checkpointer(model=model, optimizer=opt, job_id=job, agent_dir=root,
                            fence_optimizer=False)
        copies = {}
        step_counter = [0]

        def train_step(before_update=None, after_update=None):
            x, y = data.next()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            blocked = 0.0
            if before_update:
                blocked += before_update()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if after_update:
                blocked += after_update()
            step_counter[0] += 1
            return blocked

        def timed(fn):
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

        def memento_snapshot():
            return timed(lambda: ckpt.snapshot(step_counter[0]))

        def memento_fence():
            return timed(ckpt.fence)

        def torch_save():
            return timed(lambda: torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                                            save_path))

        def sync_copy():
            def run():
                for name, t in list(model.state_dict().items()) + [
                        (f"opt/{i}/{k}", v) for i, st in enumerate(opt.state.values())
                        for k, v in st.items() if torch.is_tensor(v)]:
                    dst = copies.get(name)
                    if dst is None:
                        dst = copies[name] = torch.empty_like(t)
                    dst.copy_(t)
            return timed(run)

        modes = {
            "off": (None, None),
            "memento": (memento_fence, memento_snapshot),
            "torch_save": (None, torch_save),
            "sync_copy": (None, sync_copy),
        }
        # One step first so that the optimizer state exists (and memento registers).
        train_step()
        ckpt.snapshot(step_counter[0])
        ckpt.fence()
        state_bytes = sum(t.numel() * t.element_size() for t in ckpt._tensors.values())
        rounds = {m: {"step_s": [], "blocking_s": []} for m in modes}
        for _ in range(args.rounds):
            for mode, (before, after) in modes.items():
                for _ in range(args.warmup):
                    train_step(before, after)
                if mode == "memento":
                    ckpt.fence()
                blocked = 0.0
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    blocked += train_step(before, after)
                if mode == "memento":
                    blocked += memento_fence()
                elapsed = time.perf_counter() - t0
                rounds[mode]["step_s"].append(elapsed / args.steps)
                rounds[mode]["blocking_s"].append(blocked / args.steps)
        ckpt.close()
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(root, ignore_errors=True)
        if os.path.exists(save_path):
            os.unlink(save_path)

    off = statistics.median(rounds["off"]["step_s"])
    out = {"preset": args.preset, "params": params, "state_bytes": state_bytes, "steps": args.steps,
           "rounds": args.rounds, "threads": torch.get_num_threads(), "modes": {}}
    for mode, r in rounds.items():
        step_s = statistics.median(r["step_s"])
        m = {"step_s": step_s, "step_s_rounds": r["step_s"],
             "spread_pct": (max(r["step_s"]) - min(r["step_s"])) / step_s * 100 if step_s else 0.0}
        if mode != "off":
            m["overhead_pct"] = (step_s - off) / off * 100
            m["blocking_s"] = statistics.median(r["blocking_s"])
            m["blocking_s_rounds"] = r["blocking_s"]
        out["modes"][mode] = m
    ts = out["modes"]["torch_save"]["blocking_s"]
    out["blocking_ratio"] = out["modes"]["memento"]["blocking_s"] / ts if ts else None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
