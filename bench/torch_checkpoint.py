"""Pieces the PyTorch baselines share (bench/training/torch_train_step.py,
bench/models/torch_inference.py): a Hugging Face checkpoint read slice by slice
(config.json + model.safetensors or a sharded index; struct + json +
torch.frombuffer, no transformers library), its config.json and the contiguous split of a
dimension over tensor-parallel ranks."""
import json
import math
import os
import struct

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


class Checkpoint:
    """The tensors of a model directory (model.safetensors or a sharded index), read on
    demand: a slice of rows reads only those rows' bytes."""

    def __init__(self, model_dir):
        self.entries = {}
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            files = sorted(set(json.load(open(index))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for fn in files:
            path = os.path.join(model_dir, fn)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                begin, end = e["data_offsets"]
                self.entries[name] = (path, DTYPES[e["dtype"]], list(e["shape"]), 8 + n + begin, end - begin)

    def __contains__(self, name):
        return name in self.entries

    def get(self, name, dim=None, start=0, stop=None, dtype=torch.float32):
        """A contiguous `dtype` copy of `name`, or of [start, stop) along `dim`."""
        path, stored, shape, offset, nbytes = self.entries[name]
        numel = math.prod(shape)
        if numel * torch.tensor([], dtype=stored).element_size() != nbytes:
            raise SystemExit(f"{path}: {name}: byte size does not match dtype and shape")
        with open(path, "rb") as f:
            if dim == 0:        # contiguous rows: read only them
                row = nbytes // shape[0]
                f.seek(offset + start * row)
                raw = bytearray(f.read((stop - start) * row))
                t = torch.frombuffer(raw, dtype=stored).reshape([stop - start] + shape[1:])
            else:
                f.seek(offset)
                raw = bytearray(f.read(nbytes))
                t = torch.frombuffer(raw, dtype=stored).reshape(shape)
                if dim is not None:
                    t = t.narrow(dim, start, stop - start)
        out = torch.empty(t.shape, dtype=dtype)
        out.copy_(t)
        return out


def read_config(model_dir):
    """config.json of a Llama-family model the baselines implement (llama, mistral, qwen3; no biases)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    mt = cfg["model_type"]
    if mt not in ("llama", "mistral", "qwen3"):
        raise SystemExit(f"model_type {mt} not supported (llama, mistral, qwen3)")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("attention_bias / mlp_bias not supported")
    return cfg


def split_range(n, parts, r):
    """[start, stop) of part r of n split into `parts` contiguous, near-equal pieces."""
    base, rem = divmod(n, parts)
    start = r * base + min(r, rem)
    return start, start + base + (1 if r < rem else 0)
