"""Every benchmark in one command: a table on stdout, the same rows as JSON.

    python benchmarks/run.py [--quick] [--json results.json]

Rows (each ratio measured within this one run, from medians of repeats):

- `@kmp.parallelize` vs the hand-written strategy scope: step time ratio on
  2 devices (`parallelize_overhead.py`);
- each callback's overhead: time per step of `fit` with it vs a plain `fit`
  run right next to it, on the same 2-replica model, its epoch-end work
  included (an A/A row, plain vs plain, shows the noise of the machine);
- weight-sync fingerprint throughput vs `tf.reduce_sum`, both in GB/s
  (`weight_sync_fingerprint.py`);
- checkpoint: training time blocked per save, synchronous vs `async_save=True`
  (`checkpoint_async.py`);
- throughput of 1 vs 2 workers on localhost through `kmp.launch`
  (`workers_throughput.py`);
- 2-worker `fit` (`@kmp.parallelize`) vs a hand-written `tf.distribute` loop on
  the same 2 workers, samples/s ratio (`workers_vs_loop.py`);
- kmp on JAX vs plain Keras-JAX `DataParallel`, 1 process of 2 simulated CPU
  devices (`jax_devices`) and 2 processes through `kmp.launch` (`jax_processes`),
  and JAX vs TensorFlow, 2 workers, kmp on both (`jax_vs_tf`), samples/s ratios
  (`jax_vs_keras.py`; their jobs run in fresh processes with `KERAS_BACKEND` set);
- model parallelism on JAX: the most bytes (parameters + Adam slots) a device holds,
  one device and data parallel against `strategy="model_parallel"`, for a model
  1.25x a stated budget per device, and the ratios (`model_parallel_memory_jax.py`,
  `--only jax_memory`; fresh processes with `KERAS_BACKEND=jax`).

A benchmark whose script is missing, or that fails, or whose backend is not
installed (the first six run on the TensorFlow backend, `KERAS_BACKEND=tensorflow`;
the JAX ones need JAX, `jax_vs_tf` both) gives a row saying "not available" and
why; the others still run. Without 2 GPUs the CPU is split into 2 logical
devices. `--quick` takes ~5-8 minutes on 2 CPU cores (~3 more for the JAX rows).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # the sibling scripts import as modules (and in kmp.launch workers)
    sys.path.insert(0, HERE)

#: Sizes of each benchmark, full and --quick.
SETTINGS = {
    "full": {"parallelize": {"repeats": 10, "steps": 50},
             "callbacks": {"repeats": 7, "epochs": 3, "steps": 200},
             "checkpoint": {"repeats": 2, "epochs": 4, "width": 4096},
             "fingerprint": {"mb": 64, "layers": 8, "repeats": 7},
             "workers": {"repeats": 3, "steps": 160, "rounds": 3},
             "loop": {"repeats": 3, "steps": 160, "rounds": 5},
             "jax_devices": {"repeats": 3, "steps": 160, "rounds": 5},
             "jax_processes": {"repeats": 3, "steps": 160, "rounds": 5},
             "jax_vs_tf": {"repeats": 3, "steps": 160, "rounds": 5},
             "jax_memory": {"budget_mb": 1024, "steps": 3}},
    "quick": {"parallelize": {"repeats": 6, "steps": 30},
              "callbacks": {"repeats": 6, "epochs": 2, "steps": 40},
              "checkpoint": {"repeats": 1, "epochs": 3, "width": 1024},
              "fingerprint": {"mb": 16, "layers": 4, "repeats": 5},
              "workers": {"repeats": 2, "steps": 160, "rounds": 1},
              "loop": {"repeats": 2, "steps": 160, "rounds": 1},
              "jax_devices": {"repeats": 2, "steps": 160, "rounds": 1},
              "jax_processes": {"repeats": 2, "steps": 160, "rounds": 1},
              "jax_vs_tf": {"repeats": 2, "steps": 160, "rounds": 1},
              "jax_memory": {"budget_mb": 64, "steps": 2}},
}


def row(benchmark: str, metric: str, value: float | None, unit: str, detail: str = "") -> dict:
    return {"benchmark": benchmark, "metric": metric, "value": value, "unit": unit, "detail": detail}


def unavailable(benchmark: str, reason: str) -> list[dict]:
    return [row(benchmark, "not available", None, "", reason)]


# --- @kmp.parallelize --------------------------------------------------------------------


def bench_parallelize(repeats: int, steps: int) -> list[dict]:
    import parallelize_overhead

    r = parallelize_overhead.measure(repeats=repeats, steps=steps)
    name = f"@kmp.parallelize vs hand-written scope ({r['replicas']} replicas)"
    return [
        row(name, "step time, @kmp.parallelize", 1e3 * r["step_s_parallelize"], "ms"),
        row(name, "step time, hand-written scope", 1e3 * r["step_s_hand"], "ms"),
        row(name, "ratio parallelize / hand", r["ratio"], "x", f"median of {repeats} x {steps} steps"),
    ]


# --- each callback vs plain fit -------------------------------------------------------------


def callback_setups(folder: str) -> dict:
    """Name -> factory of the callback list for one fit (fresh objects each time)."""
    import keras_mgpu_plugins as kmp

    cb = kmp.callbacks
    count = iter(range(10**6))
    setups = {
        "plain fit": lambda: [],
        "ModelCheckpoint (each epoch)": lambda: [
            cb.ModelCheckpoint(os.path.join(folder, "ckpt.keras"), monitor="loss")],
        "EarlyStopping": lambda: [cb.EarlyStopping(monitor="loss", patience=100)],
        "BackupAndRestore": lambda: [
            cb.BackupAndRestore(os.path.join(folder, f"backup-{next(count)}"))],
        "DeviceMetricsLogger": lambda: [cb.DeviceMetricsLogger(summary=False)],
        "WeightSyncVerifier": lambda: [cb.WeightSyncVerifier()],
    }
    every = list(setups.values())[1:]
    setups["all five together"] = lambda: [c for make in every for c in make()]
    return setups


def time_hooks(callbacks: list, spent: list[float]) -> list:
    """Wraps the hooks each callback overrides so their time adds up in `spent[0]`."""
    import keras

    for callback in callbacks:
        for name in dir(keras.callbacks.Callback):
            hook = getattr(callback, name)
            if not name.startswith("on_") or getattr(hook, "__func__", None) is getattr(
                    keras.callbacks.Callback, name):
                continue

            def timed(*args, _hook=hook, **kwargs):
                start = time.perf_counter()
                try:
                    return _hook(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(callback, name, timed)
    return callbacks


def bench_callbacks(repeats: int, epochs: int, steps: int, batch: int = 256) -> list[dict]:
    """Each setup's fit against a plain fit run right next to it (order alternating).

    The ratio of each pair is taken, then the median over `repeats` pairs: a
    shared machine's load drifts less within a pair than across the run. The
    "plain fit again" row (an A/A pair) shows how large that noise is. The time
    spent inside the callbacks' own hooks is measured directly too, as a share
    of the plain fit beside it: what the training thread pays, whatever the noise.
    """
    import numpy as np
    from parallelize_overhead import FEATURES, build

    import keras_mgpu_plugins as kmp

    model = kmp.parallelize(strategy="mirrored")(build)(512)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int64")
    replicas = model.distribute_strategy.num_replicas_in_sync
    with tempfile.TemporaryDirectory(prefix="kmp-bench-") as folder:
        setups = {"plain fit again": lambda: [], **callback_setups(folder)}
        names = [name for name in setups if name != "plain fit"]
        ratios: dict[str, list[float]] = {name: [] for name in names}
        shares: dict[str, list[float]] = {name: [] for name in names}
        seconds: dict[str, list[float]] = {name: [] for name in setups}
        hooks: dict[str, list[float]] = {name: [] for name in setups}
        errors: dict[str, str] = {}

        def per_step(name: str) -> float:
            spent = [0.0]
            callbacks = time_hooks(setups[name](), spent)
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
                      callbacks=callbacks)
            seconds[name].append((time.perf_counter() - start) / (epochs * steps))
            hooks[name].append(spent[0] / epochs)  # seconds per epoch inside the hooks
            return seconds[name][-1]

        per_step("plain fit")  # traces the train function for everyone
        seconds["plain fit"].clear()
        for r in range(repeats):
            for name in names:
                if name in errors:
                    continue
                try:
                    if r % 2 == 0:
                        plain, other = per_step("plain fit"), per_step(name)
                    else:
                        other, plain = per_step(name), per_step("plain fit")
                except Exception as err:  # one broken callback must not hide the others
                    errors[name] = f"{type(err).__name__}: {err}"
                    continue
                ratios[name].append(other / plain)
                shares[name].append(hooks[name][-1] / (plain * steps))
    base = statistics.median(seconds["plain fit"])
    bench = f"callback overhead vs plain fit ({replicas} replicas, {epochs} epochs x {steps} steps)"
    rows = [row(bench, "plain fit, time per step", 1e3 * base, "ms",
                f"ratios: medians of {repeats} fits, each paired with a plain fit")]
    for name in names:
        if name in errors:
            rows.append(row(bench, name, None, "", f"not available: {errors[name][:200]}"))
        else:
            rows.append(row(bench, name, statistics.median(ratios[name]), "x",
                            f"in its hooks: {1e3 * statistics.median(hooks[name]):.1f} ms per epoch, "
                            f"{100 * statistics.median(shares[name]):.2f}% of a plain fit"))
    return rows


# --- benchmarks of other modules ----------------------------------------------------------


def bench_fingerprint(mb: float, layers: int, repeats: int) -> list[dict]:
    from weight_sync_fingerprint import throughput

    with contextlib.redirect_stdout(io.StringIO()):  # its lines are for a human running it alone
        r = throughput(argparse.Namespace(mb=mb, layers=layers, repeats=repeats))
    return fingerprint_rows(r, mb)


def fingerprint_rows(r: dict, mb: float) -> list[dict]:
    """Rows from what `weight_sync_fingerprint.throughput` returns."""
    name = f"weight-sync fingerprint vs tf.reduce_sum ({mb:g} MB of float32 weights)"
    detail = f"median of {r['repeats']} calls"
    rates = r["gb_per_s"]
    return [row(name, "fingerprint", rates["fingerprint"], "GB/s", detail),
            row(name, "tf.reduce_sum", rates["tf.reduce_sum"], "GB/s", detail),
            row(name, "ratio fingerprint / reduce_sum", r["ratio"], "x")]


def bench_checkpoint(repeats: int, epochs: int, width: int, steps: int = 4) -> list[dict]:
    import keras
    import numpy as np
    from checkpoint_async import timed_checkpoint

    import keras_mgpu_plugins as kmp

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2048,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(2048)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * steps, 2048)).astype("float32")
    blocked: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="kmp-bench-") as folder:
        path = os.path.join(folder, "bench.keras")
        for _ in range(repeats):
            for async_save in (False, True):
                callback = timed_checkpoint(kmp.callbacks.ModelCheckpoint, filepath=path,
                                            async_save=async_save)
                model.fit(x, x, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                          callbacks=[callback])
                blocked[async_save] += callback.per_save
        size_mb = os.path.getsize(path) / 1e6
    sync, asyn = statistics.median(blocked[False]), statistics.median(blocked[True])
    name = f"checkpoint: training blocked per save ({size_mb:.0f} MB .keras file)"
    detail = f"median of {len(blocked[False])} saves"
    return [row(name, "sync", 1e3 * sync, "ms", detail), row(name, "async_save=True", 1e3 * asyn, "ms", detail),
            row(name, "ratio sync / async", sync / asyn, "x")]


def bench_workers(repeats: int, steps: int, rounds: int) -> list[dict]:
    import workers_throughput

    rows = []
    for n in (1, 16):  # steps_per_execution
        r = workers_throughput.measure(repeats=repeats, steps=steps, steps_per_execution=n,
                                       rounds=rounds)
        name = f"1 vs 2 workers on localhost (kmp.launch, global batch 256, steps_per_execution={n})"
        rows += [row(name, "1 worker", r["samples_per_sec_1"], "samples/s"),
                 row(name, "2 workers", r["samples_per_sec_2"], "samples/s",
                     f"{r['replicas_2']} replicas"),
                 row(name, "ratio 2 workers / 1 worker", r["ratio"], "x",
                     f"{os.cpu_count()} CPU cores shared; median of {rounds} rounds: "
                     + ", ".join(f"{x:.3f}" for x in r["ratios"]))]
    return rows


def bench_loop(repeats: int, steps: int, rounds: int) -> list[dict]:
    import workers_vs_loop

    rows = []
    for n in (16, 1):  # steps_per_execution
        r = workers_vs_loop.measure(repeats=repeats, steps=steps, rounds=rounds,
                                    steps_per_execution=n, report=None)
        rows += loop_rows(r, n, steps, rounds)
    return rows


def loop_rows(r: dict, steps_per_execution: int, steps: int, rounds: int) -> list[dict]:
    """Rows from what `workers_vs_loop.measure` returns."""
    name = (f"2-worker fit vs hand-written tf.distribute loop (kmp.launch, global batch 256, "
            f"{steps}-step epochs, steps_per_execution={steps_per_execution})")
    return [row(name, "kmp fit", r["kmp"], "samples/s", f"{r['replicas']} replicas"),
            row(name, "tf.distribute loop", r["loop"], "samples/s"),
            row(name, "ratio kmp / loop", r["ratio"], "x",
                f"median of {rounds} rounds: " + ", ".join(f"{x:.3f}" for x in r["ratios"]))]


# --- the JAX lane ---------------------------------------------------------------------------

#: Title of each JAX comparison of `jax_vs_keras.py` (by its key there), and its rows' names.
JAX_SETUPS = {
    "devices": ("kmp on JAX vs plain Keras-JAX DataParallel (1 process, 2 simulated CPU devices",
                "kmp fit", "plain Keras DataParallel"),
    "processes": ("kmp on JAX vs plain Keras-JAX DataParallel (2 processes through kmp.launch",
                  "kmp fit", "plain Keras DataParallel"),
    "backends": ("JAX vs TensorFlow, kmp on both (2 workers through kmp.launch",
                 "JAX, 2 processes", "TensorFlow, 2 workers"),
}


def jax_bench(which: str):
    """The benchmark function of comparison `which` of `jax_vs_keras.py`."""

    def bench(repeats: int, steps: int, rounds: int) -> list[dict]:
        import jax_vs_keras

        rows = []
        for n in (16, 1):  # steps_per_execution
            r = jax_vs_keras.measure(which, steps=steps, repeats=repeats, rounds=rounds,
                                     steps_per_execution=n, report=None)
            rows += jax_rows(which, r, n, rounds)
        return rows

    return bench


def jax_rows(which: str, r: dict, steps_per_execution: int, rounds: int) -> list[dict]:
    """Rows from what `jax_vs_keras.measure(which, ...)` returns."""
    title, first, second = JAX_SETUPS[which]
    name = f"{title}, global batch 256, steps_per_execution={steps_per_execution})"
    a, b = r["names"]
    return [row(name, first, r["first"], "samples/s", f"{r['devices'][0]} devices"),
            row(name, second, r["second"], "samples/s", f"{r['devices'][1]} devices"),
            row(name, f"ratio {a} / {b}", r["ratio"], "x",
                f"median of {rounds} rounds: " + ", ".join(f"{x:.3f}" for x in r["ratios"]))]


JAX_MEMORY = "model_parallel memory on JAX, unsharded vs sharded"


def bench_jax_memory(budget_mb: float, steps: int) -> list[dict]:
    import model_parallel_memory_jax

    return jax_memory_rows(model_parallel_memory_jax.measure(budget_mb, steps=steps))


def jax_memory_rows(r: dict) -> list[dict]:
    """Rows from what `model_parallel_memory_jax.measure` returns."""
    mib, budget = 2**20, r["budget_bytes"]
    name = (f"{JAX_MEMORY} (MLP {r['depth']} x {r['width']}, Adam: parameters + slots "
            f"{r['need_bytes'] / budget:.2f}x a budget of {budget / mib:g} MiB per device; "
            f"{len(r['devices'])} {r['platform']} devices)")
    rows = []
    for case, label in (("one_device", "one device"), ("data_parallel", "data parallel"),
                        ("sharded", "sharded (model_parallel)")):
        s = r["summary"][case]
        peak = ("peak not reported by the platform" if s["peak_max"] is None
                else f"peak {s['peak_max'] / mib:,.1f} MiB")
        rows.append(row(name, f"{label}: most bytes a device holds", s["held_max"] / mib, "MiB",
                        f"{s['of_budget']:.0%} of the budget; live after step "
                        f"{s['live_max'] / mib:,.1f} MiB; {peak}"))
    rows += [row(name, f"ratio {k}", v, "x", "parameters + optimizer, most held by a device"
                 if not k.startswith("peak") else "peak bytes in use")
             for k, v in r["ratios"].items()]
    return rows

BENCHMARKS = (  # (title, --only key, function, what it needs)
    ("@kmp.parallelize vs hand-written scope", "parallelize", bench_parallelize, "tensorflow"),
    ("callback overhead vs plain fit", "callbacks", bench_callbacks, "tensorflow"),
    ("weight-sync fingerprint vs tf.reduce_sum", "fingerprint", bench_fingerprint, "tensorflow"),
    ("checkpoint: training blocked per save", "checkpoint", bench_checkpoint, "tensorflow"),
    ("1 vs 2 workers on localhost", "workers", bench_workers, "tensorflow"),
    ("2-worker fit vs hand-written tf.distribute loop", "loop", bench_loop, "tensorflow"),
    (JAX_SETUPS["devices"][0] + ")", "jax_devices", jax_bench("devices"), "jax"),
    (JAX_SETUPS["processes"][0] + ")", "jax_processes", jax_bench("processes"), "jax"),
    (JAX_SETUPS["backends"][0] + ")", "jax_vs_tf", jax_bench("backends"), "jax+tensorflow"),
    (JAX_MEMORY, "jax_memory", bench_jax_memory, "jax"),
)


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def importable(module: str):
    """The module, imported, or `None` where it is not installed (what this run reports)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def keras_backend() -> str | None:
    """This run's Keras backend, or `None` where Keras cannot be imported."""
    try:
        import keras
    except Exception:  # e.g. KERAS_BACKEND unset and TensorFlow not installed
        return None
    return keras.backend.backend()


