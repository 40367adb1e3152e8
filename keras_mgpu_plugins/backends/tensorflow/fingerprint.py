"""Exact fingerprints of tensors, computed on the device that holds them.

A fingerprint is a weighted checksum of the tensor's raw bits. The tensor is
read as `N` unsigned 32-bit words (a `float32` value is one word, a `float64`
or `int64` value two, low word first; 8- and 16-bit values and booleans are
zero-extended to one word each), the words are cut into `B = gcd(N, 64)`
equal consecutive blocks, and:

    R_j = sum of the words of block j                       (mod 2^32)
    k_j = 0x9E3779B9 * (2j + 1)                             (mod 2^32)
    fingerprint = fmix32(sum_j k_j * R_j)                   (mod 2^32)

`fmix32` is MurmurHash3's finaliser (xor-shifts and odd multiplications, a
bijection of 32-bit words), applied once to the sum so that fingerprints look
random; it loses nothing.

Why every single-bit change is caught: flipping bit `b < 32` of a word of block
`j` changes that word by `+-2^b`, hence the weighted sum by `+-k_j * 2^b`
(mod 2^32). `k_j` is odd (a product of two odd numbers), so `k_j * 2^b` is
divisible by `2^b` and by no higher power of two: it is not a multiple of
`2^32`, the sum changes, and so does the fingerprint (`fmix32` is a bijection).
The same argument covers any change confined to one word (`+-k_j * d` with
`0 < d < 2^32`). A change spread over several words goes unseen only when the
weighted changes cancel modulo 2^32: about once in 2^32 for unrelated
changes, but always when bit 31 (a float32 sign) flips in an even number of
words. Values exchanged between blocks are told apart by the block weights,
values exchanged within a block are not.

It is one reduction per tensor where the tensor lives, which reads every byte
once like `tf.reduce_sum`: a reshape to `(B, N / B)` and a sum over the second
axis, in 32-bit integer arithmetic (exact, the same on every device and thread
count); what leaves the device is one integer per tensor. On CPU it runs as
plain TensorFlow ops (multi-threaded; XLA's CPU integer reductions are slower),
on accelerators as one XLA kernel. Same bits in, same fingerprint out, on any
device. The fingerprint is returned as an int64 in `[0, 2^32)`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: At most this many blocks per tensor (the block count is `gcd(words, MAX_BLOCKS)`).
MAX_BLOCKS = 64

_GOLDEN = np.uint32(0x9E3779B9)
_MASK = 0xFFFFFFFF

_lock = threading.Lock()
_kernels: dict[tuple[str, bool], Any] = {}
logger = logging.getLogger(__name__)


def _fmix32(tf: Any, x: Any) -> Any:
    """MurmurHash3's 32-bit finaliser on a uint32 tensor (a bijection)."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, np.uint32(16)))
    x = x * np.uint32(0x85EBCA6B)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, np.uint32(13)))
    x = x * np.uint32(0xC2B2AE35)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, np.uint32(16)))


