"""Parameter-server pieces that need no cluster: the partitioning choice, a sharded
variable's gradient joined, the bad inputs fit refuses before any step."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_mgpu_plugins.backends.tensorflow.parameter_server import data as ps_data
from keras_mgpu_plugins.backends.tensorflow.patches import sharded
from keras_mgpu_plugins.cluster.partition import DEFAULT_MIN_SHARD_BYTES, Partition


def test_partition_defaults_and_errors_name_the_argument():
    assert Partition().is_default and "min_shard_bytes=262144" in Partition().describe()
    assert DEFAULT_MIN_SHARD_BYTES == 256 << 10
    assert Partition(min_shard_bytes=1 << 20, max_shards=4).key() == ("auto", 1 << 20, 4)
    for kwargs, fragment in [({"min_shard_bytes": 0}, "min_shard_bytes=0"),
                             ({"max_shards": "2"}, "max_shards='2'"),
                             ({"variable_partitioner": "even"}, "variable_partitioner='even'"),
                             ({"variable_partitioner": None, "max_shards": 2}, "decides alone")]:
        with pytest.raises(ValueError, match=fragment):
            Partition(**kwargs)


def test_a_sharded_gradient_is_one_indexed_slices_of_the_whole_table():
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    table = ShardedVariable([tf.Variable(tf.zeros((3, 2))), tf.Variable(tf.zeros((2, 2)))])
    parts = [tf.IndexedSlices(tf.ones((1, 2)), tf.constant([2])), tf.ones((2, 2)) * 3]
    joined = sharded._join(parts, table)
    dense = tf.convert_to_tensor(joined).numpy()
    np.testing.assert_array_equal(dense, [[0, 0], [0, 0], [1, 1], [3, 3], [3, 3]])
    assert sharded._join([None, None], table) is None


def rows(n=10):
    return np.zeros((n, 3), "float32"), np.zeros((n, 1), "float32")


def test_array_input_deals_each_row_once_per_pass_in_order():
    x, y = rows(10)
    source = ps_data.make(None, x, y, None, 4, False, None, None)
    assert source.steps == 3  # ceil(10 / 4), derived from the arrays
    dealt = [source.args(2), source.args(1), source.args(1)]
    np.testing.assert_array_equal(dealt[0][0], np.arange(8))
    np.testing.assert_array_equal(dealt[0][1], [0, 4, 8])
    np.testing.assert_array_equal(dealt[1][0], [8, 9])
    np.testing.assert_array_equal(dealt[2][0], [0, 1, 2, 3])  # the next pass


def test_class_weight_becomes_sample_weight():
    x = np.zeros((3, 2), "float32")
    y = np.array([0, 1, 1])
    source = ps_data.make(None, x, y, None, 2, False, {0: 1.0, 1: 3.0}, None)
    np.testing.assert_array_equal(source.data[2], [1.0, 3.0, 3.0])


def test_steps_per_epoch_required_where_the_length_is_unknown():
    x, y = rows()
    repeated = tf.data.Dataset.from_tensor_slices((x, y)).batch(2).repeat()
    with pytest.raises(ValueError, match="steps_per_epoch is required.*infinite") as info:
        ps_data.make(None, repeated, None, None, None, True, None, None)
    assert "Received: steps_per_epoch=None" in str(info.value)
    with pytest.raises(ValueError, match="steps_per_epoch is required.*unknown"):
        ps_data.make(None, lambda: tf.data.Dataset.range(4), None, None, None, True, None, None)


def test_a_dataset_that_calls_python_cannot_be_made_per_worker():
    def gen():
        yield np.zeros(3, "float32"), np.zeros(1, "float32")

    spec = (tf.TensorSpec((3,), tf.float32), tf.TensorSpec((1,), tf.float32))
    generated = tf.data.Dataset.from_generator(gen, output_signature=spec).batch(2)
    for x in (generated, lambda: tf.data.Dataset.from_generator(gen, output_signature=spec)):
        with pytest.raises(ValueError, match="cannot be made on each worker: it calls Python"):
            ps_data.make(None, x, None, None, None, True, None, 5)
    with pytest.raises(ValueError, match="returns a dataset made outside it"):
        ps_data.make(None, lambda: generated, None, None, None, True, None, 5)


@pytest.mark.parametrize("x, fragment", [
    (iter([1, 2]), "x of type list_iterator"),
    (None, "x of type NoneType"),
])
def test_inputs_the_workers_cannot_read_are_named(x, fragment):
    with pytest.raises(ValueError, match=fragment):
        ps_data.make(None, x, None, None, 4, True, None, None)


def test_batch_size_beside_a_dataset_is_refused():
    x, y = rows()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    with pytest.raises(ValueError, match="batch_size applies to NumPy inputs.*batch_size=4"):
        ps_data.make(None, dataset, None, None, 4, True, None, None)


def test_a_callback_needing_every_worker_is_refused_naming_it():
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.tensorflow.parameter_server import fit as ps_fit

    ps_fit.check_callbacks([kmp.callbacks.EarlyStopping(), kmp.callbacks.BackupAndRestore("b")])
    with pytest.raises(ValueError) as info:
        ps_fit.check_callbacks([kmp.callbacks.WeightSyncVerifier()])
    message = str(info.value)
    assert "WeightSyncVerifier needs every worker" in message and "only the chief runs fit" in message
    assert "strategy='mirrored' and 'multi_worker'" in message


PS_CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}


def chief_of(monkeypatch, cluster=PS_CLUSTER, task="chief"):
    import json

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": task, "index": 0}}))


@pytest.mark.parametrize("strategy", ["mirrored", "multi_worker"])
def test_all_reduce_on_a_parameter_server_cluster_is_refused(monkeypatch, strategy):
    import keras_mgpu_plugins as kmp

    chief_of(monkeypatch)
    with pytest.raises(ValueError) as info:
        kmp.parallelize(strategy=strategy)
    message = str(info.value)
    assert f"strategy={strategy!r}" in message and 'strategy="parameter_server"' in message
    assert "ps=['localhost:3']" in message


def test_parameter_server_without_parameter_servers_says_how_to_start_them(monkeypatch):
    import keras_mgpu_plugins as kmp

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="kmp-launch -n 2 --ps 1 train.py"):
        kmp.parallelize(strategy="parameter_server")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"devices": ["/cpu:0"]}, "devices does not apply to strategy='parameter_server'"),
    ({"sync_batchnorm": True}, "sync_batchnorm does not apply"),
    ({"micro_batches": 2}, "micro_batches does not apply"),
])
def test_arguments_of_other_strategies_are_refused(monkeypatch, kwargs, fragment):
    import keras_mgpu_plugins as kmp

    chief_of(monkeypatch)  # refused before the chief connects
    with pytest.raises(ValueError, match=fragment):
        kmp.parallelize(strategy="parameter_server", **kwargs)


def test_partitioning_without_parameter_servers_is_refused(monkeypatch):
    import keras_mgpu_plugins as kmp

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="apply to strategy='parameter_server'.*max_shards=2"):
        kmp.parallelize(strategy="mirrored", max_shards=2)
