"""Topology is a pure function of the environment: tested on many shapes."""

from __future__ import annotations

import json
import os

import pytest

from keras_mgpu_plugins.topology import (
    Topology,
    TopologyError,
    expand_hostlist,
    expand_tasks_per_node,
    gpus_from_env,
    topology_from_env,
)


def tf_config(cluster, task_type, index):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


def test_single_process_by_default():
    topo = topology_from_env({}, ["CPU:0"])
    assert topo == Topology(local_devices=("CPU:0",))
    assert topo.is_chief and not topo.is_multi_worker and topo.num_local_devices == 1
    assert topo.tf_config() is None


@pytest.mark.parametrize("index, chief", [(0, True), (1, False), (2, False)])
def test_workers_only_worker_zero_is_chief(index, chief):
    cluster = {"worker": ["a:1", "b:2", "c:3"]}
    topo = topology_from_env(tf_config(cluster, "worker", index))
    assert (topo.num_workers, topo.worker_index, topo.is_chief) == (3, index, chief)
    assert topo.source == "tf_config" and topo.task_type == "worker"
    assert topo.tf_config() == {"cluster": cluster, "task": {"type": "worker", "index": index}}


def test_explicit_chief_is_chief_and_workers_shift():
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    chief = topology_from_env(tf_config(cluster, "chief", 0))
    worker0 = topology_from_env(tf_config(cluster, "worker", 0))
    assert (chief.num_workers, chief.worker_index, chief.is_chief) == (3, 0, True)
    assert (worker0.worker_index, worker0.is_chief) == (1, False)


def test_evaluator_is_not_chief_and_not_counted():
    cluster = {"worker": ["w:1", "w:2"], "evaluator": ["e:1"]}
    topo = topology_from_env(tf_config(cluster, "evaluator", 0))
    assert topo.num_workers == 2 and not topo.is_chief


def test_string_index_is_accepted():
    topo = topology_from_env(tf_config({"worker": ["a:1", "b:2"]}, "worker", "1"))
    assert topo.worker_index == 1