def words_per_element(dtype: Any) -> int:
    """How many 32-bit words one value of `dtype` is read as (1 for 1- to 4-byte types)."""
    return max(1, dtype.size // 4)


def blocks(num_words: int) -> int:
    """How many equal blocks a tensor of `num_words` 32-bit words is cut into: `gcd(num_words, 64)`."""
    return math.gcd(num_words, MAX_BLOCKS) or 1


def supports(dtype: Any) -> bool:
    """Whether tensors of `dtype` (a `tf.DType`) can be fingerprinted: real numbers and booleans."""
    return dtype.is_bool or ((dtype.is_floating or dtype.is_integer) and not dtype.is_complex)


def words(tf: Any, flat: Any) -> Any:
    """The raw bits of a 1-D tensor as a 1-D uint32 tensor (no value conversion).

    Args:
        tf: The TensorFlow module.
        flat: A 1-D numeric or boolean tensor.

    Returns:
        One word per 1-, 2- or 4-byte value (narrow ones zero-extended), two
        per 8-byte value.

    Raises:
        TypeError: For other dtypes (complex, string, resource, variant).
    """
    dtype = flat.dtype
    if dtype == tf.bool:
        return tf.cast(flat, tf.uint32)
    if not supports(dtype):
        raise TypeError(f"Cannot fingerprint a tensor of dtype {dtype.name}.")
    if dtype.size < 4:
        unsigned = flat if dtype.is_unsigned else tf.bitcast(flat, {1: tf.uint8, 2: tf.uint16}[dtype.size])
        return tf.cast(unsigned, tf.uint32)
    if dtype == tf.uint32:
        return flat
    return tf.reshape(tf.bitcast(flat, tf.uint32), [-1])


def _hash_words(tf: Any, w: Any, num_blocks: Any) -> Any:
    block_sums = tf.reduce_sum(tf.reshape(w, tf.stack([num_blocks, -1])), axis=1)  # wraps mod 2^32
    weights = (tf.bitcast(tf.range(num_blocks, dtype=tf.int32), tf.uint32) * np.uint32(2) + np.uint32(1)) * _GOLDEN
    return tf.cast(_fmix32(tf, tf.reduce_sum(block_sums * weights)), tf.int64)


def _kernel(tf: Any, dtype: Any, jit_compile: bool) -> Any:
    """The hash of one 1-D tensor of `dtype`: `(flat, num_blocks) -> int64`, one graph function."""
    key = (dtype.name, jit_compile)
    with _lock:
        if key not in _kernels:
            spec = [tf.TensorSpec([None], dtype), tf.TensorSpec([], tf.int32)]

            def kernel(flat: Any, num_blocks: Any) -> Any:
                return _hash_words(tf, words(tf, flat), num_blocks)

            _kernels[key] = tf.function(
                kernel, input_signature=spec, jit_compile=jit_compile, autograph=False
            )
        return _kernels[key]


def _xla(jit_compile: bool | None, device: str) -> bool:
    """`jit_compile`, or when it is None whether `device` is an accelerator (XLA is slower on CPU)."""
    if jit_compile is not None:
        return bool(jit_compile)
    return bool(device) and "CPU" not in device.upper()


def fingerprint_ops(tf: Any, tensor: Any, jit_compile: bool | None = None) -> Any:
    """Graph ops computing the fingerprint of `tensor` where it lives.

    Args:
        tf: The TensorFlow module.
        tensor: A tensor or variable with a static number of elements.
        jit_compile: Hash with one XLA kernel; None (the default): on
            accelerators, not on CPU. The value is the same either way.

    Returns:
        A scalar int64 tensor in `[0, 2^32)`: the fingerprint.
    """
    flat = tf.reshape(tensor, [-1])
    size = flat.shape.num_elements()
    if size is None:
        raise ValueError(f"Cannot fingerprint a tensor of unknown shape {flat.shape}.")
    if size == 0:
        return tf.constant(0, tf.int64)
    kernel = _kernel(tf, flat.dtype, _xla(jit_compile, getattr(tensor, "device", "") or ""))
    return kernel(flat, np.int32(blocks(size * words_per_element(flat.dtype))))


def make_fingerprinter(
    groups: Sequence[Sequence[Any]], jit_compile: bool | None = None
) -> Callable[[], np.ndarray]:
    """One graph call that fingerprints every variable of every group on its own device.

    Args:
        groups: Sequences of variables of equal length, e.g. one per replica
            holding that replica's copies of the same variables, in order.
        jit_compile: Hash with XLA kernels; None (the default): on
            accelerators, not on CPU. If a device cannot run them, the
            fingerprinter falls back to plain TensorFlow ops (same values).

    Returns:
        A callable taking no argument and returning an int64 numpy array of
        shape `(len(groups), len(groups[0]))`, each value in `[0, 2^32)`. Its
        `traced()` returns the `tf.function` it runs, to inspect where each
        op is placed.

    Example:
        >>> fingerprints = make_fingerprinter([[kernel_on_gpu0], [kernel_on_gpu1]])
        >>> fingerprints()
        array([[3914216795], [3914216795]])
    """
    import tensorflow as tf

    groups = [list(group) for group in groups]
    if len({len(group) for group in groups}) > 1:
        raise ValueError(
            f"Every group must hold the same number of variables. Received: {[len(g) for g in groups]}"
        )
    width = len(groups[0]) if groups else 0
    if width == 0:
        return lambda: np.zeros((len(groups), 0), dtype=np.int64)

    def build(jit: bool | None) -> Any:
        @tf.function(autograph=False)
        def all_groups() -> Any:
            rows = []
            for group in groups:
                row = []
                for variable in group:
                    with tf.device(variable.device):
                        row.append(fingerprint_ops(tf, tf.convert_to_tensor(variable), _xla(jit, variable.device)))
                rows.append(tf.stack(row))
            return tf.stack(rows)

        return all_groups

    any_xla = any(_xla(jit_compile, variable.device) for group in groups for variable in group)
    state = {"fn": build(jit_compile), "checked": not any_xla}

    def fingerprints() -> np.ndarray:
        if not state["checked"]:
            state["checked"] = True
            try:
                return state["fn"]().numpy() & _MASK
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
                    tf.errors.NotFoundError) as err:
                logger.warning("XLA cannot hash on this device (%s); using plain TensorFlow ops.",
                               str(err).splitlines()[0])
                state["fn"] = build(False)
        return state["fn"]().numpy() & _MASK

    fingerprints.traced = lambda: state["fn"]  # type: ignore[attr-defined]
    return fingerprints


def fingerprint(value: Any, jit_compile: bool | None = None) -> int:
    """The fingerprint of one tensor, variable or array, computed where it lives.

    Args:
        value: A tensor, variable or numpy array.
        jit_compile: Hash with an XLA kernel; None (the default): on
            accelerators, not on CPU.

    Returns:
        The fingerprint, an int in `[0, 2^32)`.

    Example:
        >>> fingerprint(np.float32([1.0, 2.0])) == fingerprint(np.float32([1.0, 2.0]))
        True
    """
    import tensorflow as tf

    tensor = value if isinstance(value, tf.Variable) else tf.convert_to_tensor(value)
    return int(fingerprint_ops(tf, tf.convert_to_tensor(tensor), jit_compile).numpy()) & _MASK
