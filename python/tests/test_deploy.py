"""The deployment recipes of docs/deploy.md, run as far as one machine allows.

    test_deploy.py slurm       deploy/slurm/memento-torch.sbatch run by bash with
                               a stub `srun` (one local process per node, with
                               SLURM_NODEID) and `scontrol`; the real `memento
                               run` and torchrun (2 nodes x 1 worker, DDP over
                               Gloo). The first submission stops after step 2
                               (preempted); the requeued one (same job id)
                               restores step 2 on both nodes and finishes.
    test_deploy.py systemd     deploy/systemd/memento-agent@.service checked by
                               `systemd-analyze verify`, its ExecStart expanded
                               as systemd does (%i, ${VAR}, $VAR) and run: the
                               example trains against that agent, the agent
                               stops cleanly on SIGTERM, a new one adopts the
                               slots.
    test_deploy.py kubernetes  deploy/kubernetes/memento-torch.yaml parsed
                               (YAML), its structure checked (Indexed Job,
                               native sidecar agent, emptyDir medium Memory
                               with sizeLimit, one uid, node index and pod IP
                               from the downward API), then each pod's agent
                               command, startup probe and trainer command run
                               locally with $(VAR) expanded as Kubernetes does.

What is replaced, and why, is printed; nothing else of the recipes is changed.
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_util  # noqa: E402

agent_util.require_torch()

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(REPO, "examples", "torch", "train.py")
MEMENTO = os.path.abspath(agent_util.memento_bin())


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_slots(root):
    r = subprocess.run([MEMENTO, "inspect", "--tier", "memory", "--json", root],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"memento inspect --tier memory {root}: {r.stderr}")
    return json.loads(r.stdout)["slots"]


def newest_step(root, rank):
    steps = [s["step"] for s in memory_slots(root) if s["rank"] == rank and s["intact"]]
    return max(steps) if steps else None


def base_env():
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    for k in ("MEMENTO_JOB_ID", "MEMENTO_RUN_DIR", "MEMENTO_AGENT_PID"):
        env.pop(k, None)
    return env


# ---- Slurm --------------------------------------------------------------------
SRUN = r"""#!/bin/bash
# stub srun: runs the command once per node of the allocation, locally, in parallel
echo "srun $*" >> "$STUB_LOG"
while [ $# -gt 0 ]; do
  case "$1" in
    --*=*) shift ;;
    -*) shift 2 ;;
    *) break ;;
  esac
done
pids=()
for ((n = 0; n < SLURM_NNODES; n++)); do
  SLURM_NODEID=$n SLURM_PROCID=$n SLURM_LOCALID=0 "$@" > "$STUB_DIR/node$n.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
SCONTROL = r"""#!/bin/bash
# stub scontrol: `show hostnames LIST` gives one loopback address per node,
# a line at a time (as a slow scontrol would: a reader that stops early gets it killed by SIGPIPE)
[ "$1 $2" = "show hostnames" ] || { echo "stub scontrol: unsupported: $*" >&2; exit 2; }
for ((n = 0; n < SLURM_NNODES; n++)); do echo 127.0.0.1; sleep 0.2; done
"""


