"""python_setup_test: python/setup.py's metadata (name, version = CMake's, package list).

Reads the metadata only; building the extension through pip is not run here
(it compiles the library in a build directory of its own).
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.dirname(HERE)
REPO = os.path.dirname(PY)

with open(os.path.join(REPO, "CMakeLists.txt")) as f:
    version = re.search(r"project\(memento VERSION ([0-9.]+)", f.read()).group(1)
r = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=PY,
                   capture_output=True, text=True)
if r.returncode != 0:
    print(r.stdout, r.stderr)
    raise SystemExit("FAIL: setup.py --name --version failed")
lines = [line for line in r.stdout.splitlines() if line.strip()]
assert lines[-2:] == ["memento", version], lines
print("PASS: setup.py says memento", version)
