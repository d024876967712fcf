"""Trainer and TrainingArguments with Transformers' argument names."""
import os

from . import _tp


class TrainingArguments(_tp.TrainingArguments):
    """TrainingArguments(output_dir=..., max_steps=..., learning_rate=..., bf16=..., ...).

    Every argument is Transformers' name; an unknown one is a TypeError naming it.
    """

    def __init__(self, output_dir="trainer_output", **kwargs):
        super().__init__()
        self.output_dir = os.fspath(output_dir)
        for name, value in kwargs.items():
            if name.startswith("_") or not hasattr(_tp.TrainingArguments, name):
                raise TypeError(f"TrainingArguments got an unexpected keyword argument '{name}'")
            setattr(self, name, value)
        self.validate()


class Trainer:
    """Trainer(model=..., args=..., train_dataset=tp.TokenBlocks, eval_dataset=None).

    The model must be loaded with from_pretrained(..., training=True).
    """

    def __init__(self, model, args, train_dataset, eval_dataset=None):
        if not isinstance(train_dataset, _tp.TokenBlocks):
            raise TypeError("train_dataset must be a tp.TokenBlocks (TokenBlocks.from_files(files, tokenizer, "
                            f"seq_len=...)), got {type(train_dataset).__name__}")
        self.model = model
        self.args = args
        self._trainer = _tp.Trainer(model._model, args, train_dataset, eval_dataset)

    def train(self, resume_from_checkpoint=None):
        if resume_from_checkpoint is True:
            resume_from_checkpoint = "last"
        return self._trainer.train(os.fspath(resume_from_checkpoint) if resume_from_checkpoint else "")

    def evaluate(self):
        return self._trainer.evaluate()

    def save_model(self, output_dir=None):
        self._trainer.save_model(os.fspath(output_dir) if output_dir else "")

    @property
    def state(self):
        """trainer_state.json's fields as a dict (global_step, log_history, ...)."""
        return self._trainer.state


class TokenBlocks:
    """Training data: text files tokenized and cut into blocks of seq_len tokens."""

    @staticmethod
    def from_files(files, tokenizer, seq_len=1024, sample_by="line"):
        """Plain text (one sample per line, paragraph or document) or .jsonl with a "text" field."""
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        return _tp.TokenBlocks.from_files([os.fspath(f) for f in files], getattr(tokenizer, "_tokenizer", tokenizer),
                                          seq_len, sample_by)

    @staticmethod
    def from_tokens(tokens, seq_len):
        return _tp.TokenBlocks.from_tokens([int(t) for t in tokens], seq_len)
