"""python_pip_install_test: `pip install` from the checkout, offline, then a checkpoint round trip.

Runs what docs/python.md tells a user to run, with Debian's pip and every
build requirement from Debian (no build isolation, no index):

    MEMENTO_CMAKE_BUILD_DIR=<this build tree> \
        python3 -m pip install --no-build-isolation --no-index --no-deps --target SITE ./python

The build tree is reused as it is configured (only the target _memento is
built, which is already up to date), so the test takes seconds; the build of
the extension in a fresh directory of its own (MEMENTO_CMAKE_BUILD_DIR unset)
compiles the library and is not run here. Then a python3 started outside the
checkout and the build tree, with only SITE on its path, imports the
installed package and snapshots and restores a model through a real agent.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_util  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.dirname(HERE)
REPO = os.path.dirname(PY)

agent_util.require_torch()
if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
    print("SKIP: pip is not installed for", sys.executable, "(apt-get install python3-pip)")
    sys.exit(agent_util.SKIP)

build_dir = os.environ.get("MEMENTO_TEST_BUILD_DIR")
if not build_dir:
    raise SystemExit("FAIL: MEMENTO_TEST_BUILD_DIR (the build tree) is not set")
with open(os.path.join(REPO, "CMakeLists.txt")) as f:
    version = re.search(r"project\(memento VERSION ([0-9.]+)", f.read()).group(1)

# setuptools builds in place: python/build and python/memento.egg-info
# (ignored by git); removed afterwards when this test made them.
leftovers = [p for p in (os.path.join(PY, "build"), os.path.join(PY, "memento.egg-info"))
             if not os.path.exists(p)]

ROUND_TRIP = textwrap.dedent("""
    import os, sys
    import torch
    import memento, memento.torch
    site = sys.argv[1]
    assert memento.__file__.startswith(site), memento.__file__
    assert memento._memento.__file__.startswith(site), memento._memento.__file__
    assert memento.__version__ == sys.argv[4], memento.__version__
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ckpt = memento.torch.Checkpointer(model=model, optimizer=opt, job_id=sys.argv[2],
                                      agent_dir=sys.argv[3])
    for step in range(3):
        model(torch.randn(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
        ckpt.snapshot(step)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt.close()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ckpt = memento.torch.Checkpointer(model=model, optimizer=opt, job_id=sys.argv[2],
                                      agent_dir=sys.argv[3])
    assert ckpt.restore() == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    try:
        memento.Client.connect(sys.argv[2] + "-nobody", agent_dir=sys.argv[3])
        raise SystemExit("connect to another job's agent did not fail")
    except memento.Error as e:
        assert e.code == "NotFound", e.code
    ckpt.close()
    print("round trip ok from", memento.__file__)
""")

tmp = agent_util.tmpdir("pip-")
try:
    site = os.path.join(tmp, "site")
    env = dict(os.environ, MEMENTO_CMAKE_BUILD_DIR=build_dir, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INPUT="1", PIP_ROOT_USER_ACTION="ignore")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--no-deps", "--no-cache-dir", "--target", site, PY],
                       cwd=tmp, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"FAIL: pip install exited {r.returncode}")
    files = sorted(os.listdir(os.path.join(site, "memento")))
    for want in ("__init__.py", "torch.py", "durable.py"):
        assert want in files, (want, files)
    assert any(f.startswith("_memento") and f.endswith(".so") for f in files), files
    assert os.path.isdir(os.path.join(site, f"memento-{version}.dist-info")), os.listdir(site)
    print(f"PASS: pip installed memento {version} into {site}: {files}")

    # A bad build directory is a clear error that names it.
    bad = os.path.join(tmp, "not-a-build")
    os.makedirs(bad)
    with open(os.path.join(bad, "CMakeCache.txt"), "w") as f:
        f.write("CMAKE_BUILD_TYPE:STRING=Release\n")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--no-deps", "--no-cache-dir", "--target", os.path.join(tmp, "site2"), PY],
                       cwd=tmp, env=dict(env, MEMENTO_CMAKE_BUILD_DIR=bad), capture_output=True,
                       text=True)
    assert r.returncode != 0, r.stdout
    assert f"MEMENTO_CMAKE_BUILD_DIR={bad} has no Python package configured" in r.stdout + r.stderr, \
        (r.stdout + r.stderr)[-2000:]
    print("PASS: a build directory without the Python package is refused, naming it")

    outside = os.path.join(tmp, "elsewhere")
    os.makedirs(outside)
    with agent_util.Agent("pypip") as agent:
        run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEMENTO_RUN_DIR")}
        run_env["PYTHONPATH"] = site
        r = subprocess.run([sys.executable, "-c", ROUND_TRIP, site, agent.job, agent.root, version],
                           cwd=outside, env=run_env, capture_output=True, text=True, timeout=180)
    print(r.stdout, r.stderr[-3000:])
    if r.returncode != 0:
        raise SystemExit(f"FAIL: the round trip with the installed package exited {r.returncode}")
    assert "round trip ok from " + site in r.stdout
    print("PASS: the installed package snapshots and restores through a real agent")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
