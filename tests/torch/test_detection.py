"""Every torch job is detected, even one kmp did not start: torchrun's variables or an
initialised process group make `kmp.topology()` and the runtime rank-aware; a model kmp did
not build is refused at its first fit where Keras would train one model per process."""

from __future__ import annotations

import pytest

from tests.torch import helpers

TORCHRUN = {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500"}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("TF_CONFIG", "SLURM_NTASKS", "SLURM_NPROCS", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 *TORCHRUN):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_torchrun_variables_make_topology_and_runtime_rank_aware(clean_env):
    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.cluster.processes import planned_processes

    for name, value in TORCHRUN.items():
        clean_env.setenv(name, value)
    topology = kmp.topology()
    assert (topology.worker_index, topology.num_workers, topology.is_chief) == (2, 4, False)
    assert topology.source == "torchrun"
    assert tuple(kmp.runtime.of().rank()) == (2, 4, False)  # no process group yet: the plan
    assert not kmp.runtime.of().spans_workers
    assert planned_processes() == ("10.0.0.1:29500", 4, 2, "torchrun")


def test_torchrun_variables_win_over_slurm_of_the_same_job(clean_env):
    from keras_mgpu_plugins.cluster.topology import topology_from_env

    env = {**TORCHRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": "n[1-2]"}
    assert topology_from_env(env).worker_index == 2  # torchrun under srun: one per GPU


def test_a_world_without_a_rank_is_refused_naming_it(clean_env):
    from keras_mgpu_plugins.cluster.topology import TopologyError, topology_from_env

    with pytest.raises(TopologyError, match="RANK"):
        topology_from_env({"WORLD_SIZE": "2"})
    assert topology_from_env({"WORLD_SIZE": "1", "RANK": "0"}).num_workers == 1


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_plain_keras_on_two_processes_is_refused_on_every_rank(tmp_path):
    """Keras 3.15 would train two separate models: kmp's callbacks refuse it at train begin,
    naming the versions and @kmp.parallelize."""
    import keras

    results = helpers.run_processes(tmp_path, "tests.torch.cases:plain_keras",
                                    {"callbacks": "yes"})
    assert [r["rank"] for r in results] == [(0, 2, True), (1, 2, False)]
    assert [r["topology"][:3] for r in results] == [(0, 2, True), (1, 2, False)]
    why = (f"Keras {keras.__version__} wraps the model in DistributedDataParallel only where a "
           "torch process group exists" if "dev" in keras.__version__ else
           f"Keras {keras.__version__} has no data parallelism in fit on torch")
    for result in results:
        assert result["fit"].startswith("SeparateModelsError: This process is rank")
        assert why in result["fit"] and "@kmp.parallelize" in result["fit"]


@pytest.mark.slow
@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_upstream_ddp_fit_with_kmp_callbacks_is_rank_aware(tmp_path):
    """keras-nightly: keras.distribution.initialize() starts the process group and Keras's fit
    wraps a plain model in DistributedDataParallel; kmp's callbacks then write on rank 0
    only. Keras 3.15 has no keras.distribution.initialize on torch (AttributeError)."""
    import keras

    results = helpers.run_processes(tmp_path, "tests.torch.cases:upstream_fit",
                                    {"folder": str(tmp_path)})
    if "dev" not in keras.__version__:
        assert all(r["fit"].startswith("AttributeError") for r in results), results
        return
    assert [r["fit"] for r in results] == ["trained", "trained"]
    assert [r["topology"] for r in results] == [[0, 2, True], [1, 2, False]]
    assert [r["writes"] for r in results] == [["plain.keras"], []]
    assert helpers.max_diff(results[0]["weights"], results[1]["weights"]) == 0.0


def test_simulate_devices_points_to_the_launcher():
    import keras_mgpu_plugins as kmp

    assert kmp.simulate_devices(1) == ["CPU:0"]
    with pytest.raises(NotImplementedError, match="one device per process.*kmp-launch -n 2"):
        kmp.simulate_devices(2)
