"""AutoTokenizer: tokenizer.json encoded and decoded as Transformers' fast tokenizers do."""
import json
import os

import numpy as np

from . import _tp


class BatchEncoding(dict):
    """input_ids and attention_mask, as keys and as attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class PreTrainedTokenizer:
    def __init__(self, tokenizer, name):
        self._tokenizer = tokenizer
        self.name_or_path = name
        self._chat_template = None

    @property
    def pad_token(self):
        """tokenizer_config.json's pad_token, or None."""
        pad = self._tokenizer.pad_token_id
        return None if pad is None else self._tokenizer.id_to_token(pad)

    def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False, return_tensors=None,
                            **kwargs):
        """The model's chat template (tokenizer_config.json or chat_template.jinja) over a list of
        {"role", "content"} messages, as Transformers renders it; tokenize=True gives the ids (the
        template writes the special tokens itself, so none are added). Extra keyword arguments
        (e.g. enable_thinking=False) are template variables."""
        if not isinstance(conversation, (list, tuple)) or not all(isinstance(m, dict) for m in conversation):
            raise ValueError("conversation must be a list of {'role': ..., 'content': ...} dicts")
        if self._chat_template is None:
            self._chat_template = _tp.ChatTemplate.from_model_dir(self.name_or_path)
        text = self._chat_template.apply(json.dumps(list(conversation)), add_generation_prompt, json.dumps(kwargs))
        if not tokenize:
            return text
        ids = self._tokenizer.encode(text, False)
        if return_tensors == "np":
            return np.array([ids], dtype=np.int64)
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; tp returns numpy arrays ('np')")
        return ids

    @property
    def vocab_size(self):
        return self._tokenizer.vocab_size

    def __len__(self):
        return self._tokenizer.vocab_size

    @property
    def bos_token_id(self):
        return self._tokenizer.bos_token_id

    @property
    def eos_token_id(self):
        ids = self._tokenizer.eos_token_ids
        return ids[0] if ids else None

    def encode(self, text, add_special_tokens=True):
        return self._tokenizer.encode(text, add_special_tokens)

    def __call__(self, text, add_special_tokens=True, padding=False, return_tensors=None):
        """text (str or list of str) -> BatchEncoding(input_ids, attention_mask).

        return_tensors="np" gives int64 arrays [batch, seq]; lists of different lengths
        then need padding=True (right-padded with the pad token, mask 0 there).
        """
        if isinstance(text, str):
            ids = [self._tokenizer.encode(text, add_special_tokens)]
        elif isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text):
            ids = self._tokenizer.encode_batch(list(text), add_special_tokens)
        else:
            raise ValueError(f"text must be a str or a list of str, got {type(text).__name__}")
        masks = [[1] * len(row) for row in ids]
        if padding or return_tensors is not None:
            width = max(len(row) for row in ids) if ids else 0
            if not padding and any(len(row) != width for row in ids):
                raise ValueError("the texts encode to different lengths: pass padding=True to pad them "
                                 "into one array")
            pad = self.pad_token_id
            ids = [row + [pad] * (width - len(row)) for row in ids]
            masks = [row + [0] * (width - len(row)) for row in masks]
        if return_tensors is not None:
            if return_tensors != "np":
                raise ValueError(f"return_tensors={return_tensors!r} is not supported; tp returns numpy arrays ('np')")
            return BatchEncoding(input_ids=np.array(ids, dtype=np.int64),
                                 attention_mask=np.array(masks, dtype=np.int64))
        if isinstance(text, str):
            return BatchEncoding(input_ids=ids[0], attention_mask=masks[0])
        return BatchEncoding(input_ids=ids, attention_mask=masks)

    @property
    def pad_token_id(self):
        """tokenizer_config.json's pad_token; without one, the EOS (what padding then uses)."""
        pad = self._tokenizer.pad_token_id
        if pad is not None:
            return pad
        return self.eos_token_id if self.eos_token_id is not None else 0

    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        ids = np.asarray(token_ids).reshape(-1).astype(np.int64).tolist()
        return self._tokenizer.decode(ids, skip_special_tokens, clean_up_tokenization_spaces)

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in sequences]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._tokenizer.token_to_id(tokens)
        return [self._tokenizer.token_to_id(t) for t in tokens]


class AutoTokenizer:
    @staticmethod
    def from_pretrained(pretrained_model_name_or_path):
        """tokenizer.json (and tokenizer_config.json, generation_config.json) from a model directory."""
        path = os.fspath(pretrained_model_name_or_path)
        tokenizer = _tp.Tokenizer.from_model_dir(path)
        return PreTrainedTokenizer(tokenizer, path)
