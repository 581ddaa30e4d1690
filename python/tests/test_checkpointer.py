"""python_checkpointer_test: memento.torch.Checkpointer against a real agent.

A failure-free run and a run that is cut off and restored into freshly built
objects end with the same bytes (parameters, AdamW state, scheduler, RNG,
data position); mismatched shapes raise an error that lists every difference
and change nothing; corrupted versions fall back to an older one.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

agent_util.require_torch()

import torch  # noqa: E402

import memento  # noqa: E402
from memento.torch import Checkpointer, RNGState  # noqa: E402


class DataPosition:
    """A deterministic synthetic data loader whose position is state."""

    def __init__(self, dim):
        self.dim = dim
        self.index = 0

    def next(self):
        g = torch.Generator().manual_seed(1000 + self.index)
        self.index += 1
        return torch.randn(4, self.dim, generator=g)

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, d):
        self.index = d["index"]


class Net(torch.nn.Module):
    def __init__(self, dim=32, hidden=48):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("h16", torch.zeros(8, dtype=torch.float16))
        self.register_buffer("bf", torch.zeros(8, dtype=torch.bfloat16))

    def forward(self, x):
        self.calls += 1
        self.h16 += 0.5
        self.bf -= 0.25
        h = torch.nn.functional.dropout(torch.relu(self.norm(self.fc1(x))), 0.1, self.training)
        return self.fc2(h)


def build(seed=0, dim=32, hidden=48):
    torch.manual_seed(seed)
    model = Net(dim, hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    data = DataPosition(dim)
    return model, opt, sched, data


def train_step(model, opt, sched, data):
    loss = model(data.next()).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()


def fingerprint(model, opt, sched, data):
    out = {f"model/{k}": v.clone() for k, v in model.state_dict().items()}
    for i, (p, st) in enumerate(opt.state.items()):
        for k, v in st.items():
            out[f"opt/{i}/{k}"] = v.clone() if torch.is_tensor(v) else v
    out["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    out["sched"] = sched.state_dict()
    out["data"] = data.index
    out["rng"] = torch.get_rng_state().clone()
    return out


def assert_identical(test, a, b):
    test.assertEqual(sorted(a), sorted(b))
    for k in a:
        if torch.is_tensor(a[k]):
            test.assertEqual(a[k].dtype, b[k].dtype, k)
            test.assertTrue(torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k],
                                        b[k].view(torch.uint8) if b[k].dim() else b[k]), k)
        else:
            test.assertEqual(a[k], b[k], k)


class CheckpointerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)

    def ckpt(self, agent, objs, **kw):
        model, opt, sched, data = objs
        return Checkpointer(model=model, optimizer=opt,
                            extra={"sched": sched, "data": data, "rng": RNGState()},
                            job_id=agent.job, agent_dir=agent.root, **kw)

    def test_cut_off_run_restores_and_ends_bit_identical(self):
        steps, cut = 9, 5
        ref = build()
        for _ in range(steps):
            train_step(*ref)
        expected = fingerprint(*ref)

        with agent_util.Agent("pyckpt") as agent:
            objs = build()
            ckpt = self.ckpt(agent, objs)
            self.assertIsNone(ckpt.restore())  # nothing saved: nothing changes
            self.assertEqual(len(objs[1].state), 0)
            for step in range(cut + 1):
                train_step(*objs)
                ckpt.snapshot(step)
            at_cut = fingerprint(*objs)
            train_step(*objs)  # a step after the last snapshot is lost
            ckpt.close()
            del objs, ckpt

            objs = build(seed=123)  # another init: everything must come from the version
            ckpt = self.ckpt(agent, objs)
            self.assertEqual(ckpt.restore(), cut)
            assert_identical(self, fingerprint(*objs), at_cut)
            for step in range(cut + 1, steps):
                train_step(*objs)
                ckpt.snapshot(step)
            ckpt.close()
            assert_identical(self, fingerprint(*objs), expected)
            self.assertEqual([v["step"] for v in ckpt.versions()], [steps - 1, steps - 2])

    def test_shape_mismatch_lists_every_difference_and_changes_nothing(self):
        with agent_util.Agent("pyshape") as agent:
            objs = build()
            ckpt = self.ckpt(agent, objs)
            train_step(*objs)
            ckpt.snapshot(0)
            ckpt.close()

            other = build(seed=5, hidden=40)
            before = fingerprint(*other)
            ckpt = self.ckpt(agent, other)
            with self.assertRaises(memento.Error) as cm:
                ckpt.restore()
            self.assertEqual(cm.exception.code, "InvalidArgument")
            msg = cm.exception.message
            for name in ("model/fc1.weight", "model/fc1.bias", "model/norm.weight", "model/fc2.weight",
                         "optimizer/state/0/exp_avg"):
                self.assertIn(name, msg)
            # Nothing changed, and the optimizer state that restore() had to
            # create is gone again.
            self.assertEqual(len(other[1].state), 0)
            assert_identical(self, fingerprint(*other), before)

    def test_corrupted_newest_version_falls_back(self):
        with agent_util.Agent("pycorrupt") as agent:
            objs = build()
            ckpt = self.ckpt(agent, objs)
            train_step(*objs)
            ckpt.snapshot(0)
            ckpt.fence()
            at0 = fingerprint(*objs)
            train_step(*objs)
            ckpt.snapshot(1)
            ckpt.fence()
            needle = objs[0].fc2.weight.detach().numpy().tobytes()  # step 1's bytes
            ckpt.close()
            self.assertEqual(sorted(v["step"] for v in ckpt.versions()), [0, 1])
            # Flip bytes of step 1's copy of fc2.weight in its slot file.
            hits = []
            for dirpath, _, files in os.walk(agent.root):
                for f in files:
                    path = os.path.join(dirpath, f)
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue
                    with open(path, "rb") as fh:
                        pos = fh.read().find(needle)
                    if pos >= 0:
                        hits.append((path, pos))
            self.assertEqual(len(hits), 1, hits)
            path, pos = hits[0]
            with open(path, "r+b") as fh:
                fh.seek(pos + 100)
                b = fh.read(1)
                fh.seek(pos + 100)
                fh.write(bytes([b[0] ^ 0xFF]))

            fresh = build(seed=9)
            ckpt = self.ckpt(agent, fresh)
            self.assertEqual(ckpt.restore(), 0)
            assert_identical(self, fingerprint(*fresh), at0)
            self.assertEqual([v["step"] for v in ckpt.versions() if v["intact"]], [0])

    def test_reallocated_tensor_is_registered_again(self):
        with agent_util.Agent("pyrealloc") as agent:
            objs = build()
            ckpt = self.ckpt(agent, objs)
            train_step(*objs)
            ckpt.snapshot(0)
            self.assertEqual(ckpt.registrations, 1)
            train_step(*objs)
            ckpt.snapshot(1)
            self.assertEqual(ckpt.registrations, 1)
            with torch.no_grad():
                objs[0].fc1.weight.data = objs[0].fc1.weight.data.clone() * 1.0
            train_step(*objs)
            ckpt.snapshot(2)
            self.assertEqual(ckpt.registrations, 2)
            at2 = fingerprint(*objs)
            ckpt.close()
            fresh = build(seed=4)
            ckpt = self.ckpt(agent, fresh)
            self.assertEqual(ckpt.restore(), 2)
            assert_identical(self, fingerprint(*fresh), at2)

    def test_non_contiguous_tensor_is_refused(self):
        class Holder:
            def __init__(self):
                self.t = torch.arange(12.0).reshape(3, 4).t()

            def state_dict(self):
                return {"t": self.t}

            def load_state_dict(self, d):
                pass

        with agent_util.Agent("pync") as agent:
            ckpt = Checkpointer(extra={"holder": Holder()}, job_id=agent.job, agent_dir=agent.root)
            with self.assertRaises(memento.Error) as cm:
                ckpt.snapshot(0)
            self.assertEqual(cm.exception.code, "InvalidArgument")
            self.assertIn("holder/t", cm.exception.message)
            self.assertIn("not contiguous", cm.exception.message)

    def test_state_classes_follow_ddp_and_zero(self):
        import socket

        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            plain = torch.nn.Linear(4, 4)
            opt = torch.optim.AdamW(plain.parameters())
            plain(torch.randn(2, 4)).sum().backward()
            opt.step()
            _, classes, _, _ = Checkpointer(model=plain, optimizer=opt, job_id="x")._flatten()
            self.assertEqual(set(classes.values()), {"private"})

            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
            zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
            ddp(torch.randn(2, 4)).sum().backward()
            zero.step()
            ckpt = Checkpointer(model=ddp, optimizer=zero, job_id="x",
                                state_classes={"optimizer/zero_inner/state/0/": "private"})
            _, classes, _, _ = ckpt._flatten()
            self.assertEqual(classes["model/module.weight"], "replicated")
            self.assertEqual(classes["optimizer/zero_inner/state/1/exp_avg"], "dp_sharded")
            self.assertEqual(classes["optimizer/zero_inner/state/0/exp_avg"], "private")  # override

            ddp_adam = torch.optim.AdamW(ddp.parameters())
            ddp(torch.randn(2, 4)).sum().backward()
            ddp_adam.step()
            _, classes, _, _ = Checkpointer(model=ddp, optimizer=ddp_adam, job_id="x")._flatten()
            self.assertEqual(set(classes.values()), {"replicated"})
        finally:
            dist.destroy_process_group()

    def test_unknown_agent_is_a_clear_error(self):
        objs = build()
        d = agent_util.tmpdir("noagent-")
        ckpt = Checkpointer(model=objs[0], job_id="none", agent_dir=d, connect_timeout_s=0.2)
        with self.assertRaises(memento.Error) as cm:
            ckpt.restore()
        self.assertEqual(cm.exception.code, "Unavailable")
        self.assertIn(d, cm.exception.message)


if __name__ == "__main__":
    unittest.main()
