"""The fingerprint: its documented formula, and every single-bit flip caught (exhaustively)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_mgpu_plugins.backends.tensorflow import fingerprint as fp

U32 = 0xFFFFFFFF


def fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & U32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & U32
    return x ^ (x >> 16)


def reference_fingerprint(array: np.ndarray) -> int:
    """The documented formula, in numpy and Python integers."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype == np.bool_:
        words = flat.astype(np.uint32)
    elif flat.dtype.itemsize < 4:
        words = flat.view(f"u{flat.dtype.itemsize}").astype(np.uint32)
    else:
        words = flat.view(np.uint32)
    if words.size == 0:
        return 0
    blocks = math.gcd(words.size, 64)
    sums = [int(block.sum(dtype=np.uint64)) & U32 for block in words.reshape(blocks, -1)]
    total = sum(sum_j * ((0x9E3779B9 * (2 * j + 1)) & U32) for j, sum_j in enumerate(sums)) & U32
    return fmix32(total)


def bits_of(values: tf.Tensor) -> np.ndarray:
    """The raw bits of a tensor as unsigned integers of its width (bfloat16 has no numpy type)."""
    unsigned = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[values.dtype.size]
    return tf.bitcast(values, unsigned).numpy()


@pytest.mark.parametrize(
    "dtype", ["float32", "float16", "float64", "int8", "uint8", "int32", "uint32", "int64", "bool"]
)
@pytest.mark.parametrize("shape", [(5, 7), (8, 8), (3,), (0,)])
def test_fingerprint_is_the_documented_formula_for_every_dtype(dtype, shape):
    values = (np.random.default_rng(3).normal(size=shape) * 50).astype(dtype)
    expected = reference_fingerprint(values)
    assert fp.fingerprint(values) == expected
    assert fp.fingerprint(values, jit_compile=True) == expected
    assert fp.fingerprint(tf.Variable(values)) == expected


def test_bfloat16_reads_its_16_bits():
    values = tf.constant([1.0, -2.5, 3.0e-3], tf.bfloat16)
    assert fp.fingerprint(values) == reference_fingerprint(bits_of(values))


def test_words_are_cut_into_up_to_64_blocks():
    assert [fp.blocks(n) for n in (1, 6, 64, 96, 128, 1000, 2**20)] == [1, 2, 64, 32, 64, 8, 64]


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [(tf.float32, (8, 8)), (tf.float32, (3, 5)), (tf.float16, (4, 16)), (tf.bfloat16, (3, 7)),
     (tf.float64, (4, 8)), (tf.int32, (2, 64)), (tf.int8, (9,))],
)
def test_every_single_bit_flip_changes_the_fingerprint(dtype, shape):
    """Exhaustive: every bit of every value, on tensors with one block and with up to 64."""
    rng = np.random.default_rng(0)
    values = tf.cast(rng.normal(size=shape) * 100, dtype)
    bits = bits_of(values).reshape(-1)
    width = dtype.size * 8
    flipped = np.repeat(bits[None], bits.size * width, axis=0)  # one row per (value, bit)
    for index in range(bits.size):
        for bit in range(width):
            flipped[index * width + bit, index] ^= bits.dtype.type(1) << bits.dtype.type(bit)
    base = fp.fingerprint(values)
    variable = tf.Variable(values)
    fingerprints = fp.make_fingerprinter([[variable]])
    seen = []
    for row in flipped:
        variable.assign(tf.reshape(tf.bitcast(tf.constant(row), dtype), shape))
        seen.append(int(fingerprints()[0, 0]))
    assert len(seen) == bits.size * width and base not in seen  # every flip caught


def test_changes_confined_to_one_word_and_values_moved_between_blocks_are_caught():
    values = np.linspace(-1, 1, 64)  # float64: 128 words, 64 blocks of two
    flipped = values.copy()
    flipped.view(np.uint64)[7] ^= np.uint64(1)
    assert abs(flipped[7] - values[7]) < 1e-15
    assert fp.fingerprint(flipped) != fp.fingerprint(values)
    changed = values.astype("float32")
    changed[9] = np.float32(123.25)
    assert fp.fingerprint(changed) != fp.fingerprint(values.astype("float32"))
    swapped = values.copy()
    swapped[[2, 5]] = swapped[[5, 2]]
    assert fp.fingerprint(swapped) != fp.fingerprint(values)  # the blocks' weights count


def test_fingerprinter_hashes_each_copy_on_its_device():
    values = np.random.default_rng(2).normal(size=(4, 3)).astype("float32")
    groups = []
    for device in ("/cpu:0", "/cpu:1"):
        with tf.device(device):
            groups.append([tf.Variable(values), tf.Variable(np.arange(5, dtype=np.int64))])
    assert groups[1][0].device.endswith("CPU:1")
    result = fp.make_fingerprinter(groups)()
    assert result.dtype == np.int64 and result.shape == (2, 2)
    expected = [reference_fingerprint(values), reference_fingerprint(np.arange(5, dtype=np.int64))]
    assert result.tolist() == [expected, expected]
    assert fp.make_fingerprinter(groups, jit_compile=True)().tolist() == [expected, expected]
    groups[1][0].assign(values + 1e-3)
    assert result.tolist() != fp.make_fingerprinter(groups)().tolist()


def test_each_hash_kernel_runs_on_the_device_of_its_variable():
    """Only one integer per variable leaves its device: the hashing itself is placed there."""
    groups = []
    for device in ("/cpu:0", "/cpu:1"):
        with tf.device(device):
            groups.append([tf.Variable(np.ones((4, 3), "float32")), tf.Variable(np.arange(5))])
    fingerprints = fp.make_fingerprinter(groups)
    fingerprints()
    graph = fingerprints.traced().get_concrete_function().graph
    kernels = [op for op in graph.get_operations() if op.type.endswith("PartitionedCall")]
    devices = [tf.DeviceSpec.from_string(op.device).device_index for op in kernels]
    assert devices == [0, 0, 1, 1]  # group order: replica 0's two variables, then replica 1's
    assert all(op.device.endswith(f"CPU:{i}") for op, i in zip(kernels, devices, strict=True))


def test_xla_only_on_accelerators_unless_asked():
    assert not fp._xla(None, "/job:localhost/replica:0/task:0/device:CPU:0")
    assert fp._xla(None, "/job:localhost/replica:0/task:0/device:GPU:1")
    assert fp._xla(True, "/device:CPU:0") and not fp._xla(False, "/device:GPU:0")


def test_fingerprint_refuses_types_without_bits():
    assert not fp.supports(tf.complex64) and not fp.supports(tf.string)
    with pytest.raises(TypeError, match="complex64"):
        fp.fingerprint(np.zeros(2, np.complex64))
    with pytest.raises(ValueError, match="same number of variables"):
        fp.make_fingerprinter([[tf.Variable(1.0)], []])
