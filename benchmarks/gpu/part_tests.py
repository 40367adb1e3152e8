"""The JAX lane's tests marked `gpu` (tests/gpu), on the machine's real devices.

pytest runs in a child process with `KMP_TESTS_REAL_DEVICES=1` (no simulated CPU devices)
and `-m gpu`; each test's outcome, time and message come from its JUnit XML, and what the
tests measured (`record(...)`) from `KMP_GPU_RECORD`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = {"gpu": {"paths": ["tests/gpu"]}, "cpu": {"paths": ["tests/gpu"]}}


def run(rec: common.Recorder, size: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="kmp-gpu-tests-") as folder:
        junit, records = os.path.join(folder, "junit.xml"), os.path.join(folder, "records.jsonl")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
               "-rA", f"--junitxml={junit}", *size["paths"]]
        env = {**os.environ, "KMP_TESTS_REAL_DEVICES": "1", "KMP_GPU_RECORD": records}
        rec.put(command=" ".join(["python", *cmd[1:]]).replace(junit, "JUNIT.xml"))
        with rec.step("pytest") as step:
            code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
            tests = outcomes(junit) if os.path.exists(junit) else []
            counts = {k: sum(t["outcome"] == k for t in tests)
                      for k in ("passed", "failed", "error", "skipped")}
            rec.put(exit_code=code, counts=counts, tests=tests, records=read_records(records))
            if code != 0 or not tests:
                step.update(status="failed", message=f"pytest exit code {code}; {counts}; "
                            + "; ".join(f"{t['name']}: {t['message'][:300]}" for t in tests
                                        if t["outcome"] in ("failed", "error")))


def outcomes(junit: str) -> list[dict]:
    """Each test case of a JUnit XML file: name, outcome, seconds, message."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or "") + "\n" + (node.text or "")[-1500:]
                break
        found.append({"name": case.get("name"), "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message.strip()})
    return found


def read_records(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    found: dict = {}
    with open(path) as f:
        for line in f:
            entry = json.loads(line)
            found.setdefault(entry.pop("test"), []).append(entry)
    return {name: values[0] if len(values) == 1 else values for name, values in found.items()}
