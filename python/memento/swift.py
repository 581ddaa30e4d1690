"""memento.swift: SWIFT's recovery building blocks for a PyTorch trainer.

    from memento.swift import UpdateUndo, MessageLog

    undo = UpdateUndo(opt)               # wraps opt.step(): keeps what undo() needs
    ...
    loss.backward()
    opt.step()                           # may fail half-way (a peer lost mid-step)
    ...
    undo.undo()                          # the pre-step bytes, bit for bit

    log = MessageLog(rank=stage)         # upstream backup of inter-stage traffic
    log.sent((step, mb, stage, stage + 1, "act"), activations)
    log.received((step, mb, stage - 1, stage, "act"), inputs)  # a checksum only
    ...
    x = replay.input((step, mb, stage - 1, stage, "act"))       # checked
    replay.check_output((step, mb, stage, stage + 1, "act"), y)  # replay diverged?

UpdateUndo makes an optimizer step undoable: before the wrapped step() writes
anything it copies the bytes the step may change (every parameter of the
optimizer's param_groups, every tensor of their optimizer state, the
non-tensor state and the param_groups' hyper-parameters); undo() writes them
back in place (same tensors, same data_ptr, so a memento.torch.Checkpointer
registration stays valid) and removes optimizer state the step created.
An algebraic inverse of AdamW does not return the same bytes in floating
point (docs/swift.md, `undo_log_test` `AlgebraicInverseIsNotBitExact`), so
the pre-update values are kept. commit() drops them once the step is known
applied everywhere.

MessageLog is the sender-side log of SWIFT's logging-based recovery: each
stage keeps what it sent to its neighbours under a key (step, micro-batch,
sender, receiver, kind), with a checksum, and only the checksums of what it
received; a replacement stage replays from its neighbours' logs, reads its
inputs with input() (a corrupted entry is memento.Error DataLoss) and checks
each recomputed output with check_output() (a difference is
memento.Error FailedPrecondition: the computation was not deterministic).
save()/load() move a log through a file (e.g. on tmpfs, which outlives the
process); truncate(step) drops the steps a committed snapshot covers.

Everything here is pure PyTorch on the caller's thread; nothing talks to the
agent. docs/python.md, "memento.swift".
"""

import copy
import hashlib
import os
import pickle
import types

import torch

from memento._memento import raise_status

__all__ = ["UpdateUndo", "MessageLog", "tensor_checksum"]


