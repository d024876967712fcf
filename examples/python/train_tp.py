"""The seeds' training example: a tensor-parallel model fine-tuned with the Trainer.

    tprun --nproc-per-node 2 python3 examples/python/train_tp.py MODEL_DIR train.txt OUT_DIR
"""
import sys

import tp

model_dir, data, output_dir = sys.argv[1:4]

distributed_config = tp.DistributedConfig(tp_size=None)  # every rank of the job
model = tp.AutoModelForCausalLM.from_pretrained(
    model_dir,
    dtype="float32",
    distributed_config=distributed_config,
    training=True,
)
tokenizer = tp.AutoTokenizer.from_pretrained(model_dir)

args = tp.TrainingArguments(
    output_dir=output_dir,
    max_steps=6,
    per_device_train_batch_size=4,
    learning_rate=3e-3,
    logging_steps=2,
    save_strategy="no",
    disable_tqdm=True,
)
trainer = tp.Trainer(model=model, args=args, train_dataset=tp.TokenBlocks.from_files(data, tokenizer, seq_len=16))
result = trainer.train()
trainer.save_model()
if model.tp_rank == 0:
    print(f"{result.global_step} steps, mean loss {result.training_loss:.4f}, saved to {output_dir}")
