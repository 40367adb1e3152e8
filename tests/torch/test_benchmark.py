"""benchmarks/torch_vs_ddp.py with tiny settings: the plumbing (2 real processes per job,
both sides, alternating), not the speed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(300)]

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def torch_vs_ddp(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # not a package: it imports its siblings
    import torch_vs_ddp

    yield torch_vs_ddp
    for name in ("torch_vs_ddp", "workers_vs_loop"):
        sys.modules.pop(name, None)


def test_kmp_and_the_hand_written_loop_each_run_and_alternate(torch_vs_ddp):
    r = torch_vs_ddp.measure("loop", steps=4, repeats=1, rounds=2, width=8)
    assert r["name"] == "loop" and r["kmp"] > 0 and r["other"] > 0
    assert len(r["ratios"]) == 2 and all(x > 0 for x in r["ratios"])


def test_plain_keras_alone_runs_for_explain(torch_vs_ddp):
    r = torch_vs_ddp.measure("alone", steps=4, repeats=1, rounds=1, width=8)
    assert r["name"] == "alone" and r["kmp"] > 0 and r["other"] > 0
