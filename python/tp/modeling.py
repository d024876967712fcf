"""AutoModelForCausalLM and the loaded model, in Transformers' shapes."""
import json
import os

import numpy as np

from . import _tp

_DTYPES = {"auto": None, None: None, "float32": "f32", "bfloat16": "bf16", "f32": "f32", "bf16": "bf16"}


def _dtype_name(dtype):
    """'bfloat16', 'float32', 'auto' or None; a torch dtype's name works too."""
    name = dtype if dtype is None or isinstance(dtype, str) else str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; choose 'auto', 'float32' or 'bfloat16'")
    return _DTYPES[name]


def _plan_text(plan, what="tp_plan"):
    """DistributedConfig's tp_plan / ep_plan: 'auto', a dict (as JSON), or a JSON file's path."""
    if isinstance(plan, dict):
        for key, style in plan.items():
            if not isinstance(key, str) or not isinstance(style, str):
                raise ValueError(f"{what} entries map module names to style names (str: str), got {key!r}: {style!r}")
        return json.dumps(plan)
    if isinstance(plan, (str, os.PathLike)):
        return os.fspath(plan)
    raise ValueError(f"{what} must be 'auto', a dict or a path to a JSON file, got {type(plan).__name__}")


class DistributedConfig(_tp.DistributedConfig):
    """Transformers' DistributedConfig: tp_size (None: every rank) and tp_plan ("auto", a dict or a JSON
    file); for mixture-of-experts models ep_size and ep_plan (expert parallelism)."""

    def __init__(self, tp_size=None, tp_plan="auto", enable_sequence_parallel=False, ep_size=None, ep_plan="auto"):
        super().__init__(tp_size=tp_size, tp_plan=_plan_text(tp_plan), enable_sequence_parallel=enable_sequence_parallel,
                         ep_size=ep_size, ep_plan=_plan_text(ep_plan, "ep_plan"))


class CausalLMOutput(dict):
    """What model(input_ids) returns: .logits (numpy float32 [batch, seq, vocab])."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class PreTrainedModel:
    """A model loaded by AutoModelForCausalLM.from_pretrained: this rank's slice of the weights."""

    def __init__(self, model):
        self._model = model

    # What Transformers' TP models expose.
    @property
    def tp_plan(self):
        return self._model.tp_plan

    @property
    def supports_tp_plan(self):
        return self._model.supports_tp_plan

    @property
    def tp_size(self):
        return self._model.tp_size

    @property
    def tp_rank(self):
        return self._model.tp_rank

    @property
    def param_styles(self):
        """parameter name -> the style that shards it (the parameters the plan covers)."""
        return self._model.param_styles

    @property
    def plan_warnings(self):
        """Plan rules that matched nothing, parameters no rule covered (Transformers' warnings)."""
        return self._model.plan_warnings

    @property
    def config(self):
        return self._model.config

    @property
    def device(self):
        return "cpu"

    def forward(self, input_ids):
        """Logits of every position: input_ids [seq] or [batch, seq] -> CausalLMOutput(logits=...)."""
        return CausalLMOutput(logits=self._model.forward(input_ids))

    __call__ = forward

    def generate(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0, top_k=50, top_p=1.0,
                 seed=0, eos_token_id=None, pad_token_id=None):
        """The prompts followed by their new tokens, as numpy int64 [batch, prompt + new].

        Greedy unless do_sample; sampling draws from tp's seeded stream (`seed`), so the
        same seed gives the same tokens at every tp_size. A row that stops early at an
        end-of-sequence id is padded with pad_token_id (default: config's, else the EOS).
        """
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.size == 0:
            raise ValueError(f"input_ids: expected shape [seq] or [batch, seq], got {list(np.shape(input_ids))}")
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"input_ids: token ids must be integers, got dtype {ids.dtype}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if do_sample and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature}")
        if eos_token_id is None:
            eos = _tp.default_eos_token_ids(self._model)
        else:
            eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        new = self._model.generate(
            ids.astype(np.int64).tolist(), max_new_tokens,
            temperature if do_sample else 0.0, top_k if do_sample else 0, top_p if do_sample else 1.0,
            seed, eos)
        if pad_token_id is None:
            pad_token_id = self.config.get("pad_token_id")
        if pad_token_id is None:
            pad_token_id = eos[0] if eos else 0
        width = max((len(t) for t in new), default=0)
        out = np.full((ids.shape[0], ids.shape[1] + width), pad_token_id, dtype=np.int64)
        out[:, : ids.shape[1]] = ids
        for row, tokens in enumerate(new):
            out[row, ids.shape[1]: ids.shape[1] + len(tokens)] = tokens
        return out

    def save_pretrained(self, save_directory):
        """config.json, model.safetensors (the weights gathered from every rank) and the tokenizer files.

        Needs the weights as loaded: from_pretrained(..., training=True) (inference packs them).
        """
        self._model.save_pretrained(os.fspath(save_directory))

    def __repr__(self):
        return (f"PreTrainedModel({self.config.get('model_type')}, tp_size={self.tp_size}, "
                f"tp_rank={self.tp_rank}, source={self._model.source_dir})")


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(pretrained_model_name_or_path, dtype="auto", distributed_config=None,
                        parallelism_config=None, training=False, verbose=True, **kwargs):
        """Loads this rank's slice of a Hugging Face checkpoint directory.

        dtype: 'auto' (config.json's torch_dtype), 'float32' or 'bfloat16'.
        distributed_config: tp.DistributedConfig(tp_size=..., tp_plan=...); default: every
        rank is tensor-parallel with the model's own plan.
        parallelism_config: a tp.ParallelismConfig mesh (dp x tp) to load onto.
        training: load for tp.Trainer (f32 master weights, nothing packed for inference).
        """
        if "torch_dtype" in kwargs:
            dtype = kwargs.pop("torch_dtype")
        if "tp_plan" in kwargs:
            raise ValueError("pass tp_plan through distributed_config=tp.DistributedConfig(tp_plan=...), "
                             "as Transformers does (from_pretrained(tp_plan=...) is deprecated there)")
        if kwargs:
            raise TypeError(f"from_pretrained() got unexpected keyword arguments: {', '.join(sorted(kwargs))}")
        path = os.fspath(pretrained_model_name_or_path)
        if not os.path.isdir(path):
            raise ValueError(f"{path}: not a model directory (tp loads local Hugging Face checkpoints: "
                             "config.json and *.safetensors)")
        if distributed_config is None:
            distributed_config = DistributedConfig()
        model = _tp.from_pretrained(path, _dtype_name(dtype), distributed_config, parallelism_config,
                                    training, verbose)
        return PreTrainedModel(model)
