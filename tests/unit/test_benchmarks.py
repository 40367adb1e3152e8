"""benchmarks/: every script registered in run.py and taking the suite's options, run.py's table,
skips and failures, and the plumbing of the 2-worker comparisons (tiny settings).

`benchmarks/` is not a package: its modules are loaded with their folder on `sys.path` (as
when a script runs), which the fixture takes off again afterwards. The quick suite itself
(`python benchmarks/run.py --quick`) runs in each CI lane (`.ci/run`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    path, modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(FOLDER))
    import run

    yield run
    sys.path[:] = path
    for name in set(sys.modules) - modules:  # the scripts, imported as top-level modules
        if getattr(sys.modules[name], "__file__", "") and Path(sys.modules[name].__file__).parent == FOLDER:
            del sys.modules[name]


def scripts() -> list[str]:
    return sorted(p.name for p in FOLDER.glob("*.py") if not p.name.startswith("_")
                  and p.name != "run.py")


def test_every_script_is_in_the_suite_and_every_entry_has_its_script(bench):
    registered = {b.script for b in bench.BENCHMARKS}
    assert registered == set(scripts())
    assert len({b.key for b in bench.BENCHMARKS}) == len(bench.BENCHMARKS)
    assert {b.backend for b in bench.BENCHMARKS} <= set(bench.LANE_VENVS)


@pytest.mark.parametrize("script", scripts())
def test_each_script_takes_quick_and_json(script):
    """What run.py passes each script (its --help, which imports no backend)."""
    done = subprocess.run([sys.executable, str(FOLDER / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=FOLDER.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    if script == "preemption.py":  # joins the quick suite once it takes them (run.py says so)
        pytest.skip("preemption.py: --quick and --json to come with the stop-signal work")
    assert "--quick" in done.stdout and "--json" in done.stdout
    takes_rounds = {b.script: b.rounds for b in _run_module().BENCHMARKS}[script]
    assert ("--rounds" in done.stdout) == takes_rounds, (
        f"run.py {'passes' if takes_rounds else 'does not pass'} --rounds to {script}")


def _run_module():
    sys.path.insert(0, str(FOLDER))
    try:
        import run

        return run
    finally:
        sys.path.remove(str(FOLDER))


def test_a_ratio_meets_its_goal_either_way(bench):
    import _suite

    assert _suite.met(0.99, (">=", 0.99)) and not _suite.met(0.989, (">=", 0.99))
    assert _suite.met(1.1, ("<=", 1.10)) and not _suite.met(1.2, ["<=", 1.10])
    assert _suite.met(None, (">=", 1)) is None and _suite.met(0.5, None) is None


FAKE = """
import argparse, sys
sys.path.insert(0, {folder!r})
from _suite import Report, add_arguments
parser = argparse.ArgumentParser()
add_arguments(parser)
args = parser.parse_args()
if {fail!r}:
    sys.exit("it broke")
