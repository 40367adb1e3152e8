"""benchmarks/gpu/run.py's runner without JAX: a part over its budget is killed and recorded
as timed out with what it had measured, a failing step is recorded with its message, the
run's JSON gives every part a status; nvidia-smi's output parsed (benchmarks/gpu/smi.py).

`benchmarks/gpu/` is not a package: its modules are loaded from their folder, put on
`sys.path` as when run.py runs as a script, and taken off again afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def gpu():
    path, modules = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(FOLDER))
    loaded = {}
    for name in ("run", "smi", "common"):  # "run" under its own name: not benchmarks/run.py
        spec = importlib.util.spec_from_file_location(f"kmp_gpu_{name}", FOLDER / f"{name}.py")
        loaded[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded[name])
    yield type("Modules", (), loaded)
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == FOLDER:
            del sys.modules[name]


def part_script(tmp_path: Path, body: str) -> list[str]:
    """A stand-in part: `rec` (a common.Recorder on tmp_path/result.json), then `body`."""
    script = tmp_path / "part.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(FOLDER)!r})
        from common import Recorder
        rec = Recorder({str(tmp_path / "result.json")!r})
    """) + textwrap.dedent(body))
    return [sys.executable, str(script)]


def entry(budget: float = 30) -> dict:
    return {"status": "not_run", "budget_s": budget}


def test_a_part_over_its_budget_is_killed_and_keeps_what_it_measured(gpu, tmp_path):
    cmd = part_script(tmp_path, """
        rec.put(first=1.5)
        with rec.step("slow"):
            time.sleep(120)
    """)
    start = time.perf_counter()
    with open(tmp_path / "log", "w") as log:
        status, code, seconds = gpu.run.run_part(cmd, {}, 3, log)
    assert status == "timed_out" and code is None and time.perf_counter() - start < 30
    found = entry(3)
    gpu.run.record_part(found, status, code, seconds, str(tmp_path / "result.json"))
    assert found["status"] == "timed_out" and found["result"]["first"] == 1.5
    assert "over its budget of 3 s" in found["message"] and "slow: running" in found["message"]


def test_a_failing_step_is_recorded_with_its_message_and_the_next_step_runs(gpu, tmp_path):
    cmd = part_script(tmp_path, """
        with rec.step("broken"):
            raise ValueError("no such device")
        with rec.step("fine"):
            rec.put(value=2)
        sys.exit(1 if rec.failed else 0)
    """)
    with open(tmp_path / "log", "w") as log:
        status, code, seconds = gpu.run.run_part(cmd, {}, 60, log)
    found = entry()
    gpu.run.record_part(found, status, code, seconds, str(tmp_path / "result.json"))
    assert (status, code, found["status"]) == ("failed", 1, "failed")
    assert found["message"] == "broken: ValueError: no such device"
    assert found["steps"]["fine"]["status"] == "ok" and found["result"]["value"] == 2
    assert "ValueError: no such device" in (tmp_path / "log").read_text()


def test_a_part_that_does_not_apply_is_skipped_with_its_reason(gpu, tmp_path):
    cmd = part_script(tmp_path, 'rec.skip("torch lane not present")\n')
    with open(tmp_path / "log", "w") as log:
        status, code, seconds = gpu.run.run_part(cmd, {}, 60, log)
    found = entry()
    gpu.run.record_part(found, status, code, seconds, str(tmp_path / "result.json"))
    assert (found["status"], found["message"]) == ("skipped", "torch lane not present")


def test_check_names_every_part_without_a_passing_status(gpu, tmp_path):
    run = gpu.run.skeleton(True, "cpu", ["run.py"])
    names = [name for name, *_ in gpu.run.PARTS]
    assert list(run["parts"]) == names and run["schema"] == gpu.run.SCHEMA
    path = tmp_path / "gpu-cpu.json"
    gpu.run.write(run, str(path))
    assert len(gpu.run.check(str(path))) == len(names)  # every part "not_run"
    for name in names:
        run["parts"][name]["status"] = "ok"
    run["parts"]["torch"]["status"] = "skipped"
    run["parts"]["memory"].update(status="timed_out", message="over its budget")
    del run["parts"]["tests"]
    gpu.run.write(run, str(path))
    assert gpu.run.check(str(path)) == ["part tests: no status (None)",
                                        "part memory: timed_out: over its budget"]


