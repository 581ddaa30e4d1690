"""python_durable_test: `memento export` and memento.load_durable against a real durable tier.

The agent streams versions to --durable-dir; the exported safetensors file
and load_durable() give back the model's state_dict() and the optimizer's
state byte for byte, and load_state_dict() takes them.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

agent_util.require_torch()

import torch  # noqa: E402

import memento  # noqa: E402
from memento import _memento  # noqa: E402
from memento.durable import read_safetensors  # noqa: E402
from memento.torch import Checkpointer  # noqa: E402


def wait_durable(root, steps, timeout=120):
    """The newest complete durable step among `steps` (the agent persists in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [v["step"] for v in _memento.durable_versions(root) if v["complete"] and v["step"] in steps]
        if done:
            return max(done)
        time.sleep(0.1)
    raise AssertionError(f"none of steps {steps} durable in {root} after {timeout} s: "
                         f"{_memento.durable_versions(root)}")


class DurableTest(unittest.TestCase):
    def test_export_and_load_durable_match_state_dict(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                    torch.nn.Linear(32, 8))
        model.register_buffer("bf", torch.randn(5).to(torch.bfloat16))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        durable = agent_util.tmpdir("durable-")
        try:
            with agent_util.Agent("pydurable", extra=["--durable-dir", durable,
                                                       "--persist-every", "1"]) as agent:
                ckpt = Checkpointer(model=model, optimizer=opt, job_id=agent.job,
                                    agent_dir=agent.root)
                states = []
                for step in range(4):
                    x = torch.randn(4, 16)
                    model(x).sum().backward()
                    opt.step()
                    opt.zero_grad()
                    ckpt.snapshot(step)
                    states.append(({k: v.clone() for k, v in model.state_dict().items()},
                                   [{k: v.clone() for k, v in st.items()} for st in opt.state.values()]))
                ckpt.close()
                # close() takes a last snapshot that the durable hold skipped.
                step = wait_durable(durable, [3])

            expected, state = states[step]
            loaded = memento.load_durable(durable, prefix="model/")
            self.assertEqual(sorted(loaded), sorted(expected))
            for k, v in expected.items():
                self.assertEqual(loaded[k].dtype, v.dtype, k)
                self.assertTrue(torch.equal(loaded[k], v), k)
            fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                        torch.nn.Linear(32, 8))
            fresh.register_buffer("bf", torch.zeros(5, dtype=torch.bfloat16))
            fresh.load_state_dict(loaded)
            for k, v in fresh.state_dict().items():
                self.assertTrue(torch.equal(v, expected[k]), k)

            # The optimizer's state under its registered names.
            everything = memento.load_durable(durable, step=step)
            self.assertTrue(torch.equal(everything["optimizer/state/0/exp_avg"], state[0]["exp_avg"]))
            self.assertTrue(torch.equal(everything["optimizer/state/3/exp_avg_sq"],
                                        state[3]["exp_avg_sq"]))
            self.assertFalse(any(k.startswith("__memento__") for k in everything))

            # The command line writes the same file.
            out = os.path.join(durable, "model.safetensors")
            r = subprocess.run([agent_util.memento_bin(), "export", durable, "--step", str(step),
                                "--prefix", "model/", "--out", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"exported step {step}", r.stdout)
            from_file = memento.load_durable(out)
            for k, v in expected.items():
                self.assertTrue(torch.equal(from_file[k], v), k)

            # A step that does not exist is a clear error, from Python and the CLI.
            with self.assertRaises(memento.Error) as cm:
                memento.load_durable(durable, step=99)
            self.assertEqual(cm.exception.code, "NotFound")
            r = subprocess.run([agent_util.memento_bin(), "export", durable, "--step", "99",
                                "--out", out + ".x"], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("99", r.stderr)
            self.assertFalse(os.path.exists(out + ".x"))
        finally:
            shutil.rmtree(durable, ignore_errors=True)

    def test_close_takes_the_last_snapshot_that_the_durable_hold_skipped(self):
        """The last step of a run reaches the durable tier although its snapshot() was skipped.

        The bandwidth cap keeps a version in the persister for about a second,
        so the agent's hold protects its slot and the snapshots that would
        overwrite it are skipped. The run ends on the first skipped step;
        close() takes it again once the hold passes and the agent persists it.
        A skipped snapshot followed by an optimizer step is not taken again
        (the state is no longer that step's).
        """
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 64))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # ~3.3 MB of state with AdamW

        def train_step():
            model(torch.randn(8, 256)).sum().backward()
            opt.step()
            opt.zero_grad()

        durable = agent_util.tmpdir("durable-")
        try:
            with agent_util.Agent("pydurable-close", extra=[
                    "--durable-dir", durable, "--persist-every", "1",
                    "--persist-bandwidth", "2M", "--durable-hold-max-s", "60"]) as agent, \
                    agent_util.Agent("pydurable-close-2", extra=[
                        "--durable-dir", durable + "-2", "--persist-every", "1",
                        "--persist-bandwidth", "2M", "--durable-hold-max-s", "60"]) as agent2:
                ckpt = Checkpointer(model=model, optimizer=opt, job_id=agent.job,
                                    agent_dir=agent.root)
                # Until a snapshot is skipped: usually step 2 (persisting
                # step 0 takes ~1.6 s at 2 MB/s, a step milliseconds), but
                # when the agent first notices a later version it persists
                # that one and holds its slot instead (seen on a quiet
                # machine: no skip in the first four steps). The run ends
                # on the skipped step.
                last = None
                for step in range(200):
                    train_step()
                    ckpt.snapshot(step)
                    last = step
                    if ckpt.last_snapshot_stats()["skipped"]:
                        break
                self.assertTrue(ckpt.last_snapshot_stats()["skipped"],
                                "no snapshot was skipped in 200 steps: nothing was tested")
                final = {k: v.clone() for k, v in model.state_dict().items()}
                final_opt = [{k: v.clone() for k, v in st.items()} for st in opt.state.values()]
                self.assertLess(max(v["step"] for v in ckpt.versions()), last)
                ckpt.close()
                held = Checkpointer(model=model, optimizer=opt, job_id=agent.job,
                                    agent_dir=agent.root, fence_optimizer=False).versions()
                self.assertEqual(max(v["step"] for v in held), last, held)
                wait_durable(durable, [last])
                loaded = memento.load_durable(durable, step=last)
                for k, v in final.items():
                    self.assertTrue(torch.equal(loaded["model/" + k], v), k)
                self.assertTrue(torch.equal(loaded["optimizer/state/3/exp_avg_sq"],
                                            final_opt[3]["exp_avg_sq"]))

                # Skipped, then the state changes: close() must not save it as step 3.
                ckpt = Checkpointer(model=model, optimizer=opt, job_id=agent.job + "-2",
                                    agent_dir=agent2.root)
                # Until a snapshot is skipped (usually step 2; on a loaded
                # machine the first persist may end before: the next one
                # holds its slot again).
                last_taken = None
                for step in range(200):
                    train_step()
                    ckpt.snapshot(step)
                    if ckpt.last_snapshot_stats()["skipped"]:
                        break
                    last_taken = step
                self.assertTrue(ckpt.last_snapshot_stats()["skipped"],
                                "no snapshot was skipped in 200 steps: nothing was tested")
                train_step()        # the fenced optimizer step changes the state
                ckpt.close()
                self.assertEqual(max(v["step"] for v in ckpt.versions()), last_taken)
        finally:
            shutil.rmtree(durable, ignore_errors=True)
            shutil.rmtree(durable + "-2", ignore_errors=True)

    def test_memento_run_lets_the_durable_tier_finish_before_stopping_the_agent(self):
        """`memento run` waits for the durable tier before it stops the agent it started.

        The job ends while versions are still queued for the durable tier (the
        bandwidth cap, 8 MB/s after an 8 MiB burst, makes each ~25 MB version
        take seconds): an agent stopped at once drops them (it gives its
        persister 0.5 s), and the last step would never be durable.
        """
        script = textwrap.dedent("""
            import torch
            from memento.torch import Checkpointer
            torch.manual_seed(2)
            model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            ckpt = Checkpointer(model=model, optimizer=opt)   # MEMENTO_JOB_ID, MEMENTO_RUN_DIR
            for step in range(4):
                model(torch.randn(8, 1024)).sum().backward(); opt.step(); opt.zero_grad()
                ckpt.snapshot(step)
            ckpt.close()
            torch.save(model.state_dict(), __import__("sys").argv[1])
        """)
        durable = agent_util.tmpdir("durable-")
        root = tempfile.mkdtemp(prefix="memento-pyrun-", dir="/dev/shm")
        final = os.path.join(durable, "final.pt")
        try:
            r = subprocess.run(
                [agent_util.memento_bin(), "run", "--job", "pyrun", "--root", root,
                 "--remove-on-exit", "--agent-arg=--durable-dir", f"--agent-arg={durable}",
                 "--agent-arg=--persist-bandwidth", "--agent-arg=8M", "--",
                 sys.executable, "-c", script, final],
                capture_output=True, text=True, timeout=180)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            done = [v["step"] for v in _memento.durable_versions(durable) if v["complete"]]
            self.assertIn(3, done, _memento.durable_versions(durable))
            self.assertIn("has written every version it was given", r.stderr)
            loaded = memento.load_durable(durable, step=3, prefix="model/")
            for k, v in torch.load(final).items():
                self.assertTrue(torch.equal(loaded[k], v), k)
        finally:
            shutil.rmtree(durable, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            if os.path.exists(root + ".agent.log"):
                os.unlink(root + ".agent.log")


if __name__ == "__main__":
    unittest.main()