report = Report("fake", "a fake benchmark", args.quick)
report.ratio("speed", "kmp / plain", 0.5 if args.quick else 0.98, (">=", 0.99), [0.97, 0.98], "how")
report.row("kmp", 12.5, "ms a step")
report.finish(args.json)
"""


def fake_suite(bench, tmp_path, monkeypatch):
    for name, fail in (("fine.py", False), ("broken.py", True)):
        (tmp_path / name).write_text(FAKE.format(folder=str(FOLDER), fail=fail))
    b = bench.Benchmark
    monkeypatch.setattr(bench, "BENCHMARKS", (
        b("fine", str(tmp_path / "fine.py"), "tensorflow", ("keras",), (), ("speed",)),
        b("greedy", str(tmp_path / "fine.py"), "tensorflow", ("keras",), (), ("speed", "other")),
        b("broken", str(tmp_path / "broken.py"), "jax", ("keras",), (), ("speed",)),
        b("absent", str(tmp_path / "fine.py"), "torch", ("no_such_module_here",), (), ("speed",))))


def test_run_collects_each_json_skips_by_name_and_fails_on_a_failure(bench, tmp_path,
                                                                     monkeypatch, capsys):
    fake_suite(bench, tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert bench.main(["--quick", "--out", str(out)]) == 1  # "broken" and "greedy" failed
    summary = json.loads((out / "summary.json").read_text())["results"]
    assert summary["fine"]["ratios"][0]["value"] == 0.5 and summary["fine"]["quick"] is True
    assert summary["fine"]["ratios"][0]["met"] is False
    assert summary["greedy"]["error"] == "ratios not reported: other"
    assert summary["broken"]["error"] == "exit 1" and "it broke" in summary["broken"]["log"]
    assert summary["absent"] == {"skipped": "skipped: needs no_such_module_here, not installed here"}
    printed = capsys.readouterr().out
    assert "kmp / plain" in printed and ">= 0.99" in printed and "NO" in printed
    assert "absent: skipped: needs no_such_module_here" in printed
    assert "broken: FAILED: exit 1" in printed
    assert bench.main(["--only", "fine", "--out", str(out)]) == 0  # full mode: its own value
    assert json.loads((out / "fine.json").read_text())["ratios"][0]["value"] == 0.98


def test_run_refuses_to_save_a_quick_run(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--quick", "--save"])
    assert exit_info.value.code == 2
    assert "--save keeps measurements: not with --quick" in capsys.readouterr().err


def test_the_full_mode_takes_each_lane_environment_first(bench, tmp_path, monkeypatch):
    venv = tmp_path / ".ci-venv-jax" / "bin"
    venv.mkdir(parents=True)
    os.symlink(sys.executable, venv / "python")
    monkeypatch.setattr(bench, "ROOT", str(tmp_path))
    jax_bench = bench.Benchmark("j", "x.py", "jax", ("json",))
    cache: dict = {}
    assert bench.interpreter(jax_bench, {}, False, cache) == str(venv / "python")
    assert bench.interpreter(jax_bench, {}, True, cache) == sys.executable  # quick: this one
    assert bench.interpreter(jax_bench, {"jax": "/given"}, False, {("/given", ("json",)): True}) == "/given"


def test_docs_parts_are_rendered_from_the_results(bench):
    import _docs

    result = {"script": "fake", "title": "t", "date": "2026-11-29T10:00:00+00:00", "quick": False,
              "seconds": 61.0, "command": "python benchmarks/fake.py",
              "machine": {"cpu_cores": 2, "load_average": [0.4, 0.6], "keras_backend": "jax",
                          "versions": {"keras": "3.15.1", "jax": "0.10.2", "tensorflow": None}},
              "ratios": [{"key": "a", "name": "kmp / plain", "value": 0.981, "goal": [">=", 0.99],
                          "met": False, "rounds": [0.98, 0.99], "detail": "how"}],
              "rows": [{"name": "kmp", "value": 1234.5, "unit": "samples/s", "detail": ""}],
              "notes": []}
    text = ("# B\n<!-- results summary -->\nold\n<!-- /results summary -->\n\n## fake\n"
            "<!-- results fake -->\n<!-- /results fake -->\ntail\n")
    new = _docs.update(text, {"fake": result})
    assert "| kmp / plain | >= 0.99 | **0.981x** (missed) | 0.980, 0.990 | how |" in new
    assert "| [fake](#fake) | kmp / plain | >= 0.99 | **0.981x** (missed) | 2026-11-29, 0.4-0.6 |" in new
    assert "| kmp | 1,234 samples/s |  |" in new and "old" not in new and new.endswith("tail\n")
    assert "keras 3.15.1, jax 0.10.2, Keras backend jax" in new
    assert _docs.update(new, {"fake": result}) == new
    with pytest.raises(ValueError, match="has no '<!-- results KEY -->' part"):
        _docs.update(text, {"fake": result, "other": result})
    with pytest.raises(ValueError, match="there is no benchmarks/results/fake.json"):
        _docs.update(text, {})


def test_docs_benchmarks_md_shows_the_committed_results(bench):
    """docs/benchmarks.md's figures are those of benchmarks/results/*.json: after a run with
    --save, `python benchmarks/run.py --update-docs` renders them there."""
    import _docs

    with open(_docs.DOC, encoding="utf-8") as f:
        text = f.read()
    results = _docs.load()  # none yet: the page then marks no result (the quiet run is to come)
    assert _docs.update(text, results) == text, "run: python benchmarks/run.py --update-docs"


def test_steps_that_executions_do_not_divide_are_refused(bench):
    import jax_vs_keras
    import workers_vs_loop

    with pytest.raises(ValueError, match="steps=10, steps_per_execution=4"):
        jax_vs_keras.measure("devices", steps=10, executions=(4,))
    with pytest.raises(ValueError, match="steps=10, steps_per_execution=4"):
        workers_vs_loop.measure(steps=10, executions=(4,))


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_workers_vs_loop_runs_both_jobs_and_alternates_them(bench):
    """Tiny settings, 2 real workers per job: the plumbing, not the speed."""
    import workers_vs_loop

    lines = []
    r = workers_vs_loop.measure(steps=4, repeats=1, rounds=1, executions=(2, 1), width=8,
                                timeout=240, report=lines.append)
    assert r["replicas"] == 2
    for n in (2, 1):
        assert r[n]["kmp"] > 0 and r[n]["loop"] > 0
        assert r[n]["ratios"] == [r[n]["kmp"] / r[n]["loop"]] and r[n]["ratio"] == r[n]["ratios"][0]
    assert len(lines) == 1 and lines[0].startswith("  round 1: spe 2: kmp ")


@pytest.mark.multi_worker
@pytest.mark.timeout(300)
def test_jax_vs_keras_runs_both_sides_on_2_processes_and_alternates_them(bench):
    """Tiny settings, 2 real JAX processes per side (KERAS_BACKEND=jax in the workers)."""
    pytest.importorskip("jax")
    import jax_vs_keras

    lines = []
    r = jax_vs_keras.measure("processes", steps=4, repeats=1, rounds=2, executions=(2,),
                             width=8, timeout=240, report=lines.append)
    assert r["names"] == ("kmp", "plain") and r["devices"] == (2, 2)
    assert r[2]["first"] > 0 and r[2]["second"] > 0 and len(r[2]["ratios"]) == 2
    assert [line.split(":")[0] for line in lines] == ["  round 1", "  round 2"]


def test_a_script_writes_its_json(bench, tmp_path):
    """One real script end to end, in its quick mode (no training: the fingerprint's
    throughput part is the quickest; its overhead part trains 1 epoch of 4 steps)."""
    pytest.importorskip("tensorflow")
    path = tmp_path / "r.json"
    env = dict(os.environ, KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join([str(FOLDER.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(FOLDER / "weight_sync_fingerprint.py"), "--quick",
                           "--json", str(path)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=FOLDER.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["quick"] is True and result["script"] == "weight_sync_fingerprint"
    assert [r["key"] for r in result["ratios"]] == ["throughput", "overhead"]
    assert all(r["value"] > 0 for r in result["ratios"])
    assert result["machine"]["versions"]["tensorflow"]
    assert "fingerprint / tf.reduce_sum" in done.stdout
