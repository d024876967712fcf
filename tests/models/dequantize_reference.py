#!/usr/bin/env python3
"""An independent numpy dequantization of quantized Hugging Face checkpoints, written from the formats'
published math and none of tp's code, to check that what `tp quantize` writes is what the formats' own code reads:

  GPTQ (GPTQModel / AutoGPTQ): qweight int32 [K/pf, N], value j of a word at bits j*bits along K; qzeros int32
    [G, N/pf] along N, holding z - 1 in checkpoint_format "gptq" (v1), z in "gptq_v2"; scales fp16 [G, N];
    g_idx [K]. W[n, k] = scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n]).
  AWQ GEMM (AutoAWQ WQLinear_GEMM): qweight int32 [K, N/8] along N, slot i of a word holding column
    (0, 2, 4, 6, 1, 3, 5, 7)[i] of its 8; qzeros [G, N/8] alike; scales [G, N]; group of k = k // group_size.
  compressed-tensors pack-quantized (pack_to_int32): weight_packed int32 [N, ceil(K/pf)] along K, value j at bits
    j*bits, stored as the signed value + 2^(bits-1); weight_zero_point (asymmetric) int32 [ceil(N/pf), G] packed
    the same way along N; weight_scale [N, G]. W = (q_signed - zp_signed) * scale.

usage: dequantize_reference.py QUANTIZED_DIR OUT_DIR [--original DIR]
Writes OUT_DIR: config.json without quantization_config, the tokenizer files, and an f32 model.safetensors with
every quantized Linear as <module>.weight. With --original, every dequantized weight must lie within half its
group's scale of the original weight (round-to-nearest's bound); the script fails naming the tensor otherwise.
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BF16": np.uint16}
SIDE_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "chat_template.jinja"]


def read_safetensors(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    names = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def unpack(words, bits, axis):
    """Each int32 word's 32/bits values (value j at bits j*bits), laid out along `axis` in place of the word."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    shifts = np.arange(32 // bits, dtype=np.int64) * bits
    vals = (np.expand_dims(u, axis + 1) >> shifts.reshape([-1 if d == axis + 1 else 1 for d in range(u.ndim + 1)]))
    vals &= (1 << bits) - 1
    shape = list(u.shape)
    shape[axis] *= 32 // bits
    return vals.reshape(shape)


def gptq(t, m, q):
    bits = q["bits"]
    codes = unpack(t[m + ".qweight"], bits, 0)  # [K, N]
    zeros = unpack(t[m + ".qzeros"], bits, 1)  # [G, N]
    if q.get("checkpoint_format", "gptq") == "gptq":
        zeros = zeros + 1
    K = codes.shape[0]
    g = q["group_size"] if q["group_size"] != -1 else K
    g_idx = t[m + ".g_idx"].astype(np.int64) if m + ".g_idx" in t else np.arange(K) // g
    scales = t[m + ".scales"].astype(np.float32)[g_idx]  # [K, N]
    w = scales * (codes - zeros[g_idx]).astype(np.float32)
    return w.T, scales.T


def awq(t, m, q):
    slots = unpack(t[m + ".qweight"], 4, 1)  # [K, N] in slot order within each 8
    zslots = unpack(t[m + ".qzeros"], 4, 1)
    column_slot = np.array([0, 4, 1, 5, 2, 6, 3, 7])  # where column j of each 8 sits
    index = (np.arange(slots.shape[1]) // 8) * 8 + column_slot[np.arange(slots.shape[1]) % 8]
    codes, zeros = slots[:, index], zslots[:, index]
    K = codes.shape[0]
    g = q.get("group_size", q.get("q_group_size"))
    grp = np.arange(K) // (K if g == -1 else g)
    scales = t[m + ".scales"].astype(np.float32)[grp]
    w = scales * (codes - zeros[grp]).astype(np.float32)
    return w.T, scales.T


def compressed_tensors(t, m, q):
    wq = next(iter(q["config_groups"].values()))["weights"]
    bits, offset = wq["num_bits"], 1 << (wq["num_bits"] - 1)
    N, K = (int(v) for v in t[m + ".weight_shape"])
    signed = unpack(t[m + ".weight_packed"], bits, 1)[:, :K] - offset
    zp = np.zeros(t[m + ".weight_scale"].shape, dtype=np.int64)
    if not wq["symmetric"]:
        zp = unpack(t[m + ".weight_zero_point"], bits, 0)[:N] - offset
    g = K if wq["strategy"] == "channel" else wq["group_size"]
    grp = np.arange(K) // g
    scales = t[m + ".weight_scale"].astype(np.float32)[:, grp]
    return scales * (signed - zp[:, grp]).astype(np.float32), scales


def main():
    args = sys.argv[1:]
    original = None
    if "--original" in args:
        i = args.index("--original")
        original = read_safetensors(Path(args[i + 1]) / "model.safetensors")
        del args[i:i + 2]
    src, out = Path(args[0]), Path(args[1])
    config = json.loads((src / "config.json").read_text())
    q = config.pop("quantization_config")
    method = q["quant_method"]
    tensors = read_safetensors(src / "model.safetensors")
    packed = ".weight_packed" if method == "compressed-tensors" else ".qweight"
    dequantize = {"gptq": gptq, "awq": awq, "compressed-tensors": compressed_tensors}[method]
    result, count = {}, 0
    for name, a in tensors.items():
        if name.endswith(packed):
            m = name[:-len(packed)]
            w, scales = dequantize(tensors, m, q)
            result[m + ".weight"] = np.ascontiguousarray(w, dtype=np.float32)
            count += 1
            if original is not None:
                # A tied model's lm_head, quantized (tp quantize --lm-head), is its embedding's weight.
                tied = m == "lm_head" and m + ".weight" not in original
                ref = original["model.embed_tokens.weight" if tied else m + ".weight"].astype(np.float32)
                err = np.abs(ref - w)
                bound = scales / 2 * (1 + 1e-5) + 1e-7
                if w.shape != ref.shape or (err > bound).any():
                    at = np.unravel_index(np.argmax(err - bound), err.shape)
                    sys.exit(f"{src}: {m}.weight at {tuple(int(i) for i in at)}: dequantized {w[at]} vs original "
                             f"{ref[at]}, more than half the scale {scales[at]} apart")
        elif not any(name.endswith(s) for s in (".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point",
                                                 ".weight_shape")):
            result[name] = a.astype(np.float32) if a.dtype.kind == "f" else a
    if count == 0:
        sys.exit(f"{src}: no quantized tensor ({packed}) found")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for f in SIDE_FILES:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    write_safetensors(out / "model.safetensors", result)
    print(f"{src.name}: {count} {method} linears dequantized into {out}")


if __name__ == "__main__":
    main()
