"""`kmp.verify` and `kmp-verify`: prove that N devices train as one device, or learn where
they part.

The user's unchanged, `@kmp.parallelize`d script (or function) runs on one device, on
one device with each training batch's rows reversed (its float noise), and on N devices
(simulated by default) or N processes, every run from the same seed. The first `fit`'s
first steps are recorded (logs, variables), then `evaluate` and `predict` where the
script calls them; the report says whether every figure is within noise, or the step,
variables and likely cause where the runs part, or why they cannot be compared.
Backend-free: the runs are the launcher's worker processes (`_runs`); what they record
is `_hooks` / `_recorder`; the comparison `_compare`, `_checks`, `_causes`; the report
`_report`; the command `_cli`.
"""

from __future__ import annotations

import copyreg
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_mgpu_plugins.verify._report import CANNOT, DIFFER, EQUAL, VerifyReport
from keras_mgpu_plugins.verify._verification import DEFAULT_STEPS

__all__ = ["CANNOT", "DIFFER", "EQUAL", "VerifyReport", "main", "verify"]



def verify(fn: Callable[..., Any], num_workers: int = 2, args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None, *, steps: int = DEFAULT_STEPS,
           tolerance: float | None = None, processes: bool = False,
           json_path: str | None = None, timeout: float | None = None,
           log_dir: str | None = None, random_layers: str = "one_device",
           fits: int = 1) -> VerifyReport:
    """Runs `fn(*args, **kwargs)` on one device and on `num_workers` devices, and compares.

    `fn` builds its model with a `@kmp.parallelize` factory and calls `fit` (then, if it
    likes, `evaluate` and `predict`), as a training script does. It runs in fresh worker
    processes (as `kmp.launch` runs it: cloudpickled), three times from the same seed
    (Python's `random`, NumPy's global generator, Keras and its backend): on one device;
    on one device with the rows of each training batch reversed (the noise: the sums of
    N replicas come in another order); and on `num_workers` simulated devices in one
    process (`kmp.simulate_devices`), or `num_workers` processes with `processes=True`.
    On torch, which trains one device per process, it is always `num_workers` processes.
    A call to `kmp.simulate_devices(n)` or `kmp.launch` inside `fn` follows the run.

    The first `steps` training steps of the first `fit` are recorded (the loss and metrics
    after each step, a sample of every variable; each epoch's validation logs; every
    variable at the end), then the fit stops; the first `evaluate`'s results and the first
    `predict`'s outputs after it. A figure is within noise when its difference from one
    device is at most 10 times its difference in the noise run (1e-6 at least), or
    `tolerance` when given (then the noise run is skipped).

    Args:
        fn: The training function.
        num_workers: N, the devices (or processes) of the parallel run, at least 2.
        args: Positional arguments for `fn`.
        kwargs: Keyword arguments for `fn`.
        steps: Training steps of the first `fit` to compare (the fit stops after them).
        tolerance: An absolute tolerance for every figure instead of the measured noise.
        processes: N processes (one device each) instead of N devices in one process.
        json_path: Where to write the report as JSON.
        timeout: Seconds each run may take (`None`: no limit).
        log_dir: Folder of the runs' outputs (default: a new temporary folder, kept).
        random_layers: `"one_device"`: the random layers (Dropout, GaussianNoise, random
            augmentation) of the models `@kmp.parallelize` builds draw one device's numbers
            in every run (`@kmp.parallelize(random_layers="one_device")`), so that they do
            not make the comparison meaningless; `"script"`: as the script says.
        fits: How many of the script's fits to compare (the first ones), each with the
            `evaluate` and `predict` that follow it.

    Returns:
        A `VerifyReport`: `.verdict` is `"equal"`, `"differ"` or `"cannot compare"`;
        `.ok` whether equal; `str(report)` the table.

    Raises:
        ValueError: For a bad `num_workers`, `steps`, `tolerance` or `timeout`.
        NotPicklableError: If `fn`, `args` or `kwargs` cannot be pickled.

    Example:
        >>> report = kmp.verify(train, num_workers=2, steps=16)
        >>> print(report)
        >>> assert report.ok, report
    """
    from keras_mgpu_plugins.launch import _pickle_payload
    from keras_mgpu_plugins.verify._runs import Target
    from keras_mgpu_plugins.verify._verification import check, run

    check(num_workers, steps, tolerance, timeout, random_layers, fits)
    payload = _pickle_payload(fn, tuple(args), dict(kwargs or {}))
    return run(Target(payload=payload), num_workers, steps=steps, tolerance=tolerance,
               processes=processes, json_path=json_path, timeout=timeout, log_dir=log_dir,
               random_layers=random_layers, fits=fits)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kmp-verify` and `python -m keras_mgpu_plugins.verify`."""
    from keras_mgpu_plugins.verify._cli import main as cli

    return cli(argv)


# `kmp.verify` may be this function or, once this package was imported by name (every
# `@kmp.parallelize` of a verify run imports `verify._config`), the package itself: either
# way `kmp.verify(fn)` runs, as `kmp.launch` does (`launch._CallableModule`).
class _CallableModule(types.ModuleType):
    __call__ = staticmethod(verify)


def _import_again(module: types.ModuleType) -> tuple:
    import importlib

    return importlib.import_module, (module.__name__,)


sys.modules[__name__].__class__ = _CallableModule
copyreg.pickle(_CallableModule, _import_again)