def lacking(needs: str) -> str | None:
    """Why a benchmark needing `needs` cannot run in this environment, or `None`."""
    absent = [m for m in needs.split("+") if not installed(m)]
    if absent:
        return f"{' and '.join(absent)} not installed in this environment"
    if needs == "tensorflow" and keras_backend() != "tensorflow":
        return (f"runs on the TensorFlow backend; this run's Keras backend is {keras_backend()} "
                "(run with KERAS_BACKEND=tensorflow)")
    return None


# --- the command ------------------------------------------------------------------------


def machine() -> dict:
    """The machine and the versions installed (`None` for a framework that is not)."""
    import keras

    import keras_mgpu_plugins as kmp

    tf, jax = importable("tensorflow"), importable("jax")
    gpus = 0
    if tf is not None:
        gpus = len(tf.config.list_physical_devices("GPU"))
    if jax is not None and keras.backend.backend() == "jax":
        gpus = len([d for d in jax.devices() if d.platform == "gpu"])
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_cores": os.cpu_count(), "gpus": gpus,
            "tensorflow": tf.__version__ if tf else None, "jax": jax.__version__ if jax else None,
            "keras": keras.__version__, "keras_backend": keras.backend.backend(),
            "keras_mgpu_plugins": kmp.__version__}


def format_value(r: dict) -> str:
    if r["value"] is None:
        return "-"
    if r["unit"] == "x":
        return f"{r['value']:.3f}x"
    return f"{r['value']:,.1f} {r['unit']}" if r["value"] < 1e4 else f"{r['value']:,.0f} {r['unit']}"


