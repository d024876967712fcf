#!/usr/bin/python3
"""Draws the biases of a tiny f32 checkpoint, in place: every tensor whose name
ends with SUFFIX gets N(0, 0.1) values (random.Random(0), in file order).
make-model writes biases as zeros, as Transformers initialises them, which would
let a model that drops them pass.

  fill_biases.py MODEL_DIR SUFFIX      (e.g. ".mlp.down_proj.bias"; "bias": all)
"""
import array
import json
import random
import struct
import sys


def main():
    model_dir, suffix = sys.argv[1], sys.argv[2]
    path = model_dir + "/model.safetensors"
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    rng = random.Random(0)
    names = [k for k in header if k != "__metadata__" and k.endswith(suffix)]
    for name in names:
        e = header[name]
        assert e["dtype"] == "F32", f"{name} is {e['dtype']}; fill_biases.py edits f32 checkpoints"
        begin, end = e["data_offsets"]
        values = array.array("f", [rng.gauss(0.0, 0.1) for _ in range((end - begin) // 4)])
        data[8 + n + begin:8 + n + end] = values.tobytes()
    assert names, f"{path}: no tensor ends with {suffix!r}"
    with open(path, "wb") as f:
        f.write(data)
    print(f"{path}: {len(names)} tensors ending with {suffix!r} drawn from N(0, 0.1)")


if __name__ == "__main__":
    main()
