"""tp: tensor-parallel inference and training of Hugging Face transformer models.

The API follows Transformers' shapes:

    import tp
    model = tp.AutoModelForCausalLM.from_pretrained(
        "models/qwen3", dtype="bfloat16", distributed_config=tp.DistributedConfig(tp_size=2))
    print(model.tp_plan)
    tokenizer = tp.AutoTokenizer.from_pretrained("models/qwen3")
    inputs = tokenizer("Can I help", return_tensors="np").input_ids
    outputs = model(inputs)            # outputs.logits: numpy float32 [batch, seq, vocab]

Run it on N ranks with `tprun --nproc-per-node N python3 script.py`: every rank
runs the script, each holds 1/N of the weights, and all get the same results.
"""
from ._tp import (  # noqa: F401
    AllReduceParallel,
    ColwiseParallel,
    EmbeddingColwise,
    EmbeddingRowwise,
    LocalParamsParallel,
    ParallelismConfig,
    ReplicatedWithGradAllReduce,
    RowwiseParallel,
    SequenceParallel,
    TensorParallelLayer,
    TpError,
    __version__,
    plan_report,
    register_style,
    style_names,
    supported_model_types,
)
from .modeling import AutoModelForCausalLM, CausalLMOutput, DistributedConfig, PreTrainedModel  # noqa: F401
from .styles import ALL_PARALLEL_STYLES  # noqa: F401
from .tokenization import AutoTokenizer, BatchEncoding, PreTrainedTokenizer  # noqa: F401
from .training import TokenBlocks, Trainer, TrainingArguments  # noqa: F401
