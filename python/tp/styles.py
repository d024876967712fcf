"""ALL_PARALLEL_STYLES: Transformers' registry of style names, over tp's own.

    tp.ALL_PARALLEL_STYLES.register("colwise_custom", tp.ColwiseParallel())
    tp_plan = {"model.layers.*.self_attn.q_proj": "colwise_custom", ...}
"""
from . import _tp


class _ParallelStyles:
    """A view of the registry: register(name, style), `name in`, keys()."""

    def register(self, name, style):
        if not isinstance(style, _tp.TensorParallelLayer):
            raise TypeError(
                f"ALL_PARALLEL_STYLES.register('{name}', ...) takes a style instance such as "
                f"tp.ColwiseParallel(), got {type(style).__name__}"
            )
        _tp.register_style(name, style)

    def keys(self):
        return _tp.style_names()

    def __contains__(self, name):
        return name in _tp.style_names()

    def __iter__(self):
        return iter(_tp.style_names())

    def __len__(self):
        return len(_tp.style_names())

    def __repr__(self):
        return f"ALL_PARALLEL_STYLES({', '.join(_tp.style_names())})"


ALL_PARALLEL_STYLES = _ParallelStyles()
