#!/usr/bin/python3
"""Makes a tiny MoE checkpoint route unevenly, in place (f32 model.safetensors):
embedding column 0 += 10 gives every token's hidden state one large common
component, so every router sends every token to the same few experts (in
each layer one expert gets all tokens and most get none); on top, in the first
MoE layer router row BIG reads that component with +3 and rows NONE with -3. Other router
weights on component 0 are zeroed and the rest scaled by 10, so the logits of
different experts stay apart (no ties) and the probabilities far above f32's
underflow. reference_forward.py prints and checks the resulting loads.

  skew_router.py MODEL_DIR ROUTER_KEY_FORMAT BIG NONE[,NONE...]   (format: "{}" for the layer)
"""
import array
import json
import struct
import sys


def main():
    model_dir, key, big, none = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")]
    path = model_dir + "/model.safetensors"
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])

    def view(name):
        e = header[name]
        assert e["dtype"] == "F32", f"{name} is {e['dtype']}; skew_router.py edits f32 checkpoints"
        begin, end = e["data_offsets"]
        return 8 + n + begin, e["shape"], array.array("f", bytes(data[8 + n + begin:8 + n + end]))

    def store(at, values):
        raw = values.tobytes()
        data[at:at + len(raw)] = raw

    at, (vocab, hidden), emb = view("model.embed_tokens.weight")
    for v in range(vocab):
        emb[v * hidden] += 10.0
    store(at, emb)
    layers = [i for i in range(len(header)) if key.format(i) in header]  # dense layers have no router
    for layer in layers:
        at, (experts, hidden), gate = view(key.format(layer))
        for e in range(experts):
            gate[e * hidden] = 0.0
            for j in range(1, hidden):
                gate[e * hidden + j] *= 10.0
        if layer == layers[0]:
            for e, value in [(big, 3.0)] + [(e, -3.0) for e in none]:
                gate[e * hidden] = value
        store(at, gate)
    with open(path, "wb") as f:
        f.write(data)
    print(f"{path}: routers of layers {layers} skewed")


if __name__ == "__main__":
    main()
