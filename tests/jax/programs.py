"""Trains the Keras-on-JAX programs of `tests/programs` (`JAX_PROGRAMS`) one way each.

`run(name, mode)` runs one program as its author does (`mode="one"`: plain Keras, one
device), or adapted as docs/jax.md says, nothing else changed: `@kmp.parallelize` on the
factory (`"devices"`: every device of this process; `"processes"`: in a job of several
processes), or `@kmp.parallelize(strategy="model_parallel", layout_map=...)` for a
large-model program (its own `layout_map()` where it has one). It returns plain values:
the weights after `fit`, the History, `evaluate`'s dict, `predict`'s outputs and what
the program's callbacks kept.

`every_program(mode)` runs each program in turn, the function `kmp.verify` runs
(`tests/jax/test_programs.py`): in the `"devices"` mode each large-model program again
with `strategy="model_parallel"`, one compared fit per run. As a script, kmp.verify's
reports (each figure against one device, with the program's float noise):

    python -m tests.jax.programs --table     # 2 devices (+ model_parallel), then 2 processes
"""

from __future__ import annotations

import importlib
import sys
import tempfile

import numpy as np

from tests.programs import JAX_PROGRAMS


def program(name: str):
    return importlib.import_module(f"tests.programs.{name}")


def run(name: str, mode: str) -> dict:
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


def runs_of(mode: str) -> list[tuple[str, str]]:
    """`(program, how)` in the order `every_program(mode)` trains them."""
    found = []
    for name in JAX_PROGRAMS:
        found.append((name, mode))
        if mode == "devices" and getattr(program(name), "LARGE", False):
            found.append((name, "model_parallel"))
    return found


def every_program(mode: str) -> None:
    """`run` of every program in `mode` (`"devices"`: each large-model one also
    `"model_parallel"`), one after the other: what `kmp.verify` runs."""
    for name, how in runs_of(mode):
        run(name, how)


def verified(mode: str):
    """`kmp.verify`'s report of `every_program(mode)`: 2 devices, or 2 processes."""
    import keras_mgpu_plugins as kmp

    return kmp.verify(every_program, num_workers=2, args=(mode,), steps=64,
                      fits=len(runs_of(mode)), processes=mode == "processes", timeout=1700)


def main(argv: list[str]) -> None:
    if argv != ["--table"]:
        sys.exit("usage: python -m tests.jax.programs --table")
    for mode in ("devices", "processes"):
        print("fits:", ", ".join(f"{i + 1} {n}/{h}" for i, (n, h) in enumerate(runs_of(mode))))
        print(verified(mode), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
