#!/usr/bin/env python3
"""The f32 tensors of a safetensors file (plain Python: no numpy), and a command that compares the logits of two
`tp forward` files.

  f32_tensors.py compare A B TOL WHAT    # exits non-zero unless max |A - B| <= TOL x max |A|
"""
import json
import struct
import sys


def read(path):
    """{name: tuple of floats} for every F32 tensor of the file."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    out = {}
    for name, e in json.loads(data[8:8 + n]).items():
        if name == "__metadata__" or e["dtype"] != "F32":
            continue
        b, t = e["data_offsets"]
        out[name] = struct.unpack(f"<{(t - b) // 4}f", data[8 + n + b:8 + n + t])
    return out


def compare(a_path, b_path, tolerance, what):
    a, b = read(a_path)["logits"], read(b_path)["logits"]
    assert len(a) == len(b), (len(a), len(b))
    scale = max(abs(x) for x in a)
    diff = max(abs(x - y) for x, y in zip(a, b))
    if not diff <= tolerance * scale:
        sys.exit(f"{what}: max diff {diff:.3g} over max |logit| {scale:.3g} (tolerance {tolerance})")
    print(f"  {what}: max diff {diff:.3g} (max |logit| {scale:.3g})")


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "compare":
        sys.exit(__doc__)
    compare(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])