def table(rows: list[dict]) -> str:
    lines, current = [], None
    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        if r["benchmark"] != current:
            current = r["benchmark"]
            lines.append(f"\n{current}")
        lines.append(f"  {r['metric']:<{width}}  {format_value(r):>16}  {r['detail']}".rstrip())
    return "\n".join(lines).lstrip("\n")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (~5-8 min on 2 CPU cores)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON there")
    parser.add_argument("--only", nargs="+", choices=[key for _, key, _, _ in BENCHMARKS],
                        help="run only these benchmarks")
    args = parser.parse_args(argv)
    import keras_mgpu_plugins as kmp

    if keras_backend() == "tensorflow":
        import tensorflow as tf

        if len(tf.config.list_physical_devices("GPU")) < 2:
            kmp.simulate_devices(2)  # before TensorFlow's runtime starts
    settings = SETTINGS["quick" if args.quick else "full"]
    started = time.perf_counter()
    rows: list[dict] = []
    for title, key, bench, needs in BENCHMARKS:
        if args.only and key not in args.only:
            continue
        reason = lacking(needs)
        if reason:
            rows += unavailable(title, reason)
            continue
        print(f"running: {title} ...", file=sys.stderr, flush=True)
        try:
            rows += bench(**settings[key])
        except ImportError as err:
            rows += unavailable(title, f"script or module missing ({err})")
        except Exception as err:
            traceback.print_exc()
            rows += unavailable(title, f"failed: {type(err).__name__}: {str(err)[:200]}")
    result = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "quick": args.quick, "seconds": round(time.perf_counter() - started, 1),
              "machine": machine(), "rows": rows}
    m = result["machine"]
    print(f"{result['date']}  {m['cpu_cores']} CPU cores, {m['gpus']} GPU(s); TensorFlow "
          f"{m['tensorflow'] or '-'}, JAX {m['jax'] or '-'}, Keras {m['keras']} "
          f"({m['keras_backend']}); {'--quick, ' if args.quick else ''}"
          f"{result['seconds']:.0f} s\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
