"""Durable versions as torch tensors: memento.load_durable (docs/python.md)."""

import json
import os
import struct
import tempfile

_DTYPES = {
    "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
    "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64",
    "BOOL": "bool",
}


def read_safetensors(path):
    """Returns {name: torch.Tensor} from one safetensors file (standard library + torch)."""
    import torch

    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (hlen,) = struct.unpack("<Q", raw)
        size = os.fstat(f.fileno()).st_size
        if hlen > size - 8:
            raise ValueError(f"{path}: header length {hlen} exceeds the file ({size} bytes)")
        header = json.loads(f.read(hlen))
        data = bytearray(f.read())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}' has unknown dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor '{name}' data_offsets {begin}..{end} outside the "
                             f"data ({len(data)} bytes)")
        if end > begin:
            t = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin)
        else:
            t = torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(getattr(torch, dtype)).reshape(info["shape"]).clone()
    return out


def load_durable(path, step=None, rank=0, prefix=None):
    """Returns {name: torch.Tensor} of a durable version, for load_state_dict().

    ``path`` is the durable tier's directory (the agent's --durable-dir): the
    version ``step`` (the newest complete one when None) of rank ``rank`` is
    read, whole tensors assembled and every piece checked against its
    checksum (the same code as ``memento export``). ``path`` may also be a
    safetensors file that ``memento export`` wrote.

    Names are those the memento.torch Checkpointer registered
    ("model/<key>", "optimizer/state/0/exp_avg", ...). With ``prefix`` (e.g.
    "model/") only those names are returned, without the prefix and without
    DistributedDataParallel's "module.": ``model.load_state_dict(
    memento.load_durable(dir, prefix="model/"))``.
    """
    from memento import _memento

    if os.path.isdir(path):
        with tempfile.TemporaryDirectory(prefix="memento-load-") as tmp:
            out = os.path.join(tmp, "version.safetensors")
            _memento.export_safetensors(path, out, step=step, rank=rank)
            tensors = read_safetensors(out)
    else:
        if step is not None:
            raise ValueError(f"{path} is a file: step applies to a durable directory only")
        tensors = read_safetensors(path)
    if prefix is None:
        return tensors
    out = {}
    for name, t in tensors.items():
        if name.startswith(prefix):
            key = name[len(prefix):]
            if key.startswith("module."):
                key = key[len("module."):]
            out[key] = t
    return out