def slurm(work):
    stub = os.path.join(work, "bin")
    os.makedirs(stub)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        path = os.path.join(stub, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    job_id = str(400000 + os.getpid())
    job = f"slurm-{job_id}"
    roots = [f"/dev/shm/memento/{job}/node{n}" for n in range(2)]
    script = os.path.join(REPO, "deploy", "slurm", "memento-torch.sbatch")
    try:
        for attempt, args in ((0, "--preset tiny --steps 6 --stop-after 2"), (1, "--preset tiny --steps 6")):
            logs = os.path.join(work, f"submission{attempt}")
            os.makedirs(logs)
            env = base_env()
            env.update(PATH=stub + os.pathsep + env["PATH"], STUB_DIR=logs,
                       STUB_LOG=os.path.join(work, "srun.calls"), SLURM_JOB_ID=job_id,
                       SLURM_NNODES="2", SLURM_JOB_NODELIST="node[01-02]", MEMENTO=MEMENTO,
                       TRAIN_SCRIPT=TRAIN, TRAIN_ARGS=args, NPROC_PER_NODE="1",
                       MASTER_PORT=str(free_port()), MAX_RESTARTS="1")
            print(f"submission {attempt}: TRAIN_ARGS={args!r} (the recipe's defaults: --preset small "
                  "--steps 200, 2 workers per node)", flush=True)
            r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=240)
            outs = []
            for n in range(2):
                with open(os.path.join(logs, f"node{n}.log")) as f:
                    outs.append(f.read())
            if r.returncode != 0:
                fail(f"the batch script exited {r.returncode}: {r.stdout}{r.stderr}\n" +
                     "\n".join(o[-3000:] for o in outs))
            for n, out in enumerate(outs):
                if "started agent pid" not in out or f"in {roots[n]}" not in out:
                    fail(f"node {n}: memento run did not start an agent in {roots[n]}:\n{out[-3000:]}")
                want = (f"rank {n} attempt 0: restored None, starting at step 0" if attempt == 0 else
                        f"rank {n} attempt 0: restored 2, starting at step 3")
                if want not in out:
                    fail(f"submission {attempt}, node {n}: no '{want}':\n{out[-3000:]}")
                step = newest_step(roots[n], n)
                if step != (2 if attempt == 0 else 5):
                    fail(f"submission {attempt}: node {n}'s agent holds step {step} for rank {n}")
                print(f"  node {n}: {want}; its slots hold step {step}")
            for n, out in enumerate(outs):
                pid = int(re.search(r"started agent pid (\d+)", out).group(1))
                try:
                    os.kill(pid, 0)
                    fail(f"node {n}: the agent (pid {pid}) still runs after the batch script ended")
                except ProcessLookupError:
                    pass
        with open(os.path.join(work, "srun.calls")) as f:
            calls = f.read()
        if calls.count("--ntasks-per-node=1") != 2:
            fail(f"srun was not called with --ntasks-per-node=1 once per submission: {calls}")
        print("PASS: the Slurm script runs one agent per node; a requeued job resumes from the slots")
    finally:
        shutil.rmtree(f"/dev/shm/memento/{job}", ignore_errors=True)


# ---- systemd --------------------------------------------------------------------
def systemd_exec_start(unit_text, instance, env_file):
    """ExecStart= as systemd runs it: specifiers, Environment=/EnvironmentFile=, ${VAR}, $VAR."""
    env, exec_start = {}, None
    spec = {"%i": instance, "%I": instance, "%%": "%"}

    def specifiers(s):
        return re.sub(r"%[iI%]", lambda m: spec[m.group(0)], s)

    for line in unit_text.splitlines():
        line = line.strip()
        if line.startswith("Environment="):
            for item in shlex.split(specifiers(line[len("Environment="):])):
                k, _, v = item.partition("=")
                env[k] = v
        elif line.startswith("EnvironmentFile="):
            path = specifiers(line[len("EnvironmentFile="):]).lstrip("-")
            if path != env_file[0]:
                fail(f"EnvironmentFile= is {path}, the test expected {env_file[0]}")
            if os.path.exists(env_file[1]):
                with open(env_file[1]) as f:
                    for item in f.read().splitlines():
                        if item and not item.startswith("#"):
                            k, _, v = item.partition("=")
                            env[k] = v.strip().strip('"')
        elif line.startswith("ExecStart="):
            exec_start = specifiers(line[len("ExecStart="):])
    if exec_start is None:
        fail("the unit has no ExecStart=")
    argv = []
    for word in shlex.split(exec_start):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):  # $VAR: split on whitespace
            argv.extend(env.get(word[1:], "").split())
        else:  # ${VAR}: one word
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def systemd(work):
    src = os.path.join(REPO, "deploy", "systemd", "memento-agent@.service")
    with open(src) as f:
        unit = f.read()
    job = f"sd{os.getpid()}"
    # The test's two replacements: the installed binary and /etc/memento.
    unit = unit.replace("/usr/local/bin/memento", MEMENTO).replace("/etc/memento/", work + "/etc/")
    print(f"replaced /usr/local/bin/memento by {MEMENTO} and /etc/memento by {work}/etc", flush=True)
    unit_path = os.path.join(work, f"memento-agent@{job}.service")
    with open(unit_path, "w") as f:
        f.write(unit)
    if shutil.which("systemd-analyze"):
        r = subprocess.run(["systemd-analyze", "verify", unit_path], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"systemd-analyze verify: {r.stdout}{r.stderr}")
        print("systemd-analyze verify: clean")
    else:
        print("systemd-analyze not installed: the unit's syntax is not checked here")
    os.makedirs(os.path.join(work, "etc"))
    env_file = os.path.join(work, "etc", f"{job}.env")
    with open(env_file, "w") as f:
        f.write("MEMENTO_NODE=0\nMEMENTO_AGENT_ARGS=--scrub-rate 0 --verify-on-complete\n")
    argv = systemd_exec_start(unit, job, (os.path.join(work, "etc", f"{job}.env"), env_file))
    root = f"/dev/shm/memento/{job}/node0"
    want = [MEMENTO, "agent", "--job", job, "--node", "0", "--root", root, "--scrub-rate", "0",
            "--verify-on-complete"]
    if argv != want:
        fail(f"ExecStart expands to {argv}, expected {want}")
    print("ExecStart:", " ".join(argv))
    try:
        for start in range(2):
            agent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = agent.stdout.readline()
            if "ready" not in line:
                agent.kill()
                fail(f"the unit's agent did not start: {line!r} {agent.stderr.read()}")
            if start == 0:
                env = base_env()
                env.update(MEMENTO_JOB_ID=job, MEMENTO_RUN_DIR=root)
                r = subprocess.run([sys.executable, TRAIN, "--preset", "tiny", "--steps", "3"], env=env,
                                   capture_output=True, text=True, timeout=180)
                if r.returncode != 0 or "restored None" not in r.stdout:
                    fail(f"training against the unit's agent: rc {r.returncode}\n{r.stdout}{r.stderr[-3000:]}")
            step = newest_step(root, 0)
            agent.send_signal(signal.SIGTERM)  # KillSignal=SIGTERM
            rc = agent.wait(60)
            agent.stdout.close()
            agent.stderr.close()
            if rc != 0:
                fail(f"the agent exited {rc} on SIGTERM (systemd counts only 0 as a clean stop)")
            if step != 2:
                fail(f"start {start}: the agent holds step {step}, expected 2")
            print(f"start {start}: the agent holds step 2 of rank 0 and stopped cleanly on SIGTERM")
        print("PASS: the systemd unit's command serves a training job; a restarted unit adopts its slots")
    finally:
        shutil.rmtree(f"/dev/shm/memento/{job}", ignore_errors=True)


