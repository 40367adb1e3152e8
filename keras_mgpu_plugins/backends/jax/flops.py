"""FLOPs of a training step on JAX: XLA's cost analysis of the model's forward and backward pass.

`run_and_count` runs the step `fit` asked for, reading the shapes of its batch on the way
(the iterator Keras hands the train function is read through a proxy for that one call),
then lowers the model's forward and backward pass at those shapes, the global batch
(`jax.jit(...).lower(...)`: traced, never run) and reads XLA's cost analysis of it: every
floating-point operation of the lowered computation (matrix products at 2 FLOPs per
multiply-add, convolutions over the taps that touch the input, elementwise ops at one).
The optimizer's update is not part of it (MFU counts the model's FLOPs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras_mgpu_plugins._flop_count import FlopCount, guarded, per_sample, tokens_per_sample

METHOD = "XLA's cost analysis of the forward and backward pass"


class _Peek:
    """An iterator that keeps the shapes of the first element it hands out."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.spec = inner, None

    def __iter__(self) -> _Peek:
        return self

    def __next__(self) -> Any:
        item = next(self.inner)
        if self.spec is None:
            import jax

            try:
                self.spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), item)
            except Exception as err:  # noqa: BLE001 - monitoring must not stop training
                self.spec = err  # a batch of something else than arrays: said, not counted
        return item


def run_and_count(model: Any, original: Callable[..., Any], args: tuple) -> tuple[Any, FlopCount]:
    """`original(*args)` (Keras's `train_function(state, iterator)`), and the FLOPs of its step."""
    state, iterator = args
    peek = _Peek(iterator)
    result = original(state, peek)
    if peek.spec is None or isinstance(peek.spec, Exception):
        why = "the step read no batch" if peek.spec is None else f"its batch: {peek.spec}"
        return result, FlopCount.absent(why)
    return result, guarded(count, model, peek.spec)


def count(model: Any, data: Any) -> FlopCount:
    """The forward and backward pass's FLOPs per row, at the shapes of `data` (a batch's specs)."""
    import jax
    import jax.numpy as jnp
    import keras

    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    leaves = [leaf for leaf in jax.tree.leaves(x) if hasattr(leaf, "shape")]
    tokens = tokens_per_sample((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves)
    rows = int(leaves[0].shape[0]) if leaves and leaves[0].shape else 0
    if not model.trainable_variables:
        return FlopCount.absent("the model has no trainable weights", tokens, rows)
    trainable = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in model.trainable_variables]
    fixed = [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in model.non_trainable_variables]

    def forward(trainable: Any, fixed: Any, x: Any) -> Any:
        return model.stateless_call(trainable, fixed, x, training=True)[0]

    outputs = [o for o in jax.tree.leaves(jax.eval_shape(forward, trainable, fixed, x))
               if jnp.issubdtype(o.dtype, jnp.floating)]
    cotangents = [jax.ShapeDtypeStruct(o.shape, "float32") for o in outputs]

    def scalar(trainable: Any, fixed: Any, x: Any, cotangents: Any) -> Any:
        floats = [o for o in jax.tree.leaves(forward(trainable, fixed, x))
                  if jnp.issubdtype(o.dtype, jnp.floating)]
        return sum(jnp.sum(o.astype("float32") * c) for o, c in zip(floats, cotangents,
                                                                      strict=True))

    def step(trainable: Any, fixed: Any, x: Any, cotangents: Any) -> Any:
        return jax.value_and_grad(scalar)(trainable, fixed, x, cotangents)

    lowered = jax.jit(step).lower(trainable, fixed, x, cotangents)
    if "stablehlo.while" in lowered.as_text():
        return FlopCount.absent("the step holds a loop (a scan, an RNN): XLA's cost analysis "
                                 "counts a loop's body once, whatever its trip count", tokens, rows)
    flops = _flops(lowered)
    return per_sample(flops, rows, METHOD, tokens)


def _flops(lowered: Any) -> float | None:
    analysis = lowered.cost_analysis()
    if analysis is None:
        analysis = lowered.compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return (analysis or {}).get("flops")


def compute_devices() -> list[str]:
    """What each of this process's devices is (`device_kind`, `"cpu"` for a CPU)."""
    import jax

    return ["cpu" if d.platform == "cpu" else str(d.device_kind) for d in jax.local_devices()]


def float32_on_tensor_cores() -> bool:
    """Whether float32 matmuls may use TF32 (JAX's default matmul precision on GPUs)."""
    import jax

    precision = jax.config.jax_default_matmul_precision
    return str(precision or "default").lower() not in ("highest", "float32")
