"""benchmarks/run.py without running its benchmarks: rows, table, `--only` and the JSON it writes.

`benchmarks/` is not a package: run.py is loaded from its file, and puts its own
folder on `sys.path` (as when it runs as a script) so that it imports its sibling
scripts; the fixture takes that folder off again afterwards.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path

import pytest

RUN_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
KEYS = ["parallelize", "callbacks", "fingerprint", "checkpoint", "workers", "loop", "jax_devices",
        "jax_processes", "jax_vs_tf", "jax_memory"]


@pytest.fixture(scope="module")
def run():
    path, modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("kmp_benchmarks_run", RUN_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path[:] = path
    for name in set(sys.modules) - modules:  # its sibling scripts, imported as top-level modules
        if getattr(sys.modules[name], "__file__", "") and Path(sys.modules[name].__file__).parent == RUN_PY.parent:
            del sys.modules[name]


def test_values_are_formatted_by_unit(run):
    assert run.format_value(run.row("b", "m", 1.02063, "x")) == "1.021x"
    assert run.format_value(run.row("b", "m", 4.44, "ms")) == "4.4 ms"
    assert run.format_value(run.row("b", "m", 9999.94, "samples/s")) == "9,999.9 samples/s"
    assert run.format_value(run.row("b", "m", 52298.4, "samples/s")) == "52,298 samples/s"
    assert run.format_value(run.row("b", "not available", None, "", "why")) == "-"


def test_the_table_groups_rows_under_their_benchmark(run):
    rows = [run.row("first", "step time", 4.4, "ms"),
            run.row("first", "ratio a / b", 1.0206, "x", "median of 6"),
            *run.unavailable("second", "script or module missing (No module named 'x')")]
    assert run.table(rows).splitlines() == [
        "first",
        "  step time                4.4 ms",
        "  ratio a / b              1.021x  median of 6",
        "",
        "second",
        "  not available                 -  script or module missing (No module named 'x')",
    ]


def test_fingerprint_rows_come_from_the_numbers_throughput_returns(run):
    rows = run.fingerprint_rows({"gb_per_s": {"fingerprint": 14.2, "tf.reduce_sum": 21.7}, "ratio": 0.656,
                                 "bytes": 16 << 20, "variables": 8, "repeats": 5}, mb=16)
    name = "weight-sync fingerprint vs tf.reduce_sum (16 MB of float32 weights)"
    assert rows == [run.row(name, "fingerprint", 14.2, "GB/s", "median of 5 calls"),
                    run.row(name, "tf.reduce_sum", 21.7, "GB/s", "median of 5 calls"),
                    run.row(name, "ratio fingerprint / reduce_sum", 0.656, "x")]


def test_only_offers_each_benchmark_and_each_has_its_settings(run):
    assert [key for _, key, _, _ in run.BENCHMARKS] == KEYS
    for size in ("quick", "full"):
        assert sorted(run.SETTINGS[size]) == sorted(KEYS)
        for _, key, bench, _ in run.BENCHMARKS:
            inspect.signature(bench).bind(**run.SETTINGS[size][key])  # main calls bench(**settings)


def test_an_unknown_only_choice_is_refused_before_anything_runs(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--only", "fingerprint", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_the_json_holds_the_rows_printed_and_the_machine(run, tmp_path, monkeypatch, capsys):
    """The real fingerprint benchmark, tiny (no training); two others replaced by failing stand-ins."""
    def missing(**settings):
        raise ImportError("No module named 'checkpoint_async'")

    def broken(**settings):
        raise RuntimeError("boom")

    fakes = {"callbacks": missing, "checkpoint": broken}
    monkeypatch.setattr(run, "BENCHMARKS", tuple(
        (title, key, fakes.get(key, bench), needs) for title, key, bench, needs in run.BENCHMARKS))
    monkeypatch.setitem(run.SETTINGS["quick"], "fingerprint", {"mb": 0.25, "layers": 2, "repeats": 1})
    path = tmp_path / "results.json"
    returned = run.main(["--quick", "--only", "checkpoint", "fingerprint", "callbacks", "--json", str(path)])
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(returned))
    assert written["quick"] is True and written["seconds"] >= 0
    assert set(written["machine"]) == {"platform", "python", "cpu_cores", "gpus", "tensorflow", "jax",
                                       "keras", "keras_backend", "keras_mgpu_plugins"}
    rows = written["rows"]
    assert [(r["benchmark"].split(" (")[0], r["metric"]) for r in rows] == [
        ("callback overhead vs plain fit", "not available"),  # in BENCHMARKS order, not --only's
        ("weight-sync fingerprint vs tf.reduce_sum", "fingerprint"),
        ("weight-sync fingerprint vs tf.reduce_sum", "tf.reduce_sum"),
        ("weight-sync fingerprint vs tf.reduce_sum", "ratio fingerprint / reduce_sum"),
        ("checkpoint: training blocked per save", "not available"),
    ]
    assert rows[0]["detail"] == "script or module missing (No module named 'checkpoint_async')"
    assert rows[4]["detail"] == "failed: RuntimeError: boom"
    fingerprint, total, ratio = (r["value"] for r in rows[1:4])
    assert fingerprint > 0 and total > 0 and ratio == pytest.approx(fingerprint / total)
    assert [r["unit"] for r in rows[1:4]] == ["GB/s", "GB/s", "x"]
    assert rows[1]["benchmark"] == "weight-sync fingerprint vs tf.reduce_sum (0.25 MB of float32 weights)"
    out = capsys.readouterr().out
    assert run.table(rows) in out and "--quick" in out
    assert "Throughput over" not in out  # throughput's own lines are for a human running it alone


def test_loop_rows_come_from_the_numbers_measure_returns(run):
    rows = run.loop_rows({"kmp": 20000.0, "loop": 21000.0, "ratio": 0.95, "ratios": [0.95, 0.9],
                          "replicas": 2}, steps_per_execution=16, steps=160, rounds=2)
    name = ("2-worker fit vs hand-written tf.distribute loop (kmp.launch, global batch 256, "
            "160-step epochs, steps_per_execution=16)")
    assert rows == [run.row(name, "kmp fit", 20000.0, "samples/s", "2 replicas"),
                    run.row(name, "tf.distribute loop", 21000.0, "samples/s"),
                    run.row(name, "ratio kmp / loop", 0.95, "x", "median of 2 rounds: 0.950, 0.900")]


def test_jax_rows_come_from_the_numbers_measure_returns(run):
    rows = run.jax_rows("processes", {"names": ("kmp", "plain"), "first": 15000.0, "second": 15100.0,
                                      "ratio": 0.99, "ratios": [0.99, 1.01], "devices": (2, 2)},
                        steps_per_execution=1, rounds=2)
    name = ("kmp on JAX vs plain Keras-JAX DataParallel (2 processes through kmp.launch, global batch "
            "256, steps_per_execution=1)")
    assert rows == [run.row(name, "kmp fit", 15000.0, "samples/s", "2 devices"),
                    run.row(name, "plain Keras DataParallel", 15100.0, "samples/s", "2 devices"),
                    run.row(name, "ratio kmp / plain", 0.99, "x", "median of 2 rounds: 0.990, 1.010")]


def memory_result(peaks: tuple | None) -> dict:
    """What `model_parallel_memory_jax.measure` returns, for 2 devices and a 64 MiB budget."""
    mib = 2**20
    held = {"one_device": 80 * mib, "data_parallel": 80 * mib, "sharded": 40 * mib}
    summary = {case: {"held_max": n, "of_budget": n / (64 * mib), "live_max": n,
                      "peak_max": None if peaks is None else peaks[i] * mib}
               for i, (case, n) in enumerate(held.items())}
    ratios = {"sharded / one device": 0.5, "sharded / data parallel": 0.5}
    if peaks is not None:
        ratios["peak, sharded / one device"] = peaks[2] / peaks[0]
    return {"budget_bytes": 64 * mib, "need_bytes": 80 * mib, "width": 934, "depth": 8,
            "platform": "cpu", "devices": ["cpu:0", "cpu:1"], "summary": summary,
            "ratios": ratios}


def test_jax_memory_rows_come_from_the_numbers_measure_returns(run):
    rows = run.jax_memory_rows(memory_result(None))
    name = ("model_parallel memory on JAX, unsharded vs sharded (MLP 8 x 934, Adam: parameters + "
            "slots 1.25x a budget of 64 MiB per device; 2 cpu devices)")
    assert rows == [
        run.row(name, "one device: most bytes a device holds", 80.0, "MiB",
                "125% of the budget; live after step 80.0 MiB; peak not reported by the platform"),
        run.row(name, "data parallel: most bytes a device holds", 80.0, "MiB",
                "125% of the budget; live after step 80.0 MiB; peak not reported by the platform"),
        run.row(name, "sharded (model_parallel): most bytes a device holds", 40.0, "MiB",
                "62% of the budget; live after step 40.0 MiB; peak not reported by the platform"),
        run.row(name, "ratio sharded / one device", 0.5, "x",
                "parameters + optimizer, most held by a device"),
        run.row(name, "ratio sharded / data parallel", 0.5, "x",
                "parameters + optimizer, most held by a device")]
    rows = run.jax_memory_rows(memory_result((100.0, 100.0, 55.0)))  # a GPU reports its peaks
    assert rows[2]["detail"].endswith("; peak 55.0 MiB")
    assert rows[-1] == run.row(name, "ratio peak, sharded / one device", 0.55, "x",
                               "peak bytes in use")


def test_a_backend_not_installed_gives_not_available_rows(run, monkeypatch):
    """What an environment with only TensorFlow (or only JAX) prints for the other's rows."""
    monkeypatch.setattr(run, "installed", lambda module: module != "jax")
    assert run.lacking("jax") == "jax not installed in this environment"
    assert run.lacking("jax+tensorflow") == "jax not installed in this environment"
    monkeypatch.setattr(run, "installed", lambda module: module != "tensorflow")
    assert run.lacking("tensorflow") == "tensorflow not installed in this environment"
    assert run.lacking("jax") is None
    returned = run.main(["--only", "jax_vs_tf", "loop"])
    assert [(r["benchmark"].split(" (")[0], r["metric"], r["detail"]) for r in returned["rows"]] == [
        ("2-worker fit vs hand-written tf.distribute loop", "not available",
         "tensorflow not installed in this environment"),
        ("JAX vs TensorFlow, kmp on both", "not available", "tensorflow not installed in this environment"),
    ]
    monkeypatch.setattr(run, "installed", lambda module: module != "jax")
    returned = run.main(["--only", "jax_memory"])
    assert [(r["benchmark"], r["metric"], r["detail"]) for r in returned["rows"]] == [
        ("model_parallel memory on JAX, unsharded vs sharded", "not available",
         "jax not installed in this environment")]


