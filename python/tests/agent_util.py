"""Test helpers: a real `memento agent` in a temporary root, and torch-or-skip."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch is not installed for", sys.executable, "(apt-get install python3-torch)")
        sys.exit(SKIP)


def memento_bin():
    return os.environ.get("MEMENTO_BIN", "memento")


def tmpdir(prefix):
    base = os.environ.get("MEMENTO_TEST_TMPDIR") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


class Agent:
    """`memento agent --job JOB --root ROOT` as a child process."""

    def __init__(self, job, root=None, extra=()):
        self.job = job
        self.own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix=f"memento-{job}-", dir="/dev/shm")
        self.proc = subprocess.Popen([memento_bin(), "agent", "--job", job, "--root", self.root, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.proc.kill()
            raise RuntimeError(f"agent did not start: {line!r} {self.proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise RuntimeError("agent took over 60 s to start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()
        if self.own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
