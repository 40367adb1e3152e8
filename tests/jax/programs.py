"""Trains the Keras-on-JAX programs of `tests/programs` (`JAX_PROGRAMS`) one way each.

`run(name, mode)` runs one program as its author does (`mode="one"`: plain Keras, one
device), or adapted as docs/jax.md says, nothing else changed: `@kmp.parallelize` on the
factory (`"devices"`: every device of this process; `"processes"`: inside a `kmp.launch`
worker), or `@kmp.parallelize(strategy="model_parallel", layout_map=...)` for a
large-model program (its own `layout_map()` where it has one). It returns plain values:
the weights after `fit`, the History, `evaluate`'s dict, `predict`'s outputs and what
the program's callbacks kept.

As a script, in a fresh process (JAX reads its device count once):

    python -m tests.jax.programs one OUT.pkl       # one device, and each program's noise
    python -m tests.jax.programs devices OUT.pkl   # 2 simulated devices (+ model_parallel)
    python -m tests.jax.programs --table           # all of it, and 2 processes: the figures
"""

from __future__ import annotations

import importlib
import pickle
import sys
import tempfile
import traceback

import numpy as np

from tests.programs import JAX_PROGRAMS


def program(name: str):
    return importlib.import_module(f"tests.programs.{name}")


def run(name: str, mode: str, reverse_batches: bool = False) -> dict:
    """One run of program `name` in `mode` (see the module docstring)."""
    import keras

    module = program(name)
    build = module.build
    if mode in ("devices", "processes"):
        import keras_mgpu_plugins as kmp

        build = kmp.parallelize(build)
    elif mode == "model_parallel":
        import keras_mgpu_plugins as kmp

        layout_map = module.layout_map() if hasattr(module, "layout_map") else None
        build = kmp.parallelize(strategy="model_parallel", layout_map=layout_map)(build)
    model = build()
    inputs = module.data()
    if reverse_batches:
        inputs = _reversed_batches(inputs)
    with tempfile.TemporaryDirectory() as directory:
        callbacks = module.callbacks(directory, mode != "one") if hasattr(
            module, "callbacks") else []
        history = model.fit(*inputs["fit"], shuffle=False, verbose=0, callbacks=callbacks,
                            **inputs["fit_kwargs"])
    weights = [np.asarray(w) for w in model.get_weights()]
    evaluated = model.evaluate(**inputs["evaluate"], verbose=0, return_dict=True)
    predicted = keras.tree.flatten(model.predict(**inputs["predict"], verbose=0))
    return {"weights": weights, "history": history.history,
            "evaluate": {k: float(v) for k, v in evaluated.items()},
            "predict": [np.asarray(p) for p in predicted],
            "generated": [c.generated for c in callbacks if hasattr(c, "generated")]}


def _reversed_batches(inputs: dict) -> dict:
    """The same global batches, each with its rows in the opposite order (float noise)."""
    import keras

    batch = inputs["fit_kwargs"]["batch_size"]

    def reverse(array):
        out = np.array(array, copy=True)
        for start in range(0, len(out), batch):
            out[start:start + batch] = out[start:start + batch][::-1]
        return out

    return {**inputs, "fit": tuple(keras.tree.map_structure(reverse, a) for a in inputs["fit"])}


def every_program(mode: str) -> dict:
    """`run` of every program in `mode` (a failure kept as its traceback); in the "one" mode
    also each program's noise, in the "devices" mode also model_parallel."""
    found = {}
    for name in JAX_PROGRAMS:
        runs = [(mode, False)]
        if mode == "one":
            runs.append(("one", True))
        if mode == "devices" and getattr(program(name), "LARGE", False):
            runs.append(("model_parallel", False))
        for how, reverse in runs:
            key = f"{name}/{'noise' if reverse else how}"
            try:
                found[key] = run(name, how, reverse)
            except Exception:  # noqa: BLE001 - kept for the test's message
                found[key] = {"error": traceback.format_exc()}
    return found


def on_processes() -> dict:
    """What each `kmp.launch` worker runs: every program on 2 processes."""
    return every_program("processes")


def largest_difference(got: dict, want: dict) -> dict:
    """The largest absolute differences: weights, History, evaluate, predict."""
    def most(pairs) -> float:
        return max((float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
                    for a, b in pairs), default=0.0)

    return {"weights": most(zip(got["weights"], want["weights"], strict=True)),
            "history": most((got["history"][k], want["history"][k]) for k in want["history"]),
            "evaluate": most((got["evaluate"][k], want["evaluate"][k]) for k in want["evaluate"]),
            "predict": most(zip(got["predict"], want["predict"], strict=True))}


def main(argv: list[str]) -> None:
    if argv[0] == "--table":
        _table()
        return
    mode, out = argv
    if mode == "devices":
        import keras_mgpu_plugins as kmp

        kmp.simulate_devices(2)
    with open(out, "wb") as f:
        pickle.dump(every_program(mode), f)


def _table() -> None:
    """Every program and mode against one device, with the program's noise: the figures of
    docs/jax.md ("Programs written by others")."""
    from tests.jax import test_programs

    runs = test_programs.all_runs(tempfile.mkdtemp())
    print("| program | mode | weights | History | evaluate | predict | noise (weights) |")
    print("|---|---|---|---|---|---|---|")
    for name in JAX_PROGRAMS:
        one, noise = runs["one"][f"{name}/one"], runs["one"][f"{name}/noise"]
        level = largest_difference(noise, one)["weights"]
        for mode, found in test_programs.candidates(runs, name):
            d = largest_difference(found, one)
            print(f"| {name} | {mode} | {d['weights']:.1e} | {d['history']:.1e} | "
                  f"{d['evaluate']:.1e} | {d['predict']:.1e} | {level:.1e} |")


if __name__ == "__main__":
    main(sys.argv[1:])
