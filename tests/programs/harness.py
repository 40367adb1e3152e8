"""Trains the programs of `tests/programs` on one device, 2 devices or 2 workers.

`train(name, optimizer, parallel)` runs one program as its author does (plain
Keras) or adapted as README.md says (`@kmp.parallelize` on the factory, kmp's
callbacks) and returns plain values: the weights right after `fit`, the History,
what the final `evaluate` returns.

As a script it runs every program on 2 simulated devices in a fresh process and
pickles the results (a failure is kept as its traceback), or measures each
program's float noise on one device:

    python -m tests.programs.harness --two-devices OUT.pkl
    python -m tests.programs.harness --noise   # one device, rows reversed in each batch
    python -m tests.programs.harness --table   # 2 devices against plain Keras and kmp on one
"""

from __future__ import annotations

import argparse
import importlib
import pickle
import tempfile
import traceback

import numpy as np


def program(name: str):
    return importlib.import_module(f"tests.programs.{name}")


def _reverse_rows(array, batch_size, stop):
    """`array` with the rows of each batch among the first `stop` reversed."""
    out = np.array(array, copy=True)
    for start in range(0, stop, batch_size):
        end = min(start + batch_size, stop)
        out[start:end] = out[start:end][::-1]
    return out


def _reversed_batches(inputs: dict) -> dict:
    """The same global batches, each with its rows in the opposite order."""
    kwargs = dict(inputs["fit_kwargs"])
    if len(inputs["fit"]) == 1:  # a batched tf.data dataset
        import tensorflow as tf

        dataset = inputs["fit"][0].map(lambda x, y: (tf.reverse(x, [0]), tf.reverse(y, [0])))
        return {**inputs, "fit": (dataset,)}
    rows = len(inputs["fit"][0])
    stop = int(np.ceil(rows * (1.0 - kwargs.get("validation_split", 0.0))))  # as Keras splits
    fit = tuple(_reverse_rows(a, kwargs["batch_size"], stop) for a in inputs["fit"])
    return {**inputs, "fit": fit}


def train(name: str, optimizer: str, parallel: bool | str, reverse_batches: bool = False) -> dict:
    """One run of program `name`: `{"weights", "history", "evaluate"}`.

    Args:
        name: A module of `tests.programs` (see `PROGRAMS`).
        optimizer: `"program"` (the example's own) or `"sgd"`.
        parallel: Adapted as README.md says: `kmp.parallelize` on `build`, kmp's callbacks.
            A strategy name (`"default"`: one device) is passed to `kmp.parallelize`.
        reverse_batches: Reverse the rows inside each training batch (the float noise of
            a different summation order on one device).
    """
    module = program(name)
    build = module.build
    if parallel:
        import keras_mgpu_plugins as kmp

        build = (kmp.parallelize(strategy=parallel)(build) if isinstance(parallel, str)
                 else kmp.parallelize(build))
    model = build(optimizer)
    inputs = module.data()
    if reverse_batches:
        inputs = _reversed_batches(inputs)
    with tempfile.TemporaryDirectory() as directory:
        callbacks = module.callbacks(directory, parallel) if hasattr(module, "callbacks") else []
        history = model.fit(*inputs["fit"], shuffle=False, verbose=0, callbacks=callbacks,
                            **inputs["fit_kwargs"])
        weights = [np.array(w) for w in model.get_weights()]
        if hasattr(module, "after_fit"):
            module.after_fit(model, directory)
    evaluation = model.evaluate(verbose=0, return_dict=True, **inputs["evaluate"])
    return {"weights": weights, "history": history.history,
            "evaluate": {k: float(v) for k, v in evaluation.items()}}


def try_train(name: str, optimizer: str, parallel: bool) -> dict:
    """`train`, or `{"error": traceback}`: one failing program leaves the others to run."""
    try:
        return train(name, optimizer, parallel)
    except Exception:  # reported to the test, which names the case
        return {"error": traceback.format_exc()}


def on_each_worker(cases: list[tuple[str, str]]) -> dict:
    """For `kmp.launch`: each case trained as adapted, on this worker."""
    return {case: try_train(*case, parallel=True) for case in cases}


def largest_difference(got: dict, want: dict) -> dict:
    """Max abs difference of the weights, of each History key, of each evaluate value."""
    weights = max(float(np.max(np.abs(a - b))) for a, b in zip(got["weights"], want["weights"],
                                                                 strict=True))
    history = {k: float(np.max(np.abs(np.subtract(got["history"].get(k, np.nan), v))))
               for k, v in want["history"].items()}
    evaluate = {k: abs(got["evaluate"].get(k, np.nan) - v) for k, v in want["evaluate"].items()}
    return {"weights": weights, "history": history, "evaluate": evaluate}


def main(argv: list[str] | None = None) -> None:
    from tests.programs import OPTIMIZERS, PROGRAMS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--two-devices", metavar="OUT", help="pickle every case run on 2 devices")
    parser.add_argument("--noise", action="store_true", help="print each program's float noise")
    parser.add_argument("--table", action="store_true",
                        help="print each case's weight difference on 2 devices from one device, "
                             "plain Keras and adapted")
    parser.add_argument("--programs", nargs="*", default=list(PROGRAMS))
    args = parser.parse_args(argv)
    if args.two_devices:
        import keras_mgpu_plugins as kmp

        kmp.simulate_devices(2)  # before any TensorFlow work, as a user's script does
        results = {(n, o): try_train(n, o, parallel=True) for n in args.programs for o in OPTIMIZERS}
        with open(args.two_devices, "wb") as f:
            pickle.dump(results, f)
    if args.table:
        import os
        import subprocess
        import sys
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "two.pkl")
            subprocess.run([sys.executable, "-m", "tests.programs.harness", "--two-devices", out,
                            "--programs", *args.programs], check=True)
            with open(out, "rb") as f:
                two = pickle.load(f)
        for name in args.programs:
            for optimizer in OPTIMIZERS:
                plain = train(name, optimizer, parallel=False)
                adapted = train(name, optimizer, parallel="default")
                versus_plain = largest_difference(two[name, optimizer], plain)["weights"]
                versus_adapted = largest_difference(two[name, optimizer], adapted)["weights"]
                print(f"{name} {optimizer} 2 devices vs plain Keras on one: {versus_plain:.1e}, "
                      f"vs adapted on one: {versus_adapted:.1e}", flush=True)
    if args.noise:
        for name in args.programs:
            for optimizer in OPTIMIZERS:
                one = train(name, optimizer, parallel=False)
                flipped = train(name, optimizer, parallel=False, reverse_batches=True)
                print(name, optimizer, largest_difference(flipped, one), flush=True)


if __name__ == "__main__":
    main()
