"""python_swift_test: memento.swift (UpdateUndo, MessageLog) with real torch optimizers.

An undone step leaves the exact pre-step bytes (parameters, optimizer state,
param_groups), also for a step that failed half-way and for the first step
(whose optimizer state it removes), and the run then continues to the same
bytes as a failure-free run. A two-stage pipeline (the stages as modules in
one process) logs its messages; the second stage, rebuilt from an older
state, replays from the first stage's log to the same bytes; a corrupted
log entry and a replay that diverges are errors, not silent.
"""

import os
import pickle
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

agent_util.require_torch()

import torch  # noqa: E402

import memento  # noqa: E402
from memento.swift import MessageLog, UpdateUndo, tensor_checksum  # noqa: E402


def state_bytes(model, opt):
    """Every parameter, optimizer state entry and param_group value, as bytes."""
    out = [("p", n, tensor_checksum(p)) for n, p in model.named_parameters()]
    for i, p in enumerate(model.parameters()):
        for k, v in sorted(opt.state.get(p, {}).items()):
            out.append(("s", i, k, tensor_checksum(v) if torch.is_tensor(v) else repr(v)))
    for g in opt.param_groups:
        out.append(("g", repr(sorted((k, v) for k, v in g.items() if k != "params"))))
    return out


def make(opt_name, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    if opt_name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def train_step(model, opt, sched, i):
    x, y = batch(i)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    sched.step()


class UpdateUndoTest(unittest.TestCase):
    def test_undo_restores_the_exact_bytes_and_the_run_continues_identically(self):
        for opt_name in ("adamw", "sgd"):
            with self.subTest(opt=opt_name):
                ref_model, ref_opt, ref_sched = make(opt_name)
                for i in range(6):
                    train_step(ref_model, ref_opt, ref_sched, i)
                model, opt, sched = make(opt_name)
                undo = UpdateUndo(opt)  # after the scheduler wrapped step()
                for i in range(4):
                    train_step(model, opt, sched, i)
                before = state_bytes(model, opt)
                ptrs = [p.data_ptr() for p in model.parameters()]
                x, y = batch(4)
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                self.assertNotEqual(state_bytes(model, opt), before)
                self.assertTrue(undo.can_undo)
                self.assertGreater(undo.saved_bytes(), 0)
                undo.undo()
                self.assertEqual(state_bytes(model, opt), before)
                self.assertEqual([p.data_ptr() for p in model.parameters()], ptrs)
                self.assertFalse(undo.can_undo)
                with self.assertRaises(memento.Error) as e:
                    undo.undo()
                self.assertEqual(e.exception.code, "FailedPrecondition")
                # The step again, then on: the failure-free run's bytes.
                opt.step()
                sched.step()
                train_step(model, opt, sched, 5)
                self.assertEqual(state_bytes(model, opt), state_bytes(ref_model, ref_opt))

    def test_undo_of_the_first_step_removes_the_state_it_created(self):
        model, opt, _ = make("adamw")
        undo = UpdateUndo(opt)
        before = state_bytes(model, opt)
        x, y = batch(0)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        self.assertTrue(all(p in opt.state for p in model.parameters()))
        undo.undo()
        self.assertEqual(len(opt.state), 0)
        self.assertEqual(state_bytes(model, opt), before)

    def test_a_step_that_fails_half_way_is_undone(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 4))
        opt = HalfFailingAdamW(model.parameters(), lr=1e-2)
        fences = []
        undo = UpdateUndo(opt, before_undo=lambda: fences.append("fence"))
        for i in range(3):
            x, y = batch(i)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        undo.commit()
        self.assertFalse(undo.can_undo)
        before = state_bytes(model, opt)
        x, y = batch(3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.fail_next = True
        with self.assertRaises(RuntimeError):
            opt.step()
        self.assertNotEqual(state_bytes(model, opt), before)
        self.assertTrue(undo.can_undo)
        undo.undo()
        self.assertEqual(fences, ["fence"])
        self.assertEqual(state_bytes(model, opt), before)


class HalfFailingAdamW(torch.optim.AdamW):
    """AdamW whose step, when fail_next is set, writes the first parameter
    and its state and then raises (as a process that loses a peer inside the
    update)."""

    fail_next = False

    def step(self, closure=None):
        if not self.fail_next:
            return super().step(closure)
        self.fail_next = False
        p = self.param_groups[0]["params"][0]
        with torch.no_grad():
            p.add_(p.grad, alpha=-0.5)
            self.state[p]["exp_avg"].mul_(0.5)
            self.state[p]["step"] += 1
        raise RuntimeError("peer lost inside the update")


class Stage(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def pipeline_step(step, s0, s1, o0, o1, log0, log1, replay=None, mbs=2):
    """One step of a 2-stage pipeline (GPipe, `mbs` micro-batches). Stage 0
    sends activations (logged by it), stage 1 sends input gradients back
    (logged by it). With `replay` (stage 0's log), stage 1 is recomputed
    alone: its inputs come from the log, its outputs are checked."""
    o1.zero_grad(set_to_none=True)
    if replay is None:
        o0.zero_grad(set_to_none=True)
    acts = []
    for mb in range(mbs):
        g = torch.Generator().manual_seed(1000 * step + mb)
        x = torch.randn(4, 8, generator=g)
        key = (step, mb, 0, 1, "act")
        if replay is None:
            a = s0(x)
            acts.append(a)
            log0.sent(key, a)
            inp = a.detach().clone()
            log1.received(key, inp)
        else:
            inp = replay.input(key)
        inp.requires_grad_(True)
        out = s1(inp)
        out.pow(2).mean().backward()
        gkey = (step, mb, 1, 0, "grad")
        if replay is None:
            log1.sent(gkey, inp.grad)
            log0.received(gkey, inp.grad)
            acts[mb].backward(inp.grad)
        else:
            replay.check_output(gkey, inp.grad)
    if replay is None:
        o0.step()
    o1.step()


class MessageLogTest(unittest.TestCase):
    def run_pipeline(self, steps, lost_at=None, corrupt=False, perturb=False):
        s0, s1 = Stage(1), Stage(2)
        o0 = torch.optim.AdamW(s0.parameters(), lr=1e-2)
        o1 = torch.optim.AdamW(s1.parameters(), lr=1e-2)
        log0, log1 = MessageLog(0), MessageLog(1)
        snap = None
        for step in range(1, steps + 1):
            if step == 2:
                # Stage 1's snapshot after step 1; older log entries are garbage.
                snap = ({k: v.clone() for k, v in s1.state_dict().items()},
                        {"state": {k: {n: t.clone() if torch.is_tensor(t) else t
                                       for n, t in v.items()}
                                   for k, v in o1.state_dict()["state"].items()},
                         "param_groups": o1.state_dict()["param_groups"]})
                log0.truncate(1)
                log1.truncate(1)
            pipeline_step(step, s0, s1, o0, o1, log0, log1)
        if lost_at is None:
            return s1, None
        # Stage 1 lost after the last step: a new one from the snapshot,
        # replaying steps 2.. from stage 0's log (through a file: it outlives
        # a process), its outputs checked against stage 0's receipts.
        path = os.path.join(tempfile.mkdtemp(prefix="memento-swift-"), "log0")
        log0.save(path)
        if corrupt:
            # One bit of one logged tensor's stored bytes flipped.
            with open(path, "rb") as f:
                payload = pickle.load(f)
            key = sorted(payload["sent"])[1]
            raw, dtype, shape, c = payload["sent"][key]
            raw = bytearray(raw)
            raw[len(raw) // 2] ^= 0x20
            payload["sent"][key] = (bytes(raw), dtype, shape, c)
            with open(path, "wb") as f:
                pickle.dump(payload, f)
        replay = MessageLog.load(path)
        self.assertEqual(replay.steps(), list(range(2, steps + 1)))
        r1 = Stage(99)
        r1.load_state_dict(snap[0])
        if perturb:
            with torch.no_grad():
                r1.fc.bias[0] += 1e-3
        ro1 = torch.optim.AdamW(r1.parameters(), lr=1e-2)
        ro1.load_state_dict(snap[1])
        for step in range(2, steps + 1):
            pipeline_step(step, None, r1, None, ro1, None, None, replay=replay)
        return s1, r1

    def test_replayed_stage_reaches_the_same_bytes(self):
        s1, r1 = self.run_pipeline(4, lost_at=4)
        for (n, a), (_, b) in zip(s1.named_parameters(), r1.named_parameters()):
            self.assertEqual(tensor_checksum(a), tensor_checksum(b), n)

    def test_corrupted_entry_is_data_loss(self):
        with self.assertRaises(memento.Error) as e:
            self.run_pipeline(4, lost_at=4, corrupt=True)
        self.assertEqual(e.exception.code, "DataLoss")
        self.assertIn("fails its checksum", e.exception.message)

    def test_diverging_replay_is_an_error(self):
        with self.assertRaises(memento.Error) as e:
            self.run_pipeline(4, lost_at=4, perturb=True)
        self.assertEqual(e.exception.code, "FailedPrecondition")
        self.assertIn("replay diverged", e.exception.message)

    def test_bad_keys_and_missing_entries_are_named(self):
        log = MessageLog(3)
        with self.assertRaises(memento.Error) as e:
            log.sent((1, 2), torch.zeros(2))
        self.assertEqual(e.exception.code, "InvalidArgument")
        with self.assertRaises(memento.Error) as e:
            log.input((1, 0, 2, 3, "act"))
        self.assertEqual(e.exception.code, "NotFound")
        self.assertIn("rank 3", e.exception.message)
        log.sent((5, 0, 3, 4, "act"), torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
        self.assertEqual(log.bytes(), 12)
        log.truncate(5)
        self.assertEqual(log.steps(), [])


if __name__ == "__main__":
    unittest.main()
