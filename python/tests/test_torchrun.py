"""The PyTorch example under torchrun, with a worker killed by SIGKILL.

    test_torchrun.py wrapper   `memento run` starts the agent; rank 1 is killed
                               while its snapshot copy runs
    test_torchrun.py sidecar   an agent started separately (as systemd or a
                               Kubernetes sidecar would); rank 1 is killed in
                               the middle of optimizer.step()
    test_torchrun.py zero      ZeroRedundancyOptimizer (dp_sharded state);
                               rank 1 is killed after a complete snapshot
    test_torchrun.py corrupt   the job stops after step K (both ranks hold K
                               and K-1), rank 1's copy of step K is corrupted
                               in its slot, and a new launch (a new agent that
                               adopts the slots) falls back to K-1 on every rank

Each runs the example three ways under `torchrun --nproc_per_node
2` (DDP over Gloo): without memento, failure-free (the reference); with
memento and the kill, torchrun restarting the worker group
(--max_restarts 1); and checks that every rank's final parameters, AdamW
state, scheduler, data position and RNG equal the reference byte for byte,
and that the restarted workers resumed from a restored step. The kill step is
random (MEMENTO_TEST_SEED fixes it; the seed is printed).
"""

import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

agent_util.require_torch()

import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402

import torch  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(REPO, "examples", "torch", "train.py")
STEPS = 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, port_hint):
    # --redirects/--tee: Python 3.11's torchrun otherwise loses worker output.
    # Not --standalone: torch 1.13's standalone rendezvous always listens on
    # port 29400, so two of these tests run by `ctest -j 2` at once collided
    # ("failed to bind to 0.0.0.0:29400", torch_torchrun_wrapper_test).
    rdzv = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{free_port()}",
            "--rdzv_id", f"memento-test-{os.getpid()}-{port_hint}", "--nnodes", "1"]
    return ["torchrun", *rdzv, "--nproc_per_node", "2", "--max_restarts", "1",
            "--redirects", "2", "--tee", "2", TRAIN, "--preset", "tiny", "--steps", str(STEPS), *args]


def run(cmd, log):
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    with open(log) as f:
        out = f.read()
    print(f"$ {' '.join(cmd)}\n  -> rc {rc} in {time.monotonic() - t0:.1f} s", flush=True)
    if rc != 0:
        print(out[-6000:])
        raise SystemExit(f"FAIL: {cmd[0]} exited {rc}")
    return out


def compare(ref_dir, run_dir, ranks=2):
    """Every rank's final state in run_dir equals the one in ref_dir byte for byte (or SystemExit)."""
    for rank in range(ranks):
        a = torch.load(os.path.join(ref_dir, f"rank{rank}.pt"))
        b = torch.load(os.path.join(run_dir, f"rank{rank}.pt"))
        diffs = []

        def walk(x, y, path):
            if torch.is_tensor(x):
                if not (torch.is_tensor(y) and x.dtype == y.dtype and x.shape == y.shape and
                        torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))):
                    diffs.append(path)
            elif isinstance(x, dict):
                if not isinstance(y, dict) or sorted(x, key=str) != sorted(y, key=str):
                    diffs.append(path + " (keys)")
                    return
                for k in x:
                    walk(x[k], y[k], f"{path}/{k}")
            elif isinstance(x, (list, tuple)):
                if len(x) != len(y):
                    diffs.append(path + " (length)")
                    return
                for i, (u, v) in enumerate(zip(x, y)):
                    walk(u, v, f"{path}/{i}")
            elif x != y:
                diffs.append(f"{path} ({x!r} != {y!r})")

        walk(a, b, f"rank{rank}")
        if diffs:
            raise SystemExit(f"FAIL: rank {rank} differs from the failure-free run in "
                             f"{len(diffs)} entries: {diffs[:20]}")
        n = sum(t.numel() for t in a["model"].values())
        print(f"rank {rank}: final state equals the failure-free run byte for byte "
              f"({len(a['model'])} model tensors, {n} parameters, optimizer state, scheduler, data, RNG)")


