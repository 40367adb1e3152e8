"""The public API: `__all__` matches what exists, names fixed by the design."""

from __future__ import annotations

import keras_mgpu_plugins as kmp
from keras_mgpu_plugins import callbacks


def test_all_names_exist():
    for name in kmp.__all__:
        assert getattr(kmp, name) is not None, name
    assert sorted(kmp.__all__) == sorted(set(kmp.__all__))


def test_callbacks_all_names_exist():
    for name in callbacks.__all__:
        assert isinstance(getattr(callbacks, name), type), name


def test_fixed_names():
    assert callable(kmp.parallelize) and callable(kmp.topology) and callable(kmp.simulate_devices)
    assert callable(kmp.multi_gpu_model) and callable(kmp.compat.patch_keras)
    assert issubclass(kmp.WeightsOutOfSyncError, Exception)
    assert kmp.__version__


def test_launch_is_callable_even_after_its_module_is_imported():
    import keras_mgpu_plugins.launch as launch_module

    assert callable(kmp.launch) and callable(launch_module)
    assert kmp.launch.WorkerFailedError is launch_module.WorkerFailedError


def test_verify_is_callable_even_after_its_package_is_imported():
    import keras_mgpu_plugins.verify as verify_package

    assert callable(kmp.verify) and callable(verify_package)
    assert verify_package.VerifyReport is kmp.VerifyReport


def test_wandb_logger_importable_path():
    from keras_mgpu_plugins.integrations import wandb as kmp_wandb

    assert kmp_wandb.WandbLogger.__name__ == "WandbLogger"


def test_placement_report_names():
    from keras_mgpu_plugins.model_parallel.report import PlacementReport, placement_report

    assert kmp.placement_report is placement_report and kmp.PlacementReport is PlacementReport
