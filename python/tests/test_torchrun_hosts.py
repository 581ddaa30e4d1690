"""torchrun across "hosts" (issue 18): one host lost, a replacement joins, bit-identical.

Each host is a Linux network namespace on this machine (a bridge in the root
namespace, a veth into each host, as launch::NodeNetwork makes them) with its
own UTS namespace (hostname host<i>) and its own /etc/hosts naming every host
(bind-mounted inside the host's mount namespace; /etc is not written), its own
shared-memory root and its own

    memento run --node i --agent-arg=--store=etcd://<bridge>:<port> ... -- \\
        python3 -m torch.distributed.run --nnodes 3 --nproc_per_node 1 \\
        --rdzv_backend c10d --rdzv_endpoint host0:<port> --max_restarts 2 ... \\
        examples/torch/train.py

A real etcd listens on the bridge. The agents run in cluster mode: each
publishes the job's topology (`--topology`, replicate: every rank's state is
also held by another host), one of them is elected recovery leader and
coordinates the commits (`--recovery-leader auto --coordinate-commits`).

The hostnames matter to torchrun: its c10d rendezvous orders the hosts by
hostname (so host<i> is group rank i in every round, and its slots hold rank
i's state), and the group-rank-0 host publishes its hostname as MASTER_ADDR
for the workers' Gloo group.

The story: every rank waits before step K (a gate file; the commits settle:
step K-1, or an older one when a rank skipped a snapshot); host V (not host0, which hosts the rendezvous, and not the
recovery leader) is lost: every process in its namespace SIGKILLed, its root
removed. The gate opens: the other hosts' workers fail on the dead Gloo peer
and their torchruns go back to the rendezvous. A replacement host V (same
namespace and hostname, empty root) starts `memento run` + torchrun again;
the agents' leader rebuilds V's state from its peers; the rendezvous
completes and every worker restores from its agent's restore target (the
agent answers once the recovery is done), the same committed step on every
rank; the job runs to the end. DDP with --ddp-fixed-buckets in both runs
(docs/deploy.md: with 3 ranks a restarted worker's rebuilt buckets change
the order of the all-reduce's sums otherwise). Every rank's final parameters, AdamW state, scheduler,
data position and RNG must equal a failure-free run of the same
configuration (torchrun across the same hosts, without memento) byte for
byte.

Needs root, iproute2's `ip`, util-linux's `unshare`, etcd and torch; exits 77
(skipped) naming what is missing otherwise.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_util  # noqa: E402

agent_util.require_torch()

from test_torchrun import compare  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRAIN = os.path.join(REPO, "examples", "torch", "train.py")
MEMENTO = os.path.abspath(agent_util.memento_bin())
PYTHON = "/usr/bin/python3"  # Debian's python3 has torch and torchrun
HOSTS = 3
STEPS = 10
GATE_STEP = 5  # every rank waits before this step; step GATE_STEP - 1 is committed first


def fail(msg):
    raise SystemExit("FAIL: " + msg)


def skip(why):
    print("SKIP:", why)
    sys.exit(agent_util.SKIP)


def preflight():
    if os.geteuid() != 0:
        skip("not root (the hosts are network namespaces)")
    for tool in ("ip", "unshare", "mount", "etcd"):
        if shutil.which(tool) is None:
            skip(f"no `{tool}` on PATH")
    r = subprocess.run([PYTHON, "-c", "import torch.distributed.run"], capture_output=True, text=True)
    if r.returncode != 0:
        skip(f"{PYTHON} cannot import torch.distributed.run: {r.stderr.strip()[-300:]}")


def ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Hosts:
    """A bridge and one network namespace per host (launch::NodeNetwork's layout)."""

    def __init__(self, n, work):
        self.n = n
        self.tag = "%06x" % random.randrange(1 << 24)
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        out += subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
        for _ in range(1000):
            a, b = 16 + random.randrange(224), random.randrange(256)
            self.prefix = f"10.{a}.{b}."
            if self.prefix not in out:
                break
        self.bridge = "tb" + self.tag
        self.made = []
        self.names = [f"host{i}" for i in range(n)]
        self.hosts_file = os.path.join(work, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for i in range(n):
                f.write(f"{self.address(i)} {self.names[i]}\n")
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            self.made.append(("link", self.bridge))
            ip("addr", "add", self.bridge_address() + "/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i in range(n):
                ns, hv, nv = self.namespace(i), f"tv{self.tag}n{i}", f"tp{self.tag}n{i}"
                ip("netns", "add", ns)
                self.made.append(("netns", ns))
                ip("link", "add", hv, "type", "veth", "peer", "name", nv)
                ip("link", "set", nv, "netns", ns)
                ip("link", "set", hv, "master", self.bridge)
                ip("link", "set", hv, "up")
                ip("-n", ns, "addr", "add", self.address(i) + "/24", "dev", nv)
                ip("-n", ns, "link", "set", nv, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except RuntimeError as e:
            self.teardown()
            skip(f"cannot create a network namespace: {e}")

    def bridge_address(self):
        return self.prefix + "1"

    def address(self, i):
        return self.prefix + str(10 + i)

    def namespace(self, i):
        return f"tn{self.tag}n{i}"

    def exec_prefix(self, i):
        # ip netns exec gives the command its own mount namespace: the hosts
        # file is bind-mounted there only. unshare --uts: its own hostname.
        return ["ip", "netns", "exec", self.namespace(i), "unshare", "--uts", "sh", "-c",
                'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"', "sh",
                self.hosts_file, self.names[i]]

    def kill(self, i):
        """SIGKILLs every process in host i's namespace."""
        for _ in range(100):
            pids = subprocess.run(["ip", "netns", "pids", self.namespace(i)], capture_output=True,
                                  text=True).stdout.split()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        fail(f"processes of host {i} survive SIGKILL")

    def teardown(self):
        for kind, name in reversed(self.made):
            if kind == "netns":
                for i in range(self.n):
                    if self.namespace(i) == name:
                        self.kill(i)
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self.made = []


def free_port(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class Etcd:
    """A real single-member etcd listening on the bridge."""

    def __init__(self, work, address):
        for _ in range(3):
            self.port, peer = free_port(address), free_port(address)
            client, peer_url = f"http://{address}:{self.port}", f"http://{address}:{peer}"
            self.log = os.path.join(work, "etcd.log")
            self.proc = subprocess.Popen(
                ["etcd", "--name=memento", "--data-dir=" + os.path.join(work, "etcd-data"),
                 "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                 "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
                 "--initial-cluster=memento=" + peer_url, "--heartbeat-interval=10",
                 "--election-timeout=100", "--log-level=warn", "--logger=zap"],
                stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(client + "/health", timeout=1) as r:
                        if json.load(r).get("health") == "true":
                            self.url = f"etcd://{address}:{self.port}"
                            return
                except OSError:
                    pass
                time.sleep(0.1)
            self.stop()
            shutil.rmtree(os.path.join(work, "etcd-data"), ignore_errors=True)
        with open(self.log) as f:
            fail("etcd did not start on the bridge:\n" + f.read()[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Job:
    def __init__(self, work, hosts, etcd):
        self.work, self.hosts, self.etcd = work, hosts, etcd
        self.job = f"hosts{os.getpid()}"
        self.token = os.path.join(work, "token")
        with open(self.token, "w") as f:
            f.write("torchrun-hosts-test-token-%032x\n" % random.randrange(1 << 128))
        os.chmod(self.token, 0o600)
        self.topology = json.dumps({"dp": HOSTS, "tp": 1, "pp": 1, "zero": 0,
                                    "rank_node": list(range(HOSTS)), "policy": "replicate"})
        self.procs = {}
        self.incarnation = 0

    def root(self, i):
        return f"/dev/shm/memento-test-{self.job}-host{i}"

    def torchrun(self, run_id, port, train_args):
        return [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(HOSTS), "--nproc_per_node", "1",
                "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{self.hosts.names[0]}:{port}",
                "--rdzv_id", run_id, "--max_restarts", "2", "--redirects", "2", "--tee", "2",
                TRAIN, "--preset", "tiny", "--steps", str(STEPS), "--ddp-fixed-buckets", *train_args]

    def start(self, i, cmd, tag):
        self.incarnation += 1
        log = os.path.join(self.work, f"{tag}.host{i}.{self.incarnation}.log")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.procs[i] = (subprocess.Popen(self.hosts.exec_prefix(i) + cmd, stdout=open(log, "w"),
                                          stderr=subprocess.STDOUT, env=env), log)

    def with_memento(self, i, torchrun):
        a = lambda s: "--agent-arg=" + s  # noqa: E731
        agent_log = os.path.join(self.work, f"agent.host{i}.{self.incarnation + 1}.log")
        return [MEMENTO, "run", "--job", self.job, "--node", str(i), "--root", self.root(i),
                "--agent-log", agent_log, "--durable-drain-s", "0", a("--store=" + self.etcd.url), a("--token-file=" + self.token),
                a(f"--listen={self.hosts.address(i)}:0"), a("--lease-ttl=1"), a("--hold-timeout=5"),
                a("--recovery-leader=auto"), a("--recovery-timeout=120"), a("--coordinate-commits"),
                a("--topology=" + self.topology), "--", *torchrun]

    def logs(self, tail=2500):
        out = ""
        for name in sorted(os.listdir(self.work)):
            if name.endswith(".log"):
                with open(os.path.join(self.work, name), errors="replace") as f:
                    out += f"---- {name}\n{f.read()[-tail:]}\n"
        return out

    def wait_all(self, timeout):
        deadline = time.monotonic() + timeout
        for i, (p, log) in sorted(self.procs.items()):
            try:
                rc = p.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                fail(f"host {i} did not finish within {timeout} s\n" + self.logs())
            if rc != 0:
                fail(f"host {i} exited {rc}\n" + self.logs())

    def memento_json(self, *args):
        r = subprocess.run([MEMENTO, *args, "--store", self.etcd.url, "--job", self.job,
                            "--token-file", self.token, "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def committed(self):
        j = self.memento_json("store", "status")
        return -1 if j is None or j.get("committed") is None else j["committed"]

    def recovery(self):
        return self.memento_json("recover") or {}

    def check_running(self, what):
        for i, (p, _) in self.procs.items():
            if p.poll() is not None:
                fail(f"host {i} exited {p.returncode} while {what}\n" + self.logs())


def main():
    preflight()
    work = agent_util.tmpdir("torchrun-hosts-")
    hosts = etcd = job = None
    t0 = time.monotonic()
    try:
        hosts = Hosts(HOSTS, work)
        etcd = Etcd(work, hosts.bridge_address())
        job = Job(work, hosts, etcd)
        print(f"hosts: bridge {hosts.bridge} {hosts.bridge_address()}/24, namespaces "
              f"{hosts.namespace(0)}..{HOSTS - 1} ({hosts.address(0)}..), etcd {etcd.url}", flush=True)

        # The failure-free run of the same configuration: torchrun across the
        # same hosts, without memento.
        ref = os.path.join(work, "ref")
        port = 20000 + random.randrange(20000)
        for i in range(HOSTS):
            job.start(i, job.torchrun(f"ref{job.job}", port, ["--no-memento", "--out", ref]), "ref")
        job.wait_all(300)
        print(f"failure-free run done ({time.monotonic() - t0:.1f} s)", flush=True)

        run_dir = os.path.join(work, "run")
        gate = os.path.join(work, "gate")
        train = ["--out", run_dir, "--wait-file", gate, "--wait-step", str(GATE_STEP)]
        port = 20000 + random.randrange(20000)
        job.procs = {}
        for i in range(HOSTS):
            job.start(i, job.with_memento(i, job.torchrun(f"run{job.job}", port, train)), "run")
        # Every rank at the gate; then the commits settle (a snapshot the
        # agents' hold made a rank skip leaves its step uncommitted: the
        # newest committed step is then older, and is what the job restores).
        deadline = time.monotonic() + 240
        while True:
            logs = job.logs(tail=1 << 30)
            at_gate = [r for r in range(HOSTS) if f"rank {r}: waiting for {gate} before step {GATE_STEP}" in logs]
            if len(at_gate) == HOSTS:
                break
            job.check_running(f"waiting for every rank at step {GATE_STEP}")
            if time.monotonic() > deadline:
                fail(f"only ranks {at_gate} reached the gate at step {GATE_STEP}\n" + logs)
            time.sleep(0.2)
        settle = time.monotonic() + 15
        while job.committed() < GATE_STEP - 1 and time.monotonic() < settle:
            time.sleep(0.2)
        committed = job.committed()
        if committed < 0:
            fail("nothing committed before the gate\n" + job.logs())
        leader = job.recovery().get("leader", "")
        if not leader.startswith("node"):
            fail(f"no recovery leader elected: {job.recovery()}\n" + job.logs())
        victim = HOSTS - 1 if leader != f"node{HOSTS - 1}" else 1
        print(f"step {committed} committed on every host ({time.monotonic() - t0:.1f} s); leader "
              f"{leader}; losing host {victim} (host0 hosts torchrun's rendezvous)", flush=True)

        # The host is lost: every process in it, its memory.
        hosts.kill(victim)
        job.procs.pop(victim)[0].wait()
        shutil.rmtree(job.root(victim))
        with open(gate, "w"):
            pass
        deadline = time.monotonic() + 60
        while job.recovery().get("requested", 0) < 1:
            if time.monotonic() > deadline:
                fail("the agents' leader did not request a recovery for the lost host\n" + job.logs())
            time.sleep(0.2)
        print(f"recovery requested ({time.monotonic() - t0:.1f} s); replacement host {victim} "
              "joins with an empty root", flush=True)
        job.start(victim, job.with_memento(victim, job.torchrun(f"run{job.job}", port, train)), "replacement")
        job.wait_all(300)
        print(f"every host finished ({time.monotonic() - t0:.1f} s)", flush=True)

        status = job.recovery().get("status") or {}
        if status.get("state") != "done" or status.get("source") != "memory" or \
                status.get("restore_step") != committed or status.get("trigger") != f"node{victim} lost":
            fail(f"recovery status: {status}\n" + job.logs())
        rebuilt = (status.get("recovery") or {}).get("rebuilt_bytes", 0)
        if rebuilt <= 0:
            fail(f"the recovery rebuilt nothing: {status}")
        print(f"recovery {status['id']}: {status['trigger']}, restore step {committed} from memory, "
              f"{rebuilt} bytes rebuilt by the agents from the peers", flush=True)
        logs = job.logs(tail=1 << 30)
        for rank in range(HOSTS):
            with open(os.path.join(run_dir, f"rank{rank}.json")) as f:
                info = json.load(f)
            # A survivor's torchrun restarts its worker either because the
            # worker failed on the dead peer (restart count 1) or because
            # the replacement waits in the rendezvous (a membership change:
            # torch does not count it, restart count 0).
            restored_line = f"rank {rank} attempt {info['attempt']}: restored {committed}, " \
                            f"starting at step {committed + 1}"
            if info["start"] != committed + 1 or restored_line not in logs:
                fail(f"rank {rank} (host {rank}) resumed {info}, expected '{restored_line}'\n" + logs)
            if rank != victim and f"rank {rank} attempt 0: restored None, starting at step 0" not in logs:
                fail(f"rank {rank}'s first worker did not start from scratch\n" + logs)
            print(f"rank {rank}: {'replacement host' if rank == victim else 'worker restarted by torchrun'}, "
                  f"restored step {committed} (restart count {info['attempt']})")
        compare(ref, run_dir, HOSTS)
        print(f"PASS ({time.monotonic() - t0:.1f} s)")
    finally:
        if job is not None:
            for p, _ in job.procs.values():
                if p.poll() is None:
                    p.kill()
        if hosts is not None:
            hosts.teardown()
        if etcd is not None:
            etcd.stop()
        if job is not None:
            for i in range(HOSTS):
                shutil.rmtree(job.root(i), ignore_errors=True)
        if os.environ.get("MEMENTO_TEST_KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