def test_jax_vs_keras_refuses_steps_that_executions_do_not_divide(run):
    import jax_vs_keras

    with pytest.raises(ValueError, match="steps=10, steps_per_execution=4"):
        jax_vs_keras.measure("devices", steps=10, steps_per_execution=4)


def test_workers_vs_loop_refuses_steps_that_executions_do_not_divide(run):
    import workers_vs_loop

    with pytest.raises(ValueError, match="steps=10, steps_per_execution=4"):
        workers_vs_loop.measure(steps=10, steps_per_execution=4)


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_workers_vs_loop_runs_both_jobs_and_alternates_them(run):
    """Tiny settings, 2 real workers per job: the plumbing, not the speed."""
    import workers_vs_loop

    lines = []
    r = workers_vs_loop.measure(steps=4, repeats=1, rounds=1, steps_per_execution=2, width=8,
                                timeout=240, report=lines.append)
    assert r["replicas"] == 2
    assert r["kmp"] > 0 and r["loop"] > 0
    assert r["ratios"] == [r["kmp"] / r["loop"]] and r["ratio"] == r["ratios"][0]
    assert len(lines) == 1 and lines[0].startswith("  round 1: kmp ")


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_jax_vs_keras_runs_both_sides_on_2_processes_and_alternates_them(run):
    """Tiny settings, 2 real JAX processes per side (KERAS_BACKEND=jax in the workers)."""
    pytest.importorskip("jax")
    import jax_vs_keras

    lines = []
    r = jax_vs_keras.measure("processes", steps=4, repeats=1, rounds=2, steps_per_execution=2,
                             width=8, timeout=240, report=lines.append)
    assert r["names"] == ("kmp", "plain") and r["devices"] == (2, 2)
    assert r["first"] > 0 and r["second"] > 0 and len(r["ratios"]) == 2
    assert [line.split(":")[0] for line in lines] == ["  round 1", "  round 2"]
