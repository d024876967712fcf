"""The seeds' inference example, with tp in place of torch and Transformers.

    tprun --nproc-per-node 2 python3 examples/python/demo.py MODEL_DIR
"""
import sys

import numpy as np

import tp

model_dir = sys.argv[1] if len(sys.argv) > 1 else "models/llama"

distributed_config = tp.DistributedConfig(tp_size=int(sys.argv[2]) if len(sys.argv) > 2 else None)
model = tp.AutoModelForCausalLM.from_pretrained(
    model_dir,
    dtype="bfloat16",
    distributed_config=distributed_config,
)
if model.tp_rank == 0:
    print(model.tp_plan)

tokenizer = tp.AutoTokenizer.from_pretrained(model_dir)
prompt = "Can I help"
inputs = tokenizer(prompt, return_tensors="np").input_ids

# distributed run
outputs = model(inputs)
next_token = int(np.argmax(outputs.logits[0, -1]))
generated = model.generate(inputs, max_new_tokens=8)
if model.tp_rank == 0:
    print(f"tp_size {model.tp_size}: next token {next_token}")
    print(prompt + tokenizer.decode(generated[0, inputs.shape[1]:], skip_special_tokens=True))