def memory_slots(root):
    r = subprocess.run([agent_util.memento_bin(), "inspect", "--tier", "memory", "--json", root],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: memento inspect --tier memory {root}: {r.stderr}")
    return json.loads(r.stdout)["slots"]


def corrupt_newest(root, rank, step):
    """Flips one byte in the middle of the tensor data of rank's slot holding `step`."""
    slots = [s for s in memory_slots(root) if s["rank"] == rank and s["step"] == step and s["intact"]]
    if len(slots) != 1:
        raise SystemExit(f"FAIL: rank {rank} does not hold an intact step {step}: {memory_slots(root)}")
    path = os.path.join(root, f"rank{rank}.slot{slots[0]['slot']}")
    with open(path, "r+b") as f:
        # SlotHeader (src/shm/slot_format.h): data_offset at byte 152, data_bytes at 160.
        f.seek(152)
        data_offset, data_bytes = struct.unpack("<QQ", f.read(16))
        pos = data_offset + data_bytes // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))
    after = [s for s in memory_slots(root) if s["rank"] == rank and s["slot"] == slots[0]["slot"]]
    if after[0]["intact"]:
        raise SystemExit(f"FAIL: flipping byte {pos} of {path} left it intact: {after}")
    print(f"corrupted rank {rank}'s step {step} (byte {pos} of {path}): {after[0]['error']}", flush=True)


def corrupt_scenario(work, job, root, ref):
    """Stops after step K, corrupts rank 1's step K, resumes: every rank restores K-1."""
    k = STEPS // 2
    env_bin = agent_util.memento_bin()
    out_dir = os.path.join(work, "run")
    first = run([env_bin, "run", "--job", job, "--root", root, "--",
                 *torchrun(["--stop-after", str(k)], 1)], os.path.join(work, "run1.log"))
    if "stopping after step" not in first:
        raise SystemExit("FAIL: the first launch did not stop early:\n" + first[-3000:])
    for rank in range(2):
        held = sorted(s["step"] for s in memory_slots(root) if s["rank"] == rank and s["intact"])
        if held != [k - 1, k]:
            raise SystemExit(f"FAIL: rank {rank} holds steps {held} after the first launch, "
                             f"expected [{k - 1}, {k}]")
    corrupt_newest(root, 1, k)
    out = run([env_bin, "run", "--job", job, "--root", root, "--remove-on-exit", "--",
               *torchrun(["--out", out_dir], 1)], os.path.join(work, "run2.log"))
    if "started agent" not in out:
        raise SystemExit("FAIL: memento run did not start a new agent:\n" + out[-3000:])
    for rank in range(2):
        if f"rank {rank} attempt 0: restored {k - 1}, starting at step {k}" not in out:
            raise SystemExit(f"FAIL: rank {rank} did not fall back to step {k - 1}:\n" + out[-3000:])
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            info = json.load(f)
        if info["start"] != k:
            raise SystemExit(f"FAIL: rank {rank} started at {info['start']}, expected {k}")
        print(f"rank {rank}: step {k} corrupted on rank 1, both resumed at step {k} from step {k - 1}")
    compare(ref, out_dir)
    print("PASS")


def main():
    scenario = sys.argv[1] if len(sys.argv) > 1 else "wrapper"
    seed = int(os.environ.get("MEMENTO_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    kill_step = rng.randrange(2, STEPS - 1)
    kill_at = {"wrapper": "snapshot", "sidecar": "optimizer", "zero": "step", "corrupt": "-"}[scenario]
    extra = ["--zero"] if scenario == "zero" else []
    if scenario == "corrupt":
        print(f"scenario corrupt: stop after step {STEPS // 2}, corrupt it on rank 1", flush=True)
    else:
        print(f"scenario {scenario}: seed {seed}, rank 1 killed at step {kill_step} ({kill_at})", flush=True)

    work = agent_util.tmpdir(f"torchrun-{scenario}-")
    job = f"tr{scenario}{os.getpid()}"
    root = f"/dev/shm/memento-test-{job}"
    env_bin = agent_util.memento_bin()
    try:
        ref = os.path.join(work, "ref")
        run(torchrun(["--no-memento", "--out", ref, *extra], 0), os.path.join(work, "ref.log"))
        if scenario == "corrupt":
            return corrupt_scenario(work, job, root, ref)
        out_dir = os.path.join(work, "run")
        kill = ["--out", out_dir, "--kill-rank", "1", "--kill-step", str(kill_step), "--kill-at", kill_at,
                *extra]
        if scenario in ("wrapper", "zero"):
            out = run([env_bin, "run", "--job", job, "--root", root, "--remove-on-exit", "--",
                       *torchrun(kill, 1)], os.path.join(work, "run.log"))
            if "started agent" not in out:
                raise SystemExit("FAIL: memento run did not start an agent:\n" + out[-3000:])
            if os.path.exists(os.path.join(root, "agent.sock")):
                raise SystemExit("FAIL: the agent that memento run started is still there after the run")
        else:
            with agent_util.Agent(job, root=root, extra=["--remove-on-exit"]) as agent:
                out = run([env_bin, "run", "--job", job, "--root", root, "--", *torchrun(kill, 1)],
                          os.path.join(work, "run.log"))
                if "using the agent already serving" not in out:
                    raise SystemExit("FAIL: memento run did not use the running agent:\n" + out[-3000:])
                if agent.proc.poll() is not None:
                    raise SystemExit("FAIL: the separately started agent stopped with the run")
        if "SIGKILL at step" not in out:
            raise SystemExit("FAIL: the worker was not killed:\n" + out[-3000:])
        for rank in range(2):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                info = json.load(f)
            if info["attempt"] != 1 or info["start"] < 1:
                raise SystemExit(f"FAIL: rank {rank} did not resume from a restored step after a "
                                 f"restart: {info}\n" + out[-3000:])
            print(f"rank {rank}: restart {info['attempt']} resumed at step {info['start']}")
        compare(ref, out_dir)
        print("PASS")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        if os.path.exists(root + ".agent.log"):
            os.unlink(root + ".agent.log")


if __name__ == "__main__":
    main()