def test_the_gpu_budgets_fit_in_eight_minutes(gpu):
    assert sum(gpu_s for _, gpu_s, _, _ in gpu.run.PARTS) == gpu.run.TOTAL_S <= 480


def test_nvidia_smi_output_is_parsed_into_numbers(gpu, monkeypatch):
    rows = gpu.smi.parse("0, NVIDIA H200, 143771, 512, 0, 73.61, [N/A]\n",
                         ("index", "name", "memory.total", "memory.used", "utilization.gpu",
                          "power.draw", "clocks.sm"))
    assert rows == [{"index": 0.0, "name": "NVIDIA H200", "memory.total": 143771.0,
                     "memory.used": 512.0, "utilization.gpu": 0.0, "power.draw": 73.61,
                     "clocks.sm": None}]
    for name, slug in (("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                       ("Tesla V100-SXM2-16GB", "tesla")):
        monkeypatch.setattr(gpu.smi, "query", lambda fields, _n=name: [{"name": _n}])
        assert gpu.smi.device_slug(dry_run=False) == slug
    assert gpu.smi.device_slug(dry_run=True) == "cpu"


def test_the_recorder_rewrites_its_file_after_each_change(gpu, tmp_path):
    rec = gpu.common.Recorder(str(tmp_path / "r.json"))
    rec.put(a=1)
    assert json.loads((tmp_path / "r.json").read_text())["result"] == {"a": 1}
    with rec.step("s") as step:
        step.update(status="skipped", message="not here")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["steps"]["s"]["status"] == "skipped" and rec.failed == []


def test_every_registered_part_has_a_module_with_both_sizes(gpu):
    names = [name for name, *_ in gpu.run.PARTS]
    assert {"torch", "verify", "metrics", "stop_signals"} <= set(names)  # issue 44's point 2
    modules = {path.stem[len("part_"):] for path in FOLDER.glob("part_*.py")}
    assert modules == set(names), "a part module not registered in PARTS, or the reverse"
    for name in names:
        module = importlib.import_module(f"part_{name}")
        assert set(module.SIZES) == {"gpu", "cpu"} and callable(module.run), name
    for name, gpu_s, dry_s, what in gpu.run.PARTS:
        assert 0 < gpu_s <= dry_s and what, name


def test_a_part_can_be_given_its_own_interpreter(gpu):
    assert gpu.run.interpreters(["torch=/venv/bin/python"]) == {"torch": "/venv/bin/python"}
    cmd = gpu.run.part_command("torch", "r.json", True, "/venv/bin/python")
    assert cmd[0] == "/venv/bin/python" and cmd[-1] == "--cpu-dry-run"
    assert gpu.run.part_command("tests", "r.json", False)[0] == sys.executable
    for bad in ("torhc=/venv/bin/python", "torch=", "torch"):
        with pytest.raises(ValueError, match=f"Received: --python '{bad}'"):
            gpu.run.interpreters([bad])


def test_the_metrics_part_says_which_groups_of_keys_have_landed(gpu):
    metrics = importlib.import_module("part_metrics")
    documented = "| `flops/per_step` | ... | `straggler/worker`, `straggler/phase` |"
    found = metrics.verdicts({"flops/per_step": 3e9, "step_time/mean_ms": 2.0}, documented)
    assert found["flops"] == {"status": "logged", "keys": {"flops/per_step": 3e9}}
    assert found["straggler"]["status"] == "landed, not logged in this fit"
    assert found["mfu"]["status"] == "not landed" and found["mfu"]["keys"] == {}
    assert {g["status"] for g in metrics.verdicts({}, "").values()} == {"not landed"}
