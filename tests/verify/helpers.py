"""What the lanes' verify tests share: `kmp.verify` of a case of `tests/verify/cases.py`, the
`kmp-verify` command on a script, and the assertions on a report."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import keras_mgpu_plugins as kmp
from tests.verify import cases

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Steps compared in the cases (each fit has 12: 96 rows, batch 16, 2 epochs).
STEPS = 8


def verify_case(case: str, **options):
    """`kmp.verify` of `cases.main(case)` on 2 devices (processes on torch)."""
    options.setdefault("steps", STEPS)
    return kmp.verify(cases.main, num_workers=2, args=(case,), timeout=600, **options)


def verify_cases(names: list[str], **options):
    """`kmp.verify` of every case of `names` in turn, one compared fit each."""
    options.setdefault("steps", STEPS)
    return kmp.verify(cases.several, num_workers=2, args=(names,), fits=len(names),
                      timeout=900, **options)


def assert_causes(report, names: list[str]) -> None:
    """Each case of `names` built to differ parts, its cause named first; the others agree."""
    assert report.verdict == "differ", report
    parted = {part["fit"]: part for part in report.parts}
    for fit, case in enumerate(names, 1):
        if case in cases.DIFFERING:
            assert fit in parted, f"{case} (fit {fit}) does not differ:\n{report}"
            causes = [key for key, _ in parted[fit]["causes"]]
            assert causes[:1] == [cases.DIFFERING[case]], f"{case}: {causes}\n{report}"
        else:
            assert fit not in parted, f"{case} (fit {fit}) differs:\n{report}"


def assert_cause(report, case: str) -> None:
    """The report of a case built to differ: DIFFER, its cause named first."""
    assert report.verdict == "differ" and report.first_step is not None, report
    assert report.causes and report.causes[0][0] == cases.DIFFERING[case], report


def assert_cannot(report, case: str) -> None:
    assert report.verdict == "cannot compare" and not report.ok, report
    assert any(cases.CANNOT[case] in reason for reason in report.reasons), report


def command(*argv: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m keras_mgpu_plugins.verify ARGV` from the repository root, and its seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.verify", *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def quickstart(tmp_path: pathlib.Path, *extra: str) -> tuple[dict, str, float]:
    """kmp-verify on examples/quickstart.py (`--quick`): the JSON report, the text, seconds."""
    out = tmp_path / "verify.json"
    done, seconds = command("-n", "2", "--json", str(out), *extra, "examples/quickstart.py",
                            "--quick")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(out.read_text()), done.stdout, seconds
