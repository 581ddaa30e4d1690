"""The PyTorch path on a GPU: CUDA tensors through memento.torch (issue 17).

Run under `memento run` (which starts the node's agent), on a machine with a
CUDA device:

    memento run --job cuda-check -- python3 examples/torch/cuda_check.py [--mib 512]

Phase 1 trains a model on cuda:0 with AdamW, snapshots every step, writes the
state of its last step to a reference file and exits without a goodbye
(os._exit, as a killed worker would). Phase 2 (a new process, a model with
other weights) restores: the restored step and every parameter and optimizer
tensor must equal the reference byte for byte. Phase 3 measures, in one
process and alternating, the step time without snapshots and with them, and
the time snapshot() blocks the loop. Prints one JSON line per phase; exit 0
only if the restore is bit-identical. Not in `make test` (no GPU there).
"""
import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

import torch

from memento.torch import Checkpointer


def build(mib, seed):
    torch.manual_seed(seed)
    width = 2048
    layers = max(1, int(mib * (1 << 20) / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, width


def step(model, opt, width, i, batch=64):
    g = torch.Generator(device="cuda").manual_seed(1000 + i)
    x = torch.randn(batch, width, device="cuda", generator=g)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def state_bytes(model, opt):
    out = {}
    for n, p in model.state_dict().items():
        out["model/" + n] = p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            if torch.is_tensor(v):
                out[f"opt/{i}/{k}"] = v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return out


def phase_train(a):
    model, opt, width = build(a.mib, 1)
    ckpt = Checkpointer(model=model, optimizer=opt)
    for i in range(a.steps):
        step(model, opt, width, i)
        ckpt.snapshot(i)
    ckpt.fence()
    torch.cuda.synchronize()
    with open(a.ref, "wb") as f:
        pickle.dump({"step": a.steps - 1, "state": state_bytes(model, opt)}, f)
    ckpt.close()
    print(json.dumps({"phase": "train", "steps": a.steps, "params": sum(p.numel() for p in model.parameters())}),
          flush=True)
    os._exit(0)


def phase_restore(a):
    model, opt, width = build(a.mib, 2)
    step(model, opt, width, 0)  # AdamW's state exists before the restore, as after a first step
    ckpt = Checkpointer(model=model, optimizer=opt)
    t0 = time.perf_counter()
    got = ckpt.restore()
    torch.cuda.synchronize()
    restore_s = time.perf_counter() - t0
    with open(a.ref, "rb") as f:
        ref = pickle.load(f)
    now = state_bytes(model, opt)
    diff = sorted(k for k in ref["state"] if ref["state"][k] != now.get(k))
    nbytes = sum(len(v) for v in now.values())
    ok = got == ref["step"] and not diff and set(now) == set(ref["state"])
    print(json.dumps({"phase": "restore", "restored_step": got, "expected_step": ref["step"], "bytes": nbytes,
                      "restore_s": restore_s, "tensors": len(now), "differing": diff[:5],
                      "bit_identical": ok}), flush=True)
    ckpt.close()
    return 0 if ok else 1


def phase_bench(a):
    model, opt, width = build(a.mib, 3)
    ckpt = Checkpointer(model=model, optimizer=opt)
    times = {"off": [], "memento": []}
    block = []
    i = 0
    for rnd in range(a.rounds):
        for mode in (("off", "memento") if rnd % 2 == 0 else ("memento", "off")):
            for _ in range(a.bench_steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(model, opt, width, i, a.batch)
                if mode == "memento":
                    b0 = time.perf_counter()
                    ckpt.snapshot(i)
                    block.append(time.perf_counter() - b0)
                torch.cuda.synchronize()
                times[mode].append(time.perf_counter() - t0)
                i += 1
            ckpt.fence()
    off, on = statistics.median(times["off"]), statistics.median(times["memento"])
    print(json.dumps({"phase": "bench", "state_bytes": sum(len(v) for v in state_bytes(model, opt).values()),
                      "steps_per_mode": len(times["off"]), "rounds": a.rounds, "batch": a.batch, "off_step_s": off,
                      "memento_step_s": on, "overhead_pct": 100.0 * (on - off) / off,
                      "snapshot_blocking_s": statistics.median(block)}), flush=True)
    ckpt.close()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", default="all", choices=["all", "train", "restore", "bench"])
    ap.add_argument("--mib", type=int, default=512, help="parameter MiB (fp32; AdamW adds twice that)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8192, help="rows per bench step (sets its compute)")
    ap.add_argument("--bench-steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--ref", default="/tmp/memento-cuda-check.pt")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_check.py: no CUDA device visible", file=sys.stderr)
        return 2
    if a.phase == "train":
        phase_train(a)
    if a.phase == "restore":
        return phase_restore(a)
    if a.phase == "bench":
        return phase_bench(a)
    me = [sys.executable, os.path.abspath(__file__), "--mib", str(a.mib), "--steps", str(a.steps),
          "--bench-steps", str(a.bench_steps), "--rounds", str(a.rounds), "--batch", str(a.batch), "--ref", a.ref]
    for ph in ("train", "restore", "bench"):
        rc = subprocess.call(me + ["--phase", ph])
        if rc != 0:
            print(f"cuda_check.py: phase {ph} exited {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