def test_one_worker_cluster_is_not_multi_worker():
    topo = topology_from_env(tf_config({"worker": ["a:1"]}, "worker", 0))
    assert topo.num_workers == 1 and not topo.is_multi_worker and topo.is_chief


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), 'TF_CONFIG["cluster"]'),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), 'TF_CONFIG["task"]'),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}), "type='chief'"),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}), "index=1"),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}), "index=-1"),
        (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": True}}), "index=True"),
        (json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}), "non-empty list"),
        (json.dumps({"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}}), "'nohost'"),
        (json.dumps({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}), "'a:99999'"),
        (json.dumps({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker", "index": 0}}), "parameter-server"),
        (json.dumps({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}), "at most one"),
    ],
)
def test_malformed_tf_config_names_the_bad_field(raw, fragment):
    with pytest.raises(TopologyError) as info:
        topology_from_env({"TF_CONFIG": raw})
    assert fragment in str(info.value)


PS_CLUSTER = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}


@pytest.mark.parametrize("task_type, index, serves, chief, rank", [
    ("chief", 0, False, True, 0), ("worker", 1, True, False, 2), ("ps", 1, True, False, 0)])
def test_parameter_server_cluster_tasks(task_type, index, serves, chief, rank):
    topo = topology_from_env(tf_config(PS_CLUSTER, task_type, index))
    assert topo.num_ps == 2 and topo.is_parameter_server_cluster
    assert (topo.serves, topo.is_chief, topo.worker_index) == (serves, chief, rank)
    assert topo.num_workers == 3  # the chief and the workers, as without parameter servers


def test_cluster_without_ps_is_no_parameter_server_cluster():
    topo = topology_from_env(tf_config({"chief": ["c:1"], "worker": ["w:1"]}, "worker", 0))
    assert topo.num_ps == 0 and not topo.is_parameter_server_cluster and not topo.serves


@pytest.mark.parametrize("cluster, fragment", [
    ({"worker": ["a:1"], "ps": ["p:1"]}, 'exactly one "chief"'),
    ({"chief": ["c:1"], "ps": ["p:1"]}, 'at least one "worker"'),
])
def test_parameter_server_cluster_needs_a_chief_and_a_worker(cluster, fragment):
    task = "ps"
    with pytest.raises(TopologyError) as info:
        topology_from_env(tf_config(cluster, task, 0))
    assert fragment in str(info.value) and "Received: task types" in str(info.value)


def test_tf_config_takes_precedence_over_slurm():
    env = {**tf_config({"worker": ["a:1", "b:2"]}, "worker", 1), "SLURM_NTASKS": "4", "SLURM_PROCID": "3"}
    assert topology_from_env(env).source == "tf_config"


def slurm(ntasks, procid, nodelist, per_node=None, **extra):
    env = {"SLURM_NTASKS": str(ntasks), "SLURM_PROCID": str(procid), "SLURM_STEP_NODELIST": nodelist}
    if per_node is not None:
        env["SLURM_STEP_TASKS_PER_NODE"] = per_node
    return {**env, **extra}


def test_slurm_builds_cluster_like_tensorflows_resolver():
    topo = topology_from_env(slurm(4, 2, "gpu[01-02]", "2(x2)"))
    assert topo.source == "slurm"
    assert (topo.num_workers, topo.worker_index, topo.is_chief) == (4, 2, False)
    assert topo.cluster_spec == {"worker": ("gpu01:8888", "gpu01:8889", "gpu02:8888", "gpu02:8889")}
    assert topo.task_type == "worker" and topo.task_index == 2


def test_slurm_port_base_and_uneven_tasks():
    topo = topology_from_env(slurm(3, 0, "a,b", "2,1", KMP_SLURM_PORT_BASE="9000"))
    assert topo.cluster_spec == {"worker": ("a:9000", "a:9001", "b:9000")}
    assert topo.is_chief


def test_slurm_without_tasks_per_node_spreads_evenly():
    topo = topology_from_env(slurm(2, 1, "n[1-2]"))
    assert topo.cluster_spec == {"worker": ("n1:8888", "n2:8888")}


def test_srun_step_task_count_wins_over_the_jobs():
    """`sbatch --ntasks=8` then `srun -n 2`: the step's 2 tasks train together."""
    env = slurm(8, 1, "n[1-2]", "1(x2)", SLURM_STEP_NUM_TASKS="2")
    topo = topology_from_env(env)
    assert (topo.num_workers, topo.worker_index) == (2, 1)
    assert topo.cluster_spec == {"worker": ("n1:8888", "n2:8888")}


def test_single_slurm_task_is_single_process():
    assert topology_from_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}).source == "local"


@pytest.mark.parametrize(
    "env, fragment",
    [
        (slurm(2, 2, "a,b"), "SLURM_PROCID"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "NODELIST"),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n[1-4]"},
         "SLURM_NTASKS=4, but this process is not a task of a SLURM job step"),
        (slurm(3, 0, "a,b", "1,1"), "do not add up"),
        ({"SLURM_NTASKS": "two", "SLURM_PROCID": "0"}, "SLURM_NTASKS='two'"),
        (slurm(2, 0, "a[1-"), "Unbalanced"),
    ],
)
def test_malformed_slurm(env, fragment):
    with pytest.raises(TopologyError) as info:
        topology_from_env(env)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node1", ["node1"]),
        ("a,b", ["a", "b"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("x[8-10]-ib", ["x8-ib", "x9-ib", "x10-ib"]),
        ("n[1-2],login[5]", ["n1", "n2", "login5"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["n[3-1]", "n[a-b]"])
def test_expand_hostlist_rejects_bad_ranges(bad):
    with pytest.raises(TopologyError):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    "spec, counts", [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("1,4(x2)", [1, 4, 4])]
)
def test_expand_tasks_per_node(spec, counts):
    assert expand_tasks_per_node(spec) == counts


def test_topology_is_frozen():
    with pytest.raises(AttributeError):
        Topology().num_workers = 3  # type: ignore[misc]


def test_topology_reads_environment_at_call_time(monkeypatch):
    import keras_mgpu_plugins as kmp

    assert kmp.topology().num_workers == 1
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:2"]}, "worker", 1)["TF_CONFIG"])
    topo = kmp.topology()
    assert (topo.num_workers, topo.worker_index, topo.is_chief) == (2, 1, False)
    import keras

    split = keras.backend.backend() in ("tensorflow", "jax")  # by tests/conftest.py
    assert topo.local_devices == (("CPU:0", "CPU:1") if split else ("CPU:0",))  # torch: one


@pytest.mark.parametrize(
    "env, driver, want",
    [
        ({}, False, 0),  # no driver: no GPU, whatever CUDA_VISIBLE_DEVICES says
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, False, 0),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, True, 2),
        ({"CUDA_VISIBLE_DEVICES": "1"}, None, 1),
        ({"CUDA_VISIBLE_DEVICES": ""}, True, 0),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, True, 0),
        ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, True, 1),  # CUDA stops at the first invalid entry
        ({}, True, None),  # a driver and no CUDA_VISIBLE_DEVICES: TensorFlow must say
        ({}, None, None),
    ],
)
def test_gpus_from_env(env, driver, want):
    assert gpus_from_env(env, driver) == want


@pytest.mark.parametrize("visible", [None, "", "0,1"])
def test_topology_does_not_import_tensorflow_where_the_environment_answers(visible):
    """A fresh process: `kmp.topology()` leaves TensorFlow unimported (it costs seconds)."""
    import subprocess
    import sys

    from keras_mgpu_plugins.cluster.local_devices import _has_gpu_driver

    driver = _has_gpu_driver()
    if visible is None and driver is not False:
        pytest.skip("a GPU driver is present: without CUDA_VISIBLE_DEVICES, TensorFlow must say")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = ("import sys, json; import keras_mgpu_plugins as kmp; t = kmp.topology(); "
            "print(json.dumps(['tensorflow' in sys.modules, list(t.local_devices)]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()[-1]
    imported, devices = json.loads(out)
    assert not imported
    assert devices == (["GPU:0", "GPU:1"] if visible == "0,1" and driver is not False else ["CPU:0"])
