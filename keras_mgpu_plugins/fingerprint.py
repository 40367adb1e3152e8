"""Exact fingerprints of tensors, computed on the device that holds them.

A fingerprint is a bitwise hash: the tensor is read as raw 32-bit words (a
`float32` value is one word, a `float64` or `int64` value two, 8- and 16-bit
values are widened), each word is mixed with a key drawn from its position, and
the mixed words are summed modulo 2^32:

    key_i = i * 0x9E3779B9 + 0x7F4A7C15           (mod 2^32)
    fingerprint = sum_i fmix32(word_i ^ key_i)     (mod 2^32)

`fmix32` is MurmurHash3's finaliser (xor-shifts and two odd multiplications on
unsigned words; every step is invertible), so for a fixed position the term is
a bijection of the word: a change confined to one word (one flipped bit, one
changed value) always changes the fingerprint. A change spread over several
words goes unseen with probability about 2^-32 (the terms are pseudo-random),
and the position keys tell permuted values apart.

It is integer arithmetic reduced where the tensor lives: each tensor (or each
16 MiB chunk of a large one) is hashed by one XLA-compiled kernel
(`jit_compile=True`) that fuses the mixing into the reduction, a single pass
over memory; what leaves the device is one integer per tensor. The kernels of
independent tensors run in parallel. Same bits in, same fingerprint out, on
any device. The fingerprint is returned as an int64 in `[0, 2^32)`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Elements hashed by one kernel call; larger tensors are split (parallel, same compiled kernel).
CHUNK_ELEMENTS = 1 << 22

_GOLDEN = np.uint32(0x9E3779B9)
_KEY_SEED = np.uint32(0x7F4A7C15)
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


def _hash_words(tf: Any, w: Any, offset: Any) -> Any:
    position = tf.bitcast(tf.range(tf.size(w), dtype=tf.int32), tf.uint32) + offset
    mixed = _fmix32(tf, tf.bitwise.bitwise_xor(w, position * _GOLDEN + _KEY_SEED))
    return tf.cast(tf.reduce_sum(mixed), tf.int64)  # uint32 sum: wraps modulo 2^32


def _kernel(tf: Any, dtype: Any, jit_compile: bool) -> Any:
    """The compiled hash of one 1-D chunk of `dtype`: `(flat, word_offset) -> int64`."""
    key = (dtype.name, jit_compile)
    with _lock:
        if key not in _kernels:
            spec = [tf.TensorSpec([None], dtype), tf.TensorSpec([], tf.uint32)]

            def kernel(flat: Any, offset: Any) -> Any:
                return _hash_words(tf, words(tf, flat), offset)

            _kernels[key] = tf.function(
                kernel, input_signature=spec, jit_compile=jit_compile, autograph=False
            )
        return _kernels[key]


def fingerprint_ops(tf: Any, tensor: Any, jit_compile: bool = True) -> Any:
    """Graph ops computing the fingerprint of `tensor` where it lives (before `mod 2^32`).

    Args:
        tf: The TensorFlow module.
        tensor: A tensor or variable with a static number of elements.
        jit_compile: Hash with XLA kernels (one fused pass per chunk).

    Returns:
        A scalar int64 tensor; its value modulo 2^32 is the fingerprint.
    """
    flat = tf.reshape(tensor, [-1])
    size = flat.shape.num_elements()
    if size is None:
        raise ValueError(f"Cannot fingerprint a tensor of unknown shape {flat.shape}.")
    kernel = _kernel(tf, flat.dtype, jit_compile)
    per_element = words_per_element(flat.dtype)
    parts = [
        kernel(flat[start : start + CHUNK_ELEMENTS], np.uint32((start * per_element) & _MASK))
        for start in range(0, size, CHUNK_ELEMENTS)
    ]
    if not parts:
        return tf.constant(0, tf.int64)
    return parts[0] if len(parts) == 1 else tf.add_n(parts)


def make_fingerprinter(
    groups: Sequence[Sequence[Any]], jit_compile: bool = True
) -> Callable[[], np.ndarray]:
    """One graph call that fingerprints every variable of every group on its own device.

    Args:
        groups: Sequences of variables of equal length, e.g. one per replica
            holding that replica's copies of the same variables, in order.
        jit_compile: Hash with XLA kernels; if a device cannot run them, the
            fingerprinter falls back to plain TensorFlow ops (same values, slower).

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

    def build(jit: bool) -> Any:
        @tf.function(autograph=False)
        def all_groups() -> Any:
            rows = []
            for group in groups:
                row = []
                for variable in group:
                    with tf.device(variable.device):
                        row.append(fingerprint_ops(tf, tf.convert_to_tensor(variable), jit))
                rows.append(tf.stack(row))
            return tf.stack(rows)

        return all_groups

    state = {"fn": build(jit_compile), "checked": not jit_compile}

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


def fingerprint(value: Any, jit_compile: bool = True) -> int:
    """The fingerprint of one tensor, variable or array, computed where it lives.

    Args:
        value: A tensor, variable or numpy array.
        jit_compile: Hash with XLA kernels.

    Returns:
        The fingerprint, an int in `[0, 2^32)`.

    Example:
        >>> fingerprint(np.float32([1.0, 2.0])) == fingerprint(np.float32([1.0, 2.0]))
        True
    """
    import tensorflow as tf

    tensor = value if isinstance(value, tf.Variable) else tf.convert_to_tensor(value)
    return int(fingerprint_ops(tf, tf.convert_to_tensor(tensor), jit_compile).numpy()) & _MASK
