"""How long an example's `fit` goes without progress: its first step, and the longest gap.

Runs a script (an example) unchanged, as `python script.py args` would, with a
callback added to each of its `fit` calls that notes the moments `StallWatchdog`
counts as progress (train begin, epoch begin and end, batch ends, evaluation
begin, batch ends and end). Prints one line of JSON per `fit` per process:

- `first_step_s`: from train begin to the end of the first training batch (tracing,
  compiling, on several workers setting up the collectives, and the step itself);
- `first_eval_step_s`: from the first evaluation's begin to its first batch end
  (`validation_data`'s own compilation), or `null`;
- `longest_gap_s`: the longest time between two progress events of that fit, and
  `between`: which two. This is what `StallWatchdog` would see as idle time (it pauses
  its clock while TensorFlow traces, and not on JAX, which this does not model).

The default stall timeout of `kmp-launch` / `kmp.launch` was chosen from these
numbers (docs/launch.md, "Stalls").

    python benchmarks/first_step.py examples/quickstart.py --quick
    python benchmarks/first_step.py [--quick] [--json PATH]   # the quickstart, in the suite
    KERAS_BACKEND=jax python benchmarks/first_step.py examples/quickstart.py --quick
    kmp-launch -n 2 --all-output benchmarks/first_step.py examples/mnist_cnn.py --quick
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import runpy
import sys
import time

from keras_mgpu_plugins._after_import import when_imported

QUICKSTART = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                          "quickstart.py")
RECORDS: list[dict] = []  # one per fit of this process


def _timing_callback(keras, fits: list[int]):
    class FirstStep(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            fits[0] += 1
            self.fit, self.events, self.eval_begin = fits[0], [], None
            self.first_step = self.first_eval = None

        def _note(self, what: str) -> None:
            self.events.append((time.perf_counter(), what))

        def on_train_begin(self, logs=None):
            self._note("train begin")

        def on_epoch_begin(self, epoch, logs=None):
            self._note(f"epoch {epoch} begin")

        def on_train_batch_end(self, batch, logs=None):
            if self.first_step is None:
                self.first_step = time.perf_counter() - self.events[0][0]
            self._note(f"batch {batch} end")

        def on_epoch_end(self, epoch, logs=None):
            self._note(f"epoch {epoch} end")

        def on_test_begin(self, logs=None):
            self._note("evaluation begin")
            self.eval_begin = time.perf_counter() if self.eval_begin is None else self.eval_begin

        def on_test_batch_end(self, batch, logs=None):
            if self.first_eval is None and self.eval_begin is not None:
                self.first_eval = time.perf_counter() - self.eval_begin
            self._note(f"evaluation batch {batch} end")

        def on_test_end(self, logs=None):
            self._note("evaluation end")

        def on_train_end(self, logs=None):
            self._note("train end")
            gaps = [(b[0] - a[0], f"{a[1]} -> {b[1]}")
                    for a, b in zip(self.events, self.events[1:], strict=False)]
            longest = max(gaps, default=(0.0, ""))
            RECORDS.append({
                "script": os.path.basename(sys.argv[0]),
                "backend": keras.backend.backend(),
                "worker": int(os.environ.get("KMP_WORKER_INDEX", 0)),
                "workers": int(os.environ.get("KMP_NUM_WORKERS", 1)),
                "fit": self.fit,
                "first_step_s": round(self.first_step, 2) if self.first_step else None,
                "first_eval_step_s": round(self.first_eval, 2) if self.first_eval else None,
                "longest_gap_s": round(longest[0], 2), "between": longest[1]})
            print("first_step " + json.dumps(RECORDS[-1]), flush=True)

    return FirstStep


def _add_to_every_fit(keras) -> None:
    original, fits = keras.Model.fit, [0]
    callback, signature = _timing_callback(keras, fits), inspect.signature(original)

    @functools.wraps(original)
    def fit(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["callbacks"] = [*(bound.arguments.get("callbacks") or []), callback()]
        return original(*bound.args, **bound.kwargs)

    keras.Model.fit = fit


def main() -> None:
    options, rest = _options(sys.argv[1:])
    if options is None:
        print(__doc__)
        sys.exit(0 if rest else 2)
    if not rest:  # the suite's run (benchmarks/run.py): the quickstart
        rest = [QUICKSTART, *(["--quick"] if options["quick"] else [])]
    script, sys.argv[:] = rest[0], rest
    when_imported("keras", _add_to_every_fit)  # not before the script imports Keras
    here = sys.path[0]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.path.insert(0, here)
    from _suite import Report

    report = Report("first_step", f"How long {os.path.basename(script)}'s fits go without "
                    "progress (this process's fits)", options["quick"])
    for r in RECORDS:
        report.row(f"fit {r['fit']}: first step", r["first_step_s"], "s",
                   f"first evaluation step {r['first_eval_step_s']} s; longest gap "
                   f"{r['longest_gap_s']} s ({r['between']})")
    report.finish(options["json"])


def _options(argv: list[str]) -> tuple[dict | None, list[str]]:
    """This script's own options (before the script's path), and the rest."""
    options: dict = {"quick": False, "json": None}
    while argv and argv[0].startswith("-"):
        if argv[0] in ("-h", "--help"):
            return None, argv
        if argv[0] == "--quick":
            options["quick"] = True
        elif argv[0] == "--json" and len(argv) > 1:
            options["json"], argv = argv[1], argv[1:]
        else:
            return None, []
        argv = argv[1:]
    return options, argv


if __name__ == "__main__":
    main()
