"""The torch lane started three ways, the script unchanged: `kmp-launch -n 2`, `torchrun
--nproc-per-node 2` (`python -m torch.distributed.run`), and `kmp.launch(fn)`; each equals
one process on the same global batches, and only rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.torch import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multi_worker, pytest.mark.timeout(400)]
SCRIPT = str(helpers.ROOT / "tests" / "torch" / "train_script.py")


def run(command: list[str], **extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=helpers.ROOT, env=helpers.environment(**extra),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def results(folder) -> list[dict]:
    found = []
    for name in sorted(p for p in os.listdir(folder) if p.endswith(".npz")):
        with np.load(folder / name) as data:
            found.append({k: data[k] for k in data.files})
    return found


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    run([sys.executable, SCRIPT, str(folder)])
    return results(folder)[0], sorted(os.listdir(folder))


@pytest.mark.parametrize("launcher", ["kmp-launch", "torchrun"])
def test_the_same_script_under_a_launcher_equals_one_process(tmp_path, one_process, launcher):
    if launcher == "kmp-launch":
        command = [sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2", SCRIPT]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-port", str(helpers.free_port()), SCRIPT]
    run([*command, str(tmp_path)])
    ranks = results(tmp_path)
    reference, files = one_process
    assert [json.loads(str(r["topology"])) for r in ranks] == [
        [0, 2, True, "tf_config" if launcher == "kmp-launch" else "torchrun"],
        [1, 2, False, "tf_config" if launcher == "kmp-launch" else "torchrun"]]
    weights = sorted(k for k in reference if k.startswith("arr_"))
    for rank in ranks:
        assert str(rank["history"]) == str(ranks[0]["history"])
        assert helpers.max_diff([rank[k] for k in weights], [reference[k] for k in weights]) < 1e-5
        assert helpers.max_diff([rank["predict"]], [reference["predict"]]) < 1e-5
        mine, theirs = json.loads(str(rank["history"])), json.loads(str(reference["history"]))
        for key, values in theirs.items():
            assert np.allclose(mine[key], values, atol=1e-5), key
    checkpoints = [f for f in sorted(os.listdir(tmp_path)) if f.endswith(".keras")]
    assert checkpoints == [f for f in files if f.endswith(".keras")]  # rank 0 wrote each once
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f or f.startswith(".")]


def test_kmp_launch_joins_the_process_group_over_loopback_only():
    """Each worker joined torch's process group before the function ran (its variables set,
    as torchrun sets them); a local job listens on 127.0.0.1 only (no TCP store on every
    interface: the store is a file in the job's private folder)."""
    done = run([sys.executable, "-c", (
        "import keras_mgpu_plugins as kmp; from tests.torch import launched;"
        "print(repr(kmp.launch(launched.who_and_what_listens, num_workers=2, timeout=200)))")])
    found = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    assert [f["rank"] for f in found] == [[True, 0, 2], [True, 1, 2]]
    assert [f["variables"]["RANK"] for f in found] == ["0", "1"]
    assert all(f["variables"]["WORLD_SIZE"] == "2" for f in found)
    for f in found:
        assert f["listening"], f
        assert all(address.startswith("127.0.0.1:") for address in f["listening"]), f


def test_a_process_group_the_script_started_itself_is_detected(tmp_path):
    results_ = helpers.run_processes(tmp_path, "tests.torch.launched:own_group",
                                     {"port": helpers.free_port()}, n=2)
    assert [r["topology"] for r in results_] == [[0, 2, True, "process_group"],
                                                [1, 2, False, "process_group"]]
    assert [r["rank"] for r in results_] == [[0, 2, True], [1, 2, False]]


def test_a_failing_process_stops_every_process_with_its_cause():
    done = subprocess.run([sys.executable, "-c", (
        "import keras_mgpu_plugins as kmp; from tests.torch import launched;"
        "kmp.launch(launched.fail_on_rank_one, num_workers=2, timeout=200)")],
        cwd=helpers.ROOT, env=helpers.environment(), capture_output=True, text=True,
        timeout=300)
    assert done.returncode != 0
    assert "rank one broke on purpose" in done.stderr
