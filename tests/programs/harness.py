"""Trains the programs of `tests/programs` on one device, as adapted for several.

`train(name, optimizer, parallel)` runs one program as its author does (plain
Keras) or adapted as README.md says (`@kmp.parallelize` on the factory, kmp's
callbacks) and returns plain values: the weights right after `fit`, the History,
what the final `evaluate` returns. `every_case(cases)` trains each case adapted, one
after the other: what `kmp.verify` runs on one device and on 2 devices or workers
(`tests/integration/test_keras_io_programs.py`), one compared fit per case.

As a script it prints kmp.verify's report of every case on 2 devices (each figure's
difference from one device and its float noise: the same program on one device with
the rows of each batch reversed):

    python -m tests.programs.harness --table          # (or --noise: the same report)
    python -m tests.programs.harness --table --programs mnist_convnet
    KERAS_BACKEND=torch python -m tests.programs.harness --table --programs mnist_convnet \
        vision_transformer text_transformer           # torch: 2 processes (--processes)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import tempfile

import numpy as np


def program(name: str):
    return importlib.import_module(f"tests.programs.{name}")


def train(name: str, optimizer: str, parallel: bool | str) -> dict:
    """One run of program `name`: `{"weights", "history", "evaluate"}`.

    Args:
        name: A module of `tests.programs` (see `PROGRAMS`).
        optimizer: `"program"` (the example's own) or `"sgd"`.
        parallel: Adapted as README.md says: `kmp.parallelize` on `build`, kmp's callbacks.
            A strategy name (`"default"`: one device) is passed to `kmp.parallelize`.
    """
    module = program(name)
    build = module.build
    if parallel:
        import keras_mgpu_plugins as kmp

        build = (kmp.parallelize(strategy=parallel)(build) if isinstance(parallel, str)
                 else kmp.parallelize(build))
    model = build(optimizer)
    inputs = module.data()
    with _files_folder(f"{name}-{optimizer}") as directory:
        callbacks = module.callbacks(directory, parallel) if hasattr(module, "callbacks") else []
        history = model.fit(*inputs["fit"], shuffle=False, verbose=0, callbacks=callbacks,
                            **inputs["fit_kwargs"])
        weights = [np.array(w) for w in model.get_weights()]
        if hasattr(module, "after_fit"):
            module.after_fit(model, directory)
    evaluation = model.evaluate(verbose=0, return_dict=True, **inputs["evaluate"])
    return {"weights": weights, "history": history.history,
            "evaluate": {k: float(v) for k, v in evaluation.items()}}


@contextlib.contextmanager
def _files_folder(case: str):
    """Where a program writes its checkpoints: one folder for every process of a job (its
    chief writes, every process loads, as a user's script with a fixed path does), else a
    temporary one."""
    job_dir = os.environ.get("KMP_JOB_DIR")  # one per job: per kmp.verify run
    if not job_dir:
        with tempfile.TemporaryDirectory() as directory:
            yield directory
        return
    directory = os.path.join(job_dir, "program-files", case)
    os.makedirs(directory, exist_ok=True)
    yield directory


def every_case(cases: list[tuple[str, str]]) -> None:
    """Each case trained as adapted (`train(..., parallel=True)`), in order: the function
    `kmp.verify` runs, one compared fit (with its evaluate) per case."""
    for case in cases:
        train(*case, parallel=True)


def all_cases(programs: tuple[str, ...] | list[str] | None = None) -> list[tuple[str, str]]:
    from tests.programs import OPTIMIZERS, PROGRAMS

    return [(n, o) for n in (programs or PROGRAMS) for o in OPTIMIZERS]


def verified(cases: list[tuple[str, str]], processes: bool = False):
    """`kmp.verify`'s report of `cases` (every step of each case's fit compared) on 2
    devices, or 2 workers with `processes`."""
    import keras_mgpu_plugins as kmp

    return kmp.verify(every_case, num_workers=2, args=(cases,), steps=STEPS,
                      fits=len(cases), processes=processes, timeout=1200)


#: Steps compared of each program's fit: every one (the largest trains 36).
STEPS = 64


def largest_difference(got: dict, want: dict) -> dict:
    """Max abs difference of the weights, of each History key, of each evaluate value."""
    weights = max(float(np.max(np.abs(a - b))) for a, b in zip(got["weights"], want["weights"],
                                                                 strict=True))
    history = {k: float(np.max(np.abs(np.subtract(got["history"].get(k, np.nan), v))))
               for k, v in want["history"].items()}
    evaluate = {k: abs(got["evaluate"].get(k, np.nan) - v) for k, v in want["evaluate"].items()}
    return {"weights": weights, "history": history, "evaluate": evaluate}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="kmp.verify's report, 2 devices")
    parser.add_argument("--noise", action="store_true", help="the same report")
    parser.add_argument("--programs", nargs="*", default=None)
    parser.add_argument("--processes", action="store_true",
                        help="2 processes rather than 2 devices (the torch lane: always)")
    args = parser.parse_args(argv)
    cases = all_cases(args.programs)
    import keras

    report = verified(cases, processes=args.processes or keras.backend.backend() == "torch")
    print("fits:", ", ".join(f"{i + 1} {n}/{o}" for i, (n, o) in enumerate(cases)))
    print(report)


if __name__ == "__main__":
    main()
