#!/usr/bin/python3
"""Wraps a tiny gemma3_text checkpoint as Gemma3ForConditionalGeneration stores one
(model_type "gemma3", the text config under text_config, the dtype and token ids at
the top), the same language model under another prefix, plus a vision tower and a
projector tp must leave unread:

  make_gemma3_vlm.py TEXT_DIR OUT_DIR hub   # language_model.model.* (Google's Hub files)
  make_gemma3_vlm.py TEXT_DIR OUT_DIR v5    # model.language_model.* (Transformers >= 4.52's saves)
"""
import json
import os
import struct
import sys


def main():
    text_dir, out_dir, layout = sys.argv[1:4]
    prefix = {"hub": "language_model.model.", "v5": "model.language_model."}[layout]
    text = json.load(open(os.path.join(text_dir, "config.json")))
    top = {k: text.pop(k) for k in ("torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id") if k in text}
    # The Hub's text_config lists what differs from Gemma3TextConfig's defaults: drop what equals them.
    for key in ("architectures", "rope_theta", "rms_norm_eps", "hidden_activation"):
        text.pop(key, None)
    config = dict(top, architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", text_config=text,
                  vision_config={"model_type": "siglip_vision_model", "hidden_size": 8, "image_size": 16,
                                 "patch_size": 8},
                  mm_tokens_per_image=4, image_token_index=512)
    with open(os.path.join(text_dir, "model.safetensors"), "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    out, blobs, offset = {}, [], 0
    extra = {"vision_tower.vision_model.embeddings.patch_embedding.weight": [8, 3, 8, 8],
             "multi_modal_projector.mm_input_projection_weight": [8, text["hidden_size"]]}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        new = prefix + name[len("model."):] if name.startswith("model.") else "language_model." + name
        out[new] = dict(e, data_offsets=[offset, offset + end - begin])
        blobs.append(body[begin:end])
        offset += end - begin
    for name, shape in extra.items():
        size = 4 * shape[0] * shape[1] * (shape[2] * shape[3] if len(shape) == 4 else 1)
        out[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(bytes(size))
        offset += size
    out["__metadata__"] = {"format": "pt"}
    h = json.dumps(out).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{out_dir}: gemma3 ({layout}: {prefix}*) around {text_dir}")


if __name__ == "__main__":
    main()