# ---- Kubernetes -------------------------------------------------------------------
def k8s_expand(s, env):
    """$(VAR) as Kubernetes expands it in command, args and env values; $$ escapes."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


def container_env(container, downward):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = k8s_expand(str(e["value"]), env)
        else:
            env[e["name"]] = downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def kubernetes(work):
    import yaml

    path = os.path.join(REPO, "deploy", "kubernetes", "memento-torch.yaml")
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    kinds = {d["kind"]: d for d in docs}
    if sorted(kinds) != ["Job", "Service"]:
        fail(f"{path} holds {sorted(kinds)}, expected a Job and a Service")
    job, svc = kinds["Job"], kinds["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    checks = {
        "Indexed Job": spec.get("completionMode") == "Indexed",
        "a pod per node": spec["completions"] == spec["parallelism"] == 2,
        "headless Service selecting the job's pods":
            svc["spec"].get("clusterIP") == "None" and svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
            and pod.get("subdomain") == svc["metadata"]["name"],
        "one uid for every container": pod["securityContext"].get("runAsUser") is not None and all(
            "runAsUser" not in c.get("securityContext", {}) for c in pod["initContainers"] + pod["containers"]),
    }
    agent = next(c for c in pod["initContainers"] if c["name"] == "memento-agent")
    trainer = next(c for c in pod["containers"] if c["name"] == "trainer")
    vols = {v["name"]: v for v in pod["volumes"]}
    mem = vols["memento"].get("emptyDir", {})
    checks["native sidecar (restartPolicy: Always)"] = agent.get("restartPolicy") == "Always"
    checks["emptyDir medium: Memory with a sizeLimit"] = mem.get("medium") == "Memory" and "sizeLimit" in mem
    checks["agent and trainer mount it at one path"] = (
        [m["mountPath"] for m in agent["volumeMounts"] if m["name"] == "memento"] ==
        [m["mountPath"] for m in trainer["volumeMounts"] if m["name"] == "memento"])
    fields = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in agent["env"]}
    checks["pod IP from the downward API"] = fields.get("POD_IP") == "status.podIP"
    checks["node index from the completion index"] = (
        fields.get("NODE_INDEX") == "metadata.annotations['batch.kubernetes.io/job-completion-index']")
    for what, ok in checks.items():
        print(f"  {what}: {'yes' if ok else 'NO'}")
    if not all(checks.values()):
        fail(f"{path}: the structure checks above failed")

    mount = agent["volumeMounts"][0]["mountPath"]
    host = f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    port = str(free_port())
    shrink = {"small": "tiny", "200": "5", "2": "1"}  # --preset, --steps, --nproc_per_node values

    def localize(argv, pod_dir, trainer_cmd):
        out = []
        for i, a in enumerate(argv):
            a = a.replace(mount, pod_dir).replace("/opt/memento", REPO)
            if a == "memento":
                a = MEMENTO
            elif a == host:
                a = "127.0.0.1"
            elif trainer_cmd and i > 0 and argv[i - 1] == "--master_port":
                a = port
            elif trainer_cmd and i > 0 and argv[i - 1] in ("--preset", "--steps", "--nproc_per_node"):
                a = shrink.get(a, a)
            out.append(a)
        return out

    print(f"replaced: {mount} by a directory per pod, /opt/memento by {REPO}, memento by {MEMENTO}, "
          f"{host} by 127.0.0.1, port 29500 by {port}, --preset small/--steps 200/--nproc_per_node 2 "
          "by tiny/5/1", flush=True)
    agents, trainers = [], []
    try:
        for index in range(2):
            pod_dir = os.path.join(work, f"pod{index}", "memento")
            os.makedirs(pod_dir)
            downward = {"status.podIP": f"127.0.0.{index + 1}",
                        "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)}
            aenv = container_env(agent, downward)
            argv = localize([k8s_expand(a, aenv) for a in agent["command"] + agent.get("args", [])],
                            pod_dir, False)
            print(f"pod {index} agent:", " ".join(argv), flush=True)
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(base_env(), **aenv))
            agents.append(p)
            if "ready" not in p.stdout.readline():
                fail(f"pod {index}: the agent did not start: {p.stderr.read()}")
            probe = localize(agent["startupProbe"]["exec"]["command"], pod_dir, False)
            r = subprocess.run(probe, env=dict(base_env(), **aenv))
            if r.returncode != 0:
                fail(f"pod {index}: the startup probe {probe} failed with the agent up")
            tenv = container_env(trainer, downward)
            tenv = {k: v.replace(mount, pod_dir) for k, v in tenv.items()}
            targv = localize([k8s_expand(a, tenv) for a in trainer["command"] + trainer.get("args", [])],
                             pod_dir, True)
            print(f"pod {index} trainer:", " ".join(targv), f"(MEMENTO_RUN_DIR={tenv['MEMENTO_RUN_DIR']})",
                  flush=True)
            log = open(os.path.join(work, f"pod{index}.log"), "w")
            trainers.append((subprocess.Popen(targv, env=dict(base_env(), **tenv), stdout=log,
                                              stderr=subprocess.STDOUT), log, tenv["MEMENTO_RUN_DIR"]))
        for index, (t, log, root) in enumerate(trainers):
            rc = t.wait(240)
            log.close()
            with open(log.name) as f:
                out = f.read()
            if rc != 0:
                fail(f"pod {index}: the trainer exited {rc}:\n{out[-3000:]}")
            step = newest_step(root, index)
            if f"rank {index} attempt 0: restored None" not in out or step != 4:
                fail(f"pod {index}: trained against its agent? newest step {step}\n{out[-3000:]}")
            print(f"pod {index}: rank {index} trained 5 steps; its sidecar holds step {step}")
        for index, p in enumerate(agents):
            p.send_signal(signal.SIGTERM)
            if p.wait(60) != 0:
                fail(f"pod {index}: the agent exited {p.returncode} on SIGTERM")
        print("PASS: the manifest's commands run a 2-pod job against sidecar agents")
    finally:
        for p in agents:
            if p.poll() is None:
                p.kill()
                p.wait()
        for t, log, _ in trainers:
            if t.poll() is None:
                t.kill()
                t.wait()


def main():
    scenario = sys.argv[1]
    if scenario == "kubernetes":
        try:
            import yaml  # noqa: F401
        except ImportError:
            print("SKIP: python3-yaml is not installed")
            sys.exit(agent_util.SKIP)
    work = agent_util.tmpdir(f"deploy-{scenario}-")
    try:
        {"slurm": slurm, "systemd": systemd, "kubernetes": kubernetes}[scenario](work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
