#!/usr/bin/env python3
"""Independent reader for memento's durable tier, standard library only.

Usage: read_safetensors.py ROOT

Parses every node file of every complete version under ROOT as a plain
safetensors file (8-byte little-endian header length, JSON header, raw bytes),
checks the container rules, checks index.json against the headers, and
compares every piece listed in ROOT/expected.json (written by the C++ helper
from the bytes it persisted) with the bytes found through the header.
Exit status 0 when everything matches, 1 otherwise (each problem is printed).
"""
import json
import os
import struct
import sys

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U8": 1, "BOOL": 1}


def parse_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} exceeds file size {len(blob)}")
    header_text = blob[8:8 + n].decode("utf-8")
    if not header_text.startswith("{"):
        raise ValueError(f"{path}: header does not start with '{{'")
    header = json.loads(header_text)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    for k, v in meta.items():
        if not isinstance(v, str):
            raise ValueError(f"{path}: metadata {k} is not a string")
    spans = []
    tensors = {}
    for key, t in header.items():
        dtype, shape, (b, e) = t["dtype"], t["shape"], t["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPE_SIZE[dtype] != e - b:
            raise ValueError(f"{path}: {key}: {dtype}{shape} needs {numel * DTYPE_SIZE[dtype]} "
                             f"bytes, offsets give {e - b}")
        spans.append((b, e, key))
        tensors[key] = data[b:e]
    spans.sort()
    pos = 0
    for b, e, key in spans:
        if b != pos:
            raise ValueError(f"{path}: {key} starts at {b}, expected {pos}")
        pos = e
    if pos != len(data):
        raise ValueError(f"{path}: tensors cover {pos} bytes, data region has {len(data)}")
    return 8 + n, header, tensors, meta


def main(root):
    problems = []
    versions = sorted(d for d in os.listdir(root) if d.startswith("version-"))
    complete = [d for d in versions if os.path.exists(os.path.join(root, d, "COMMIT"))]
    if not complete:
        print(f"{root}: no complete version")
        return 1
    checked = 0
    for vd in complete:
        vdir = os.path.join(root, vd)
        with open(os.path.join(vdir, "index.json")) as f:
            index = json.load(f)
        files = {}
        for node in index["nodes"]:
            path = os.path.join(vdir, node["file"])
            try:
                files[node["file"]] = parse_safetensors(path)
            except (ValueError, KeyError, UnicodeDecodeError) as e:
                problems.append(str(e))
                continue
            if os.path.getsize(path) != node["file_size"]:
                problems.append(f"{path}: size differs from index.json")
            if files[node["file"]][3].get("format") != "memento":
                problems.append(f"{path}: metadata format is not 'memento'")
        located = {}
        for name, t in index["tensors"].items():
            for p in t["pieces"]:
                if p["file"] not in files:
                    continue
                start, header, tensors, _ = files[p["file"]]
                if p["key"] not in header:
                    problems.append(f"{vd}: piece {p['key']} missing from {p['file']}")
                    continue
                b, e = header[p["key"]]["data_offsets"]
                if start + b != p["file_offset"] or e - b != p["length"]:
                    problems.append(f"{vd}: piece {p['key']} at {start + b}+{e - b} in the "
                                    f"header, {p['file_offset']}+{p['length']} in the index")
                located[(name, p["tensor_offset"], p["node"])] = (tensors[p["key"]], t["dtype"])
        expected_path = os.path.join(root, "expected.json")
        if vd == complete[0] and os.path.exists(expected_path):
            with open(expected_path) as f:
                expected = json.load(f)
            for e in expected:
                key = (e["name"], e["tensor_offset"], e["node"])
                if key not in located:
                    problems.append(f"{vd}: no piece for {key}")
                    continue
                got, dtype = located[key]
                with open(os.path.join(root, e["bin"]), "rb") as f:
                    want = f.read()
                if dtype != e["dtype"]:
                    problems.append(f"{vd}: {key}: dtype {dtype}, expected {e['dtype']}")
                if got != want:
                    first = next((i for i in range(min(len(got), len(want)))
                                  if got[i] != want[i]), min(len(got), len(want)))
                    problems.append(f"{vd}: {key}: bytes differ from what memento was given "
                                    f"(first difference at byte {first})")
                checked += 1
    for p in problems:
        print("PROBLEM:", p)
    print(f"{len(complete)} complete version(s), {checked} expected piece(s) compared, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
