"""multi_gpu_model's pure decisions: which devices, and which way weights are copied."""

from __future__ import annotations

import numpy as np
import pytest

from keras_mgpu_plugins.multi_gpu import select_devices, sync_action, weights_fingerprint


@pytest.mark.parametrize(
    "gpus, num_gpus, num_cpus, expected",
    [
        (None, 4, 1, ("GPU", [0, 1, 2, 3])),
        (2, 4, 1, ("GPU", [0, 1])),
        (4, 4, 1, ("GPU", [0, 1, 2, 3])),
        ([3, 1], 4, 1, ("GPU", [3, 1])),
        ((0, 2), 4, 1, ("GPU", [0, 2])),
        (None, 0, 2, ("CPU", [0, 1])),  # simulate_devices(2) without a GPU
        (2, 0, 3, ("CPU", [0, 1])),
        ([1, 2], 0, 3, ("CPU", [1, 2])),
        (2, 2, 8, ("GPU", [0, 1])),  # GPUs win over logical CPUs
    ],
)
def test_select_devices(gpus, num_gpus, num_cpus, expected):
    assert select_devices(gpus, num_gpus, num_cpus) == expected


@pytest.mark.parametrize("gpus", [0, 1, -3, [0], [], (5,)])
def test_fewer_than_two_devices_is_the_legacy_error(gpus):
    with pytest.raises(ValueError, match=r"gpus must be >= 2.*Received: gpus="):
        select_devices(gpus, 8, 1)


def test_more_devices_than_exist_names_both_numbers():
    with pytest.raises(
        ValueError, match=r"\(gpus=3\) needs 3 devices, but this process sees 2 GPUs"
    ):
        select_devices(3, 2, 1)
    with pytest.raises(
        ValueError, match=r"needs 3 devices, .*sees no GPU and 2 logical CPU devices"
    ):
        select_devices(3, 0, 2)
    with pytest.raises(
        ValueError, match=r"needs device 4, but this process sees 2 GPUs \(ids 0 to 1\)"
    ):
        select_devices([0, 4], 2, 1)


def test_no_device_to_replicate_on_says_how_to_simulate():
    with pytest.raises(
        ValueError, match=r"needs at least 2 devices, but this process sees 1 GPU \("
    ):
        select_devices(None, 1, 1)
    with pytest.raises(
        ValueError, match=r"sees no GPU and 1 logical CPU device\. .*simulate_devices\(2\)"
    ):
        select_devices(None, 0, 1)


@pytest.mark.parametrize("gpus", ["2", 2.0, True, [0, "1"], [0, -1], {0, 1}])
def test_malformed_gpus(gpus):
    with pytest.raises(ValueError, match=r"gpus must be None \(every GPU\), an integer >= 2"):
        select_devices(gpus, 4, 1)


def test_repeated_ids():
    with pytest.raises(ValueError, match=r"must not repeat an id. Received: gpus=\[1, 1\]"):
        select_devices([1, 1], 4, 1)


def test_fingerprint_sees_every_value_shape_and_dtype():
    a = [np.arange(6, dtype="float32").reshape(2, 3), np.float32(2.0) * np.ones(())]
    same = [w.copy() for w in a]
    assert weights_fingerprint(a) == weights_fingerprint(same)
    changed = [a[0].copy(), a[1].copy()]
    changed[0][1, 2] = np.nextafter(changed[0][1, 2], np.float32(10))  # one ulp
    assert weights_fingerprint(changed) != weights_fingerprint(a)
    assert weights_fingerprint([a[0].reshape(3, 2), a[1]]) != weights_fingerprint(a)
    assert weights_fingerprint([a[0].astype("float64"), a[1]]) != weights_fingerprint(a)
    assert weights_fingerprint([np.asfortranarray(a[0]), a[1]]) == weights_fingerprint(a)


@pytest.mark.parametrize(
    "synced, template, parallel, action",
    [
        ("s", "s", "s", "none"),  # nothing changed
        ("s", "s", "p", "none"),  # only the parallel model trained or was loaded
        ("s", "t", "s", "pull"),  # weights were loaded into the template
        ("s", "t", "p", "conflict"),  # both changed, differently
        ("s", "x", "x", "none"),  # both changed, to the same values
    ],
)
def test_sync_action(synced, template, parallel, action):
    assert sync_action(synced, template, parallel) == action
