"""python_bench_torch_test: `memento bench torch` (tiny preset, one round) prints every mode."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import agent_util  # noqa: E402

agent_util.require_torch()

r = subprocess.run([agent_util.memento_bin(), "bench", "torch", "--json", "--preset", "tiny",
                    "--steps", "2", "--rounds", "1", "--warmup", "1"], capture_output=True, text=True)
if r.returncode != 0:
    print(r.stdout, r.stderr)
    raise SystemExit(f"FAIL: memento bench torch exited {r.returncode}")
out = json.loads(r.stdout)
print(json.dumps(out))
for mode in ("off", "memento", "torch_save", "sync_copy"):
    m = out["modes"][mode]
    assert m["step_s"] > 0, (mode, m)
    if mode != "off":
        assert "overhead_pct" in m and m["blocking_s"] > 0, (mode, m)
assert out["blocking_ratio"] > 0, out
assert out["state_bytes"] > out["params"] * 4 * 2, out  # parameters + AdamW moments
print("PASS")