def tensor_checksum(tensor):
    """A 64-bit BLAKE2b digest of a tensor's dtype, shape and bytes (hex)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    h = hashlib.blake2b(digest_size=8)
    h.update(str(t.dtype).encode())
    h.update(repr(tuple(t.shape)).encode())
    # Through a byte view: numpy has no bfloat16.
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class UpdateUndo:
    """Bit-exact undo of the last optimizer step (SWIFT update-undo).

    ``UpdateUndo(optimizer)`` wraps ``optimizer.step`` (an instance attribute,
    like memento.torch.Checkpointer's fence; either may wrap first). Each
    call first saves the bytes the step may change, then runs the step; a
    step that raises half-way leaves its saved bytes, so undo() repairs a
    half-applied update too.

    ``before_undo``: called before undo() writes (pass a Checkpointer's
    ``fence`` so that a running snapshot copy finishes first).
    ``wrap=False``: call ``begin()`` yourself right before each step.
    """

    def __init__(self, optimizer, *, before_undo=None, wrap=True):
        self.optimizer = optimizer
        self._before_undo = before_undo
        self._saved = None
        self.steps_begun = 0
        if wrap:
            self._wrap(optimizer)

    def _wrap(self, optimizer):
        inner = optimizer.step
        undo = self
        if getattr(inner, "_with_counter", False):
            # An LR scheduler's wrapper (it checks its marker): keep it.
            def counted_step(*args, **kwargs):
                undo.begin()
                return inner(*args, **kwargs)

            counted_step._with_counter = True
            optimizer.step = counted_step
            return

        def step(self_opt, *args, **kwargs):
            undo.begin()
            return inner(*args, **kwargs)

        optimizer.step = types.MethodType(step, optimizer)

    def _params(self):
        seen = set()
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def begin(self):
        """Saves what undo() needs; the wrapped step() calls it."""
        params = list(self._params())
        saved_params = [p.detach().clone() for p in params]
        state = {}
        for i, p in enumerate(params):
            if p not in self.optimizer.state:
                continue
            entry = {}
            for k, v in self.optimizer.state[p].items():
                entry[k] = v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v)
            state[i] = entry
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                  for g in self.optimizer.param_groups]
        self._saved = (params, saved_params, state, groups)
        self.steps_begun += 1

    @property
    def can_undo(self):
        """Whether a step's saved bytes are held (begun, neither undone nor committed)."""
        return self._saved is not None

    def saved_bytes(self):
        """Bytes held for undo() (0 when none)."""
        if self._saved is None:
            return 0
        _, saved_params, state, _ = self._saved
        n = sum(t.numel() * t.element_size() for t in saved_params)
        for entry in state.values():
            n += sum(v.numel() * v.element_size() for v in entry.values() if torch.is_tensor(v))
        return n

    def commit(self):
        """Drops the saved bytes (the step is applied for good)."""
        self._saved = None

    def undo(self):
        """Writes the pre-step bytes back in place; raises FailedPrecondition
        when no step is held (none begun, or already undone or committed)."""
        if self._saved is None:
            raise_status("FailedPrecondition",
                         "undo: no optimizer step to undo (none begun since the last undo or "
                         "commit)")
        if self._before_undo is not None:
            self._before_undo()
        params, saved_params, state, groups = self._saved
        opt_state = self.optimizer.state
        with torch.no_grad():
            for i, (p, old) in enumerate(zip(params, saved_params)):
                p.copy_(old)
                if i not in state:
                    opt_state.pop(p, None)  # created by the undone step
                    continue
                entry = opt_state[p]
                for k in list(entry.keys()):
                    if k not in state[i]:
                        del entry[k]
                for k, v in state[i].items():
                    cur = entry.get(k)
                    if (torch.is_tensor(v) and torch.is_tensor(cur) and cur.shape == v.shape
                            and cur.dtype == v.dtype):
                        cur.copy_(v)  # in place: registrations by address stay valid
                    else:
                        entry[k] = v.clone() if torch.is_tensor(v) else copy.deepcopy(v)
        for g, old in zip(self.optimizer.param_groups, groups):
            for k in list(g.keys()):
                if k != "params" and k not in old:
                    del g[k]
            g.update(copy.deepcopy(old))
        self._saved = None


class MessageLog:
    """Sender-side log of a pipeline stage's messages (SWIFT upstream backup).

    A key is a tuple ``(step, micro_batch, sender, receiver, kind)`` (kind: a
    short string such as "act" or "grad"). ``sent()`` keeps a copy of the
    tensor and its checksum; ``received()`` keeps only the checksum (a
    replayed stage's recomputed outputs are checked against the receipts its
    neighbours kept).
    """

    def __init__(self, rank=0):
        self.rank = rank
        self._sent = {}       # key -> (tensor copy, checksum)
        self._received = {}   # key -> checksum

    @staticmethod
    def _key(key):
        if not (isinstance(key, tuple) and len(key) == 5):
            raise_status("InvalidArgument",
                         f"message key {key!r}: expected (step, micro_batch, sender, receiver, "
                         f"kind)")
        return (int(key[0]), int(key[1]), int(key[2]), int(key[3]), str(key[4]))

    def sent(self, key, tensor):
        """Logs a tensor this stage sent (a copy: the caller may reuse it)."""
        k = self._key(key)
        t = tensor.detach().to("cpu", copy=True).contiguous()
        self._sent[k] = (t, tensor_checksum(t))

    def received(self, key, tensor):
        """Logs the checksum of a tensor this stage received."""
        self._received[self._key(key)] = tensor_checksum(tensor)

    def input(self, key):
        """The logged tensor sent under `key`, checked against its checksum
        (NotFound when not logged, DataLoss when it fails its checksum)."""
        k = self._key(key)
        if k not in self._sent:
            raise_status("NotFound", f"message log of rank {self.rank}: nothing sent under {k}")
        t, want = self._sent[k]
        if tensor_checksum(t) != want:
            raise_status("DataLoss", f"message log of rank {self.rank}: {k} fails its checksum")
        return t.clone()

    def check_output(self, key, tensor):
        """Checks a replayed stage's recomputed output against the receipt
        kept here (NotFound without one; FailedPrecondition when it differs:
        the replay diverged)."""
        k = self._key(key)
        if k not in self._received:
            raise_status("NotFound", f"message log of rank {self.rank}: no receipt of {k}")
        if tensor_checksum(tensor) != self._received[k]:
            raise_status("FailedPrecondition",
                         f"replay diverged: the recomputed {k} differs from the one sent before "
                         f"(nondeterministic stage?)")

    def steps(self):
        """The steps with a logged message or receipt, ascending."""
        return sorted({k[0] for k in self._sent} | {k[0] for k in self._received})

    def bytes(self):
        """Bytes of logged tensors."""
        return sum(t.numel() * t.element_size() for t, _ in self._sent.values())

    def truncate(self, step):
        """Drops everything of steps <= `step` (a snapshot of `step` committed)."""
        self._sent = {k: v for k, v in self._sent.items() if k[0] > step}
        self._received = {k: v for k, v in self._received.items() if k[0] > step}

    def save(self, path):
        """Writes the log to `path` atomically (write, fsync, rename)."""
        tmp = f"{path}.tmp.{os.getpid()}"
        payload = {"rank": self.rank,
                   "sent": {k: (t.reshape(-1).view(torch.uint8).numpy().tobytes(), str(t.dtype),
                                tuple(t.shape), c)
                            for k, (t, c) in self._sent.items()},
                   "received": dict(self._received)}
        with open(tmp, "wb") as f:
            pickle.dump(payload, f, protocol=4)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path):
        """Reads a log save() wrote; entries are checked when input() reads them."""
        with open(path, "rb") as f:
            payload = pickle.load(f)
        log = cls(payload["rank"])
        for k, (raw, dtype, shape, c) in payload["sent"].items():
            dt = getattr(torch, dtype.split(".")[-1])
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else \
                torch.empty(0, dtype=torch.uint8)
            log._sent[k] = (t.view(dt).reshape(shape), c)
        log._received = dict(payload["received"])
        return log
