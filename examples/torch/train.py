#!/usr/bin/env python3
"""A small GPT-style PyTorch job checkpointed by memento every step (docs/python.md).

    torchrun --standalone --nproc_per_node 2 examples/torch/train.py --preset small --steps 50
    memento run --job gpt -- torchrun --standalone --nproc_per_node 2 --max_restarts 3 \\
        --redirects 2 --tee 2 examples/torch/train.py --preset small --steps 50

One process per rank; DDP over Gloo when WORLD_SIZE > 1 (torchrun sets it),
AdamW (or --zero: ZeroRedundancyOptimizer over AdamW) with a cosine LR
schedule, a deterministic synthetic data loader whose position is part of the
state, and deterministic settings, so that two runs with the same arguments
end with the same bytes. With memento (the default) every step is snapshotted
and a restarted worker group resumes from the newest step every rank holds.

--out DIR writes each rank's final state (rank<R>.pt) for comparisons.
--kill-rank R --kill-step S --kill-at WHERE: rank R kills itself with SIGKILL
at step S in its first attempt (TORCHELASTIC_RESTART_COUNT 0); WHERE is
"snapshot" (while the step's snapshot copy runs), "optimizer" (between two
parameter updates inside optimizer.step()) or "step" (after the step's
snapshot is complete).
--wait-file F --wait-step S: before step S, wait until file F exists (a test's
gate: every rank holds at the same step while the test acts, e.g. removes a
host).
--stop-after S: stop cleanly after step S's snapshot (the schedule is still the
one for --steps; nothing is written to --out), as a job that was preempted.
"""

import argparse
import json
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # layers, dim, heads, vocab, seq, batch
    "tiny": dict(layers=2, dim=64, heads=4, vocab=256, seq=16, batch=4),
    "small": dict(layers=4, dim=256, heads=8, vocab=4096, seq=64, batch=8),   # ~5.3M params, ~60 MiB with AdamW
    "bench": dict(layers=12, dim=768, heads=12, vocab=8192, seq=128, batch=4),  # ~92M params
}


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq, **_):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class SyntheticData:
    """Batch i of rank r is a pure function of (seed, r, i): the position is the state."""

    def __init__(self, seed, rank, vocab, seq, batch):
        self.seed, self.rank, self.vocab, self.seq, self.batch = seed, rank, vocab, seq, batch
        self.position = 0

    def next(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 7919 + self.position)
        self.position += 1
        tokens = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, d):
        self.position = d["position"]


def build(args, cfg, rank, world):
    torch.manual_seed(args.seed)
    model = GPT(**cfg)
    if world > 1:
        # DDP rebuilds its gradient buckets after the first iteration of each
        # process: a worker restarted mid-run reduces its first step in the
        # initial layout, the failure-free run in the rebuilt one, and with
        # 3+ ranks the all-reduce then adds in another order (last bits
        # differ). find_unused_parameters=True keeps the initial buckets.
        model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=args.ddp_fixed_buckets)
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=args.lr, weight_decay=0.1)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.steps, 1))
    data = SyntheticData(args.seed, rank, cfg["vocab"], cfg["seq"], cfg["batch"])
    return model, opt, sched, data


def final_state(model, opt, sched, data, step):
    inner = opt.optim if hasattr(opt, "optim") else opt
    raw = model.module if hasattr(model, "module") else model
    return {
        "step": step,
        "model": {k: v.clone() for k, v in raw.state_dict().items()},
        "optimizer": {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in st.items()}
                      for i, st in enumerate(inner.state.values())},
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "inner_param_groups": [{k: v for k, v in g.items() if k != "params"} for g in inner.param_groups],
        "scheduler": sched.state_dict(),
        "data": data.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (dp_sharded state)")
    p.add_argument("--no-memento", action="store_true", help="train without checkpointing")
    p.add_argument("--out", help="directory for each rank's final state (rank<R>.pt)")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--kill-at", choices=["snapshot", "optimizer", "step"], default="snapshot")
    p.add_argument("--stop-after", type=int, default=-1,
                   help="stop after this step's snapshot (the LR schedule stays the one for --steps; "
                        "no --out files)")
    p.add_argument("--ddp-fixed-buckets", action="store_true",
                   help="DDP keeps its initial gradient buckets (no rebuild after the first iteration): "
                        "a restarted worker reduces in the same order as a failure-free run (bit-identical "
                        "recovery with more than 2 ranks)")
    p.add_argument("--wait-file", help="before --wait-step, wait until this file exists")
    p.add_argument("--wait-step", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    args = p.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    cfg = PRESETS[args.preset]
    model, opt, sched, data = build(args, cfg, rank, world)

    ckpt = None
    start = 0
    if not args.no_memento:
        from memento.torch import Checkpointer, RNGState

        ckpt = Checkpointer(model=model, optimizer=opt,
                            extra={"scheduler": sched, "data": data, "rng": RNGState()})
        restored = ckpt.restore()
        if restored is not None:
            start = restored + 1
        print(f"rank {rank} attempt {attempt}: restored {restored}, starting at step {start}", flush=True)

    kill_now = rank == args.kill_rank and attempt == 0
    if kill_now and args.kill_at == "optimizer":
        # AdamW (single-tensor path, the CPU default) starts each parameter's
        # update with param.mul_(1 - lr * wd): die at the middle parameter's,
        # after the first half of the parameters were updated in place.
        inner = opt.optim if hasattr(opt, "optim") else opt
        params = [q for g in inner.param_groups for q in g["params"]]
        victim = params[len(params) // 2].data_ptr()
        orig_mul = torch.Tensor.mul_

    for step in range(start, args.steps):
        if step == args.wait_step and args.wait_file:
            if ckpt is not None:
                ckpt.fence()  # the previous step's snapshot is complete (and can commit)
            print(f"rank {rank}: waiting for {args.wait_file} before step {step}", flush=True)
            while not os.path.exists(args.wait_file):
                time.sleep(0.05)
        model.train()
        x, y = data.next()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if kill_now and step == args.kill_step and args.kill_at == "optimizer":
            def hooked(t, *a, **k):
                if t.data_ptr() == victim:
                    print(f"rank {rank}: SIGKILL at step {step} (inside optimizer.step())", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                return orig_mul(t, *a, **k)

            torch.Tensor.mul_ = hooked
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if ckpt is not None:
            ckpt.snapshot(step)
        if kill_now and step == args.kill_step:
            if args.kill_at == "step" and ckpt is not None:
                ckpt.fence()
            print(f"rank {rank}: SIGKILL at step {step} ({args.kill_at})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step == args.stop_after:
            print(f"rank {rank}: stopping after step {step} (--stop-after)", flush=True)
            break

    if ckpt is not None:
        ckpt.close()
    if args.out and args.stop_after < 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(final_state(model, opt, sched, data, args.steps - 1), os.path.join(args.out, f"rank{rank}.pt"))
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"attempt": attempt, "start": start}, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
