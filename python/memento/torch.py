"""memento.torch: snapshot a PyTorch job's state every step, restore it bit-identically.

    from memento.torch import Checkpointer, RNGState

    ckpt = Checkpointer(model=model, optimizer=opt,
                        extra={"sched": sched, "data": loader, "rng": RNGState()})
    start = ckpt.restore()              # the restored step, or None
    step = 0 if start is None else start + 1
    while step < steps:
        loss = model(next_batch()).sum(); loss.backward()
        opt.step()                      # fenced by the checkpointer's optimizer hook
        opt.zero_grad(); sched.step()
        ckpt.snapshot(step)             # returns at once; the copy overlaps the next step
        step += 1

Every stateful object (anything with state_dict()/load_state_dict(): the
model, the optimizer, an LR scheduler, a data-loader position, RNGState) is
flattened into its state_dict. Its tensors are registered with the C++ client
by address (data_ptr): nothing is copied in Python, the copy engine reads the
tensors' memory directly. Everything else (param_groups, the scheduler, RNG
states, ints) is pickled into one blob at each snapshot().

Registration follows PyTorch:
  * optimizer state that appears only after the first step(): registration
    happens at the first snapshot(), and restore() materialises the state first
    (one step with lr 0 and zero gradients, which leaves the parameters as they
    are bit for bit) when there is a version to load;
  * a tensor re-allocated by the user (new data_ptr, shape or dtype) is found
    at the next snapshot() and the state is registered again;
  * a non-contiguous tensor is refused (memento.Error InvalidArgument naming
    it); so is a dtype the formats do not have (complex);
  * state classes: parameters and optimizer state of a model under
    DistributedDataParallel are "replicated", ZeroRedundancyOptimizer state is
    "dp_sharded", everything else "private"; ``state_classes`` overrides by name
    prefix.

The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK,
TORCHELASTIC_RESTART_COUNT) gives rank, world size and node; MEMENTO_JOB_ID
(set by ``memento run``) or TORCHELASTIC_RUN_ID the job id. docs/python.md.
"""

import io
import os
import pickle
import random
import struct
import time
import types
import warnings

import torch

from memento._memento import Client, Error, raise_status

_DTYPE_NAMES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.bool: "BOOL",
}

BLOB_NAME = "__memento__/pickled"
_HEADER = struct.Struct("<Q")


class _TensorRef:
    """Stands for a registered tensor inside a pickled state_dict skeleton."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (_TensorRef, (self.name,))


class RNGState:
    """The RNG states of torch (CPU and, when used, CUDA), numpy and Python as a stateful object."""

    def state_dict(self):
        d = {"python": random.getstate(), "torch": torch.get_rng_state().numpy().tobytes()}
        try:
            import numpy

            d["numpy"] = numpy.random.get_state()
        except ImportError:
            pass
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            d["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
        return d

    def load_state_dict(self, d):
        random.setstate(d["python"])
        torch.set_rng_state(torch.frombuffer(bytearray(d["torch"]), dtype=torch.uint8))
        if "numpy" in d:
            import numpy

            numpy.random.set_state(d["numpy"])
        if "cuda" in d:
            torch.cuda.set_rng_state_all(
                [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in d["cuda"]])


def torchrun_env():
    """rank, world_size, local_rank, local_world_size, node, restart_count from the environment."""
    def get(name, default):
        v = os.environ.get(name)
        return int(v) if v not in (None, "") else default

    return {
        "rank": get("RANK", 0),
        "world_size": get("WORLD_SIZE", 1),
        "local_rank": get("LOCAL_RANK", 0),
        "local_world_size": get("LOCAL_WORLD_SIZE", 1),
        "node": get("GROUP_RANK", 0),
        "restart_count": get("TORCHELASTIC_RESTART_COUNT", 0),
    }


def default_job_id():
    job = os.environ.get("MEMENTO_JOB_ID")
    if job:
        return job
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    return "torch"


def _is_ddp(model):
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(model, DistributedDataParallel)


def _is_zero(optimizer):
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return False
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def _inner_optimizer(optimizer):
    """The optimizer whose .state holds this rank's tensors (ZeRO wraps one)."""
    return optimizer.optim if _is_zero(optimizer) else optimizer


class Checkpointer:
    """Snapshots registered PyTorch state into the node's memento agent.

    Arguments:
      model, optimizer: the training model (possibly under DDP) and optimizer
        (possibly a ZeroRedundancyOptimizer); registered as "model" and
        "optimizer". The optimizer's step() is wrapped so that it fences the
        running snapshot first (``fence_optimizer=False`` to place fence() by hand).
      extra: {name: stateful object} (scheduler, data-loader position, RNGState, ...).
      job_id, rank, world_size, node, agent_dir: default from the environment
        (torchrun's and ``memento run``'s); agent_dir defaults to the client's
        ($MEMENTO_RUN_DIR or /dev/shm/memento/<job>/node<N>).
      state_classes: {name prefix: "replicated" | "dp_sharded" | "private"}
        overriding the inferred classes (longest prefix wins).
      blob_bytes: capacity of the blob that holds the pickled non-tensor state
        (must be the same when saving and restoring).
      copy_threads, chunk_bytes, copy_priority, schedule: ClientOptions.
    """

    def __init__(self, model=None, optimizer=None, extra=None, *, job_id=None, rank=None,
                 world_size=None, node=None, agent_dir="", state_classes=None,
                 blob_bytes=1 << 20, copy_threads=1, chunk_bytes=4 << 20, copy_priority="idle",
                 schedule="auto", fence_optimizer=True, connect_timeout_s=10.0):
        env = torchrun_env()
        self.job_id = job_id or default_job_id()
        self.rank = env["rank"] if rank is None else rank
        self.world_size = env["world_size"] if world_size is None else world_size
        self.node = env["node"] if node is None else node
        self.restart_count = env["restart_count"]
        self.agent_dir = agent_dir
        self.objects = {}
        if model is not None:
            self.objects["model"] = model
        if optimizer is not None:
            self.objects["optimizer"] = optimizer
        for name, obj in (extra or {}).items():
            if name in self.objects:
                raise ValueError(f"extra object name '{name}' is taken")
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"extra object '{name}' ({type(obj).__name__}) has no "
                                "state_dict()/load_state_dict()")
            self.objects[name] = obj
        self._model = model
        self._optimizer = optimizer
        self._state_classes = dict(state_classes or {})
        self._blob_bytes = int(blob_bytes)
        self._client_args = dict(copy_threads=copy_threads, chunk_bytes=chunk_bytes,
                                 copy_priority=copy_priority, schedule=schedule,
                                 connect_timeout_s=connect_timeout_s)
        self._client = None
        self._sealed = False
        self._signature = None
        self._tensors = {}      # registered name -> tensor (kept alive: the client reads it)
        self._shadows = {}      # staged name -> memento's copy of it
        self._staged = set()
        self._blob = torch.zeros(self._blob_bytes, dtype=torch.uint8)
        self._pending = False   # a snapshot may still be copying
        self._classes = {}      # registered name -> state class
        # The newest snapshot() that the client skipped (the agent's durable
        # hold protected the slot it would overwrite), while the registered
        # state is still that step's: close() takes it again.
        self._skipped_step = None
        self.registrations = 0  # how many times the state was (re-)registered
        self.skipped_versions = []  # why restore() skipped newer versions
        if optimizer is not None and fence_optimizer:
            self._wrap_optimizer_step(optimizer)

    # ---- the optimizer hook ------------------------------------------------
    def _wrap_optimizer_step(self, optimizer):
        inner = optimizer.step
        ckpt = self
        if getattr(inner, "_with_counter", False):
            # An LR scheduler already wrapped step() (it counts the calls and
            # checks its own marker at every scheduler.step()): keep the marker.
            def counted_step(*args, **kwargs):
                ckpt._before_mutation()
                return inner(*args, **kwargs)

            counted_step._with_counter = True
            optimizer.step = counted_step
            return

        def step(self_opt, *args, **kwargs):
            ckpt._before_mutation()
            return inner(*args, **kwargs)

        # A bound method, so that an LR scheduler created later can wrap it again.
        optimizer.step = types.MethodType(step, optimizer)

    # ---- flattening ------------------------------------------------------------
    def _default_class(self, obj_name):
        if obj_name == "model":
            return "replicated" if _is_ddp(self._model) else "private"
        if obj_name == "optimizer":
            if _is_zero(self._optimizer):
                return "dp_sharded"
            return "replicated" if _is_ddp(self._model) else "private"
        return "private"

    def _state_class(self, name, obj_name):
        best = None
        for prefix, cls in self._state_classes.items():
            if name.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
                best = (prefix, cls)
        return best[1] if best else self._default_class(obj_name)

    def _object_state(self, name, obj):
        if name == "optimizer" and _is_zero(obj):
            # Only this rank's shard: the inner optimizer's state_dict
            # (ZeroRedundancyOptimizer.state_dict() would need a consolidate,
            # a gather to one rank), and the outer param_groups, which the LR
            # scheduler changes and step() copies into the inner ones.
            return {"zero_inner": _inner_optimizer(obj).state_dict(),
                    "zero_groups": [{k: v for k, v in g.items() if k != "params"}
                                    for g in obj.param_groups]}
        return obj.state_dict()

    def _flatten(self):
        """(tensors {name: tensor}, classes {name: class}, skeleton {obj: state with _TensorRef})."""
        tensors, classes, skeleton, staged = {}, {}, {}, set()
        by_storage = {}
        # Parameters change only in optimizer.step() (fenced) and optimizer
        # state only inside it: those are read in place. Everything else
        # (buffers, which forward() may update, e.g. BatchNorm statistics, and
        # the tensors of other objects) is staged: copied at snapshot() into a
        # tensor of memento's own, which is what the copy engine reads.
        param_ptrs = set()
        if self._model is not None:
            param_ptrs = {p.data_ptr() for p in self._model.parameters()}

        def walk(value, path, obj_name):
            if isinstance(value, torch.Tensor):
                if value.numel() == 0:
                    return value.detach().cpu().clone()
                name = path
                if not value.is_contiguous():
                    raise_status("InvalidArgument",
                                 f"tensor '{name}' is not contiguous (shape {list(value.shape)}, "
                                 f"stride {list(value.stride())}); memento reads tensors in place, "
                                 "make it contiguous (.contiguous()) in the object that owns it")
                if value.dtype not in _DTYPE_NAMES:
                    raise_status("InvalidArgument",
                                 f"tensor '{name}' has dtype {value.dtype}, which memento does not "
                                 "store (float32/16/64, bfloat16, int8/16/32/64, uint8, bool)")
                if value.device.type not in ("cpu", "cuda"):
                    raise_status("InvalidArgument",
                                 f"tensor '{name}' is on {value.device}; memento takes cpu and cuda tensors")
                key = (value.data_ptr(), value.dtype, tuple(value.shape), value.device)
                if key in by_storage:  # the same memory under two names (tied weights)
                    return _TensorRef(by_storage[key])
                by_storage[key] = name
                tensors[name] = value
                if not (obj_name == "optimizer" or (obj_name == "model" and value.data_ptr() in param_ptrs)):
                    staged.add(name)
                classes[name] = self._state_class(name, obj_name)
                return _TensorRef(name)
            if isinstance(value, dict):
                return _rebuild_mapping(value, {k: walk(v, f"{path}/{k}", obj_name)
                                                for k, v in value.items()})
            if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
                items = [walk(v, f"{path}/{i}", obj_name) for i, v in enumerate(value)]
                return type(value)(items) if isinstance(value, tuple) else items
            return value

        for obj_name, obj in self.objects.items():
            skeleton[obj_name] = walk(self._object_state(obj_name, obj), obj_name, obj_name)
        return tensors, classes, skeleton, staged

    @staticmethod
    def _signature_of(tensors, classes, staged):
        # A staged tensor is read by value: its address may change freely.
        return tuple((n, None if n in staged else t.data_ptr(), t.dtype, tuple(t.shape),
                      str(t.device), classes[n]) for n, t in tensors.items())

    # ---- registration ------------------------------------------------------------
    def _connect(self):
        return Client.connect(self.job_id, rank=self.rank, world_size=self.world_size,
                              agent_dir=self.agent_dir, node=self.node, **self._client_args)

    def _register(self, tensors, classes, staged):
        """(Re-)registers `tensors` (staged ones by their shadow) and the blob with a new client."""
        if self._client is not None:
            self._fence()
            self._client.close()
            self._client = None
        client = self._connect()
        registered = {}
        for name, live in tensors.items():
            if name in staged:
                shadow = self._shadows.get(name)
                if shadow is None or shadow.dtype != live.dtype or shadow.shape != live.shape \
                        or shadow.device != live.device:
                    shadow = self._shadows[name] = torch.empty_like(live, memory_format=torch.contiguous_format)
                registered[name] = shadow
            else:
                registered[name] = live
        self._register_with(client, registered, classes)
        self._client = client
        self._tensors = registered
        self._classes = dict(classes)
        self._staged = set(staged)
        self._signature = self._signature_of(tensors, classes, staged)
        self._sealed = True
        self.registrations += 1

    def _register_with(self, client, registered, classes):
        try:
            for name, t in registered.items():
                client.register_tensor(name, _DTYPE_NAMES[t.dtype], list(t.shape), classes[name],
                                       t.data_ptr(), t.numel() * t.element_size(),
                                       device_type=t.device.type,
                                       device_index=t.device.index or 0)
            client.register_blob(BLOB_NAME, self._blob.data_ptr(), self._blob_bytes)
            client.seal()
        except BaseException:
            client.close()
            raise

    def _write_blob(self, skeleton):
        buf = io.BytesIO()
        buf.write(b"\0" * _HEADER.size)
        pickle.dump(skeleton, buf, protocol=pickle.HIGHEST_PROTOCOL)
        data = buf.getbuffer()
        n = len(data) - _HEADER.size
        if len(data) > self._blob_bytes:
            raise_status("ResourceExhausted",
                         f"the pickled non-tensor state takes {len(data)} bytes, more than "
                         f"blob_bytes={self._blob_bytes}; pass a larger blob_bytes to the "
                         "Checkpointer (the same value when restoring)")
        _HEADER.pack_into(data, 0, n)
        self._blob.numpy()[: len(data)] = memoryview(data).cast("B")

    # ---- the per-step calls ------------------------------------------------------
    def snapshot(self, step):
        """Starts snapshotting every registered object as version `step`; returns at once.

        The tensors must not be written until the next fence() (the optimizer
        hook does it); the non-tensor state is pickled now.
        """
        self._fence()
        tensors, classes, skeleton, staged = self._flatten()
        if self._signature_of(tensors, classes, staged) != self._signature:
            self._register(tensors, classes, staged)
        with torch.no_grad():
            for name in staged:
                self._tensors[name].copy_(tensors[name])
        self._write_blob(skeleton)
        self._skipped_step = None
        self._client.snapshot(int(step))
        self._pending = True
        if self._was_skipped(self._client, int(step)):
            self._pending = False
            self._skipped_step = int(step)

    @staticmethod
    def _was_skipped(client, step):
        # A skipped snapshot sets the stats at once; a taken one only at its fence.
        stats = client.last_snapshot_stats()
        return stats["step"] == step and stats["skipped"]

    def fence(self, timeout_s=None):
        """Waits until the running snapshot is complete in shared memory.

        Call it before anything writes the registered tensors (the optimizer
        hook does, unless ``fence_optimizer=False``)."""
        self._before_mutation()
        self._fence(timeout_s)

    def _before_mutation(self):
        # The registered state is about to change: a skipped snapshot of the
        # old state can no longer be taken again.
        self._skipped_step = None
        self._fence()

    def _fence(self, timeout_s=None):
        if self._pending and self._client is not None:
            self._pending = False
            self._client.fence(timeout_s)

    def versions(self):
        """Versions the agent holds for this rank: [{"step", "intact", "bytes"}], newest first.

        "intact": complete and verified in this node's slots ("committed" is
        the same flag under its old name)."""
        client = self._client or self._connect()
        try:
            return client.versions()
        finally:
            if client is not self._client:
                client.close()

    def last_snapshot_stats(self):
        return self._client.last_snapshot_stats() if self._client else None

    def last_restore_stats(self):
        return self._client.last_restore_stats() if self._client else None

    def close(self, retake_timeout_s=60.0):
        """Fences, makes sure the last snapshot() is taken, and disconnects (the agent keeps the versions).

        A snapshot() skips (returns without copying) when the slot it would
        overwrite holds a version the agent's durable tier is still writing
        (``--durable-hold-max-s``). When the last snapshot() was skipped and
        the registered state has not changed since (no optimizer step(), no
        fence()), close() takes that step again as soon as the hold passes
        (at most ``retake_timeout_s`` seconds), so the final state of a run
        reaches the agent and its durable tier. When it cannot (the time ran
        out; an agent in cluster mode, where a skipped step cannot commit) it
        warns (RuntimeWarning) naming the step.
        """
        if self._client is None:
            return
        try:
            self._fence()
            if self._skipped_step is not None:
                self._retake(self._skipped_step, retake_timeout_s)
        finally:
            self._skipped_step = None
            if self._client is not None:
                self._client.close()
                self._client = None
            self._signature = None

    def _retake(self, step, timeout_s):
        """Takes the skipped snapshot `step` again, from the same registered memory.

        The staged shadows and the blob still hold what snapshot(step) put
        there, and the tensors read in place have not changed (no fence since).
        A new client session may take a step its last session skipped.
        """
        if self._cluster_mode():
            warnings.warn(f"memento: the snapshot of step {step} was skipped (the agent runs in "
                          "cluster mode, where a skipped step cannot commit); the newest saved "
                          "version is an older step", RuntimeWarning, stacklevel=3)
            return
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            self._client.close()
            self._client = None
            client = self._connect()
            self._register_with(client, self._tensors, self._classes)
            self._client = client
            client.snapshot(step)
            if not self._was_skipped(client, step):
                client.fence()
                return
            if time.monotonic() >= deadline:
                warnings.warn(f"memento: the snapshot of step {step} was skipped (the agent's "
                              "durable tier held the slot) and could not be taken again within "
                              f"{timeout_s} s; the newest saved version is an older step",
                              RuntimeWarning, stacklevel=3)
                return
            time.sleep(0.1)

    def _cluster_mode(self):
        root = self.agent_dir or os.environ.get("MEMENTO_RUN_DIR") or \
            f"/dev/shm/memento/{self.job_id}/node{self.node}"
        return os.path.exists(os.path.join(root, "commit.word"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- restore -----------------------------------------------------------------
    def _common_steps(self, steps):
        """The steps every rank holds, newest first (all ranks call this together)."""
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, sorted(steps))
            common = set(gathered[0])
            for g in gathered[1:]:
                common &= set(g)
            return sorted(common, reverse=True)
        return sorted(set(steps), reverse=True)

    def _materialize_optimizer_state(self):
        """Creates the optimizer's state (exp_avg ...) without changing any parameter.

        One step() with zero gradients and lr 0: AdamW's decay multiplies by
        1 - 0 * wd = 1 and its update adds 0 * m / (sqrt(v) + eps) = 0.
        """
        opt = self._optimizer
        if opt is None or len(_inner_optimizer(opt).state) > 0:
            return
        inner = _inner_optimizer(opt)
        groups = list(inner.param_groups) + (list(opt.param_groups) if _is_zero(opt) else [])
        saved_lr = [g["lr"] for g in groups]
        saved_grads = []
        for g in groups:
            g["lr"] = 0.0
        params = [p for g in opt.param_groups for p in g["params"]] if _is_zero(opt) else \
            [p for g in inner.param_groups for p in g["params"]]
        for p in params:
            saved_grads.append(p.grad)
            p.grad = torch.zeros_like(p)
        try:
            # The unwrapped step (no fence: nothing is snapshotting yet).
            type(inner).step(inner) if not _is_zero(opt) else type(opt).step(opt)
        finally:
            for g, lr in zip(groups, saved_lr):
                g["lr"] = lr
            for p, grad in zip(params, saved_grads):
                p.grad = grad

    def restore(self, step=None):
        """Loads the newest version every rank holds (or exactly `step`) into every object, in place.

        Returns the restored step, or None when there is no version (nothing
        is changed then). On a shape or dtype mismatch raises memento.Error
        (InvalidArgument) listing every difference, and nothing is changed.
        Multi-rank jobs (torch.distributed initialised) agree on the step:
        every rank calls restore().

        Cluster mode (the agent runs with --store): without `step` every rank
        loads the step the agent names, the job's restore target (after a
        recovery by the agents, the step it rebuilt; the agent answers once
        a running recovery is done), and None when nothing is committed yet.
        """
        cluster = step is None and self._cluster_mode()
        if cluster:
            # The same step on every rank, chosen by the agents: no
            # agreement between the ranks is needed, and a replacement node's
            # slots may still be empty until the recovery rebuilt them.
            candidates = [None]
        else:
            probe = self._client or self._connect()
            try:
                held = [v["step"] for v in probe.versions() if v["intact"]]
            finally:
                if probe is not self._client:
                    probe.close()
            if step is not None:
                candidates = [int(step)]
            else:
                candidates = self._common_steps(held)
        if not candidates:
            return None
        fresh_optimizer = self._optimizer is not None and len(_inner_optimizer(self._optimizer).state) == 0
        self._materialize_optimizer_state()
        skipped = []
        try:
            tensors, classes, _, staged = self._flatten()
            if self._signature_of(tensors, classes, staged) != self._signature:
                self._register(tensors, classes, staged)
            self._before_mutation()
            for target in candidates:
                error = None
                try:
                    restored = self._client.restore(target)
                except Error as e:
                    # A version that fails its checksums: try the next older one
                    # (on every rank). Anything else is raised as is; so is any
                    # error in cluster mode, where the agents' recovery chose
                    # the step.
                    if e.code != "DataLoss" or step is not None or cluster:
                        raise
                    error = e
                if cluster:
                    if restored is None:  # nothing committed: the job starts over
                        if fresh_optimizer:
                            _inner_optimizer(self._optimizer).state.clear()
                        return None
                    target = restored
                if self._all_ok(error is None):
                    with torch.no_grad():
                        for name in staged:
                            if name.startswith("model/"):
                                tensors[name].copy_(self._tensors[name])
                    self._load_blob()
                    self.skipped_versions = skipped
                    return target
                skipped.append(f"step {target}: " + (str(error) if error else "failed on another rank"))
            raise_status("DataLoss", "no version could be restored on every rank: " + "; ".join(skipped))
        except Error:
            if fresh_optimizer:
                _inner_optimizer(self._optimizer).state.clear()
            raise

    def _all_ok(self, ok):
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            flags = [None] * dist.get_world_size()
            dist.all_gather_object(flags, bool(ok))
            return all(flags)
        return ok

    def _load_blob(self):
        raw = self._blob.numpy()
        (n,) = _HEADER.unpack_from(raw, 0)
        if n == 0 or n > self._blob_bytes - _HEADER.size:
            raise_status("DataLoss", f"the restored blob '{BLOB_NAME}' holds no pickled state (length {n})")
        skeleton = pickle.loads(raw[_HEADER.size: _HEADER.size + n].tobytes())
        for obj_name, obj in self.objects.items():
            if obj_name not in skeleton:
                raise_status("InvalidArgument", f"the restored version has no object '{obj_name}' "
                             f"(it has {sorted(skeleton)})")
            # Staged tensors go to load_state_dict() as copies: the shadows stay memento's.
            state = _fill(skeleton[obj_name], {n: (t.clone() if n in self._staged else t)
                                               for n, t in self._tensors.items()})
            if obj_name == "model":
                continue  # every model tensor was restored in place
            if obj_name == "optimizer":
                if _is_zero(obj):
                    _load_optimizer_in_place(_inner_optimizer(obj), state["zero_inner"])
                    for live, saved in zip(obj.param_groups, state["zero_groups"]):
                        live.update(saved)
                else:
                    _load_optimizer_in_place(obj, state)
                continue
            obj.load_state_dict(state)


def _rebuild_mapping(original, items):
    try:
        out = type(original)()
        out.update(items)
        for attr in ("_metadata",):
            if hasattr(original, attr):
                setattr(out, attr, getattr(original, attr))
        return out
    except TypeError:
        return dict(items)


def _fill(value, tensors):
    if isinstance(value, _TensorRef):
        return tensors[value.name]
    if isinstance(value, dict):
        return _rebuild_mapping(value, {k: _fill(v, tensors) for k, v in value.items()})
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_fill(v, tensors) for v in value)
    return value


def _load_optimizer_in_place(opt, state):
    """The optimizer's tensors are restored in place; this restores the rest.

    Optimizer.load_state_dict() would deep-copy the state (new tensors at new
    addresses), so the non-tensor entries are set directly instead.
    """
    groups = state["param_groups"]
    if len(groups) != len(opt.param_groups):
        raise_status("InvalidArgument", f"the restored optimizer has {len(groups)} param groups, "
                     f"the live one {len(opt.param_groups)}")
    index_to_param = {}
    for saved, live in zip(groups, opt.param_groups):
        if len(saved["params"]) != len(live["params"]):
            raise_status("InvalidArgument", "a restored optimizer param group has "
                         f"{len(saved['params'])} parameters, the live one {len(live['params'])}")
        for i, p in zip(saved["params"], live["params"]):
            index_to_param[i] = p
        for k, v in saved.items():
            if k != "params":
                live[k] = v
    for i, entries in state["state"].items():
        live = opt.state[index_to_param[i]]
        for k, v in entries.items():
            if isinstance(v, torch.Tensor) and isinstance(live.get(k), torch.Tensor) \
                    and live[k].data_ptr() == v.data_ptr():
                continue  # restored in place
            live[k] = v
