"""`kmp-launch` / `python -m keras_mgpu_plugins.launch` end to end, with real workers."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = [pytest.mark.multi_worker, pytest.mark.timeout(120)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, pathlib, sys, time
index = int(os.environ["KMP_WORKER_INDEX"])
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"index={index} task={task} argv={sys.argv[1:]} name={__name__} path0={sys.path[0]}")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode in ("raise", "exit7", "sleep"):
    pid_dir = pathlib.Path(sys.argv[2])
    (pid_dir / f".{index}").write_text(str(os.getpid()))
    os.replace(pid_dir / f".{index}", pid_dir / f"worker-{index}")
    if index == 1 and mode != "sleep":
        while len(list(pid_dir.glob("worker-*"))) < 2:
            time.sleep(0.02)
        if mode == "raise":
            raise RuntimeError("script boom on worker 1")
        sys.exit(7)
    time.sleep(60)
    (pid_dir / f"slept-{index}").write_text("")  # reached only if never stopped
"""


def _cli(*args, cwd, module=True, timeout=90):
    pythonpath = filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    command = [sys.executable, "-m", "keras_mgpu_plugins.launch"] if module else [
        str(pathlib.Path(sys.executable).parent / "kmp-launch")]
    start = time.monotonic()
    done = subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return done, time.monotonic() - start


def _log_folder(stderr: str) -> str:
    return stderr.split(" write to ")[-1].split(" writes to ")[-1].split("/worker-<i>.log")[0]


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_script_runs_as_main_in_each_worker_with_prefixed_output(script, tmp_path):
    done, _ = _cli("-n", "2", "--no-strategy", "--all-output", str(script), "a", "--flag",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[worker {i}] index={i} task={i} argv=['a', '--flag'] name=__main__ path0={tmp_path}"
        for i in range(2)
    ]


def test_by_default_worker_1s_output_goes_to_its_log_file_and_its_path_is_printed(script,
                                                                                   tmp_path):
    done, _ = _cli("-n", "2", "--no-strategy", "--log-dir", "logs", str(script), "a",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = "index={i} task={i} argv=['a'] name=__main__ path0=" + str(tmp_path)
    assert done.stdout.splitlines() == ["[worker 0] " + line.format(i=0)]
    assert (tmp_path / "logs" / "worker-1.log").read_text() == line.format(i=1) + "\n"
    assert (tmp_path / "logs" / "worker-0.log").read_text() == line.format(i=0) + "\n"
    assert (f"kmp-launch: showing worker 0's output; worker 1 writes to "
            f"{tmp_path}/logs/worker-<i>.log (--all-output shows every worker's)"
            ) in done.stderr


def test_console_script_runs_a_module_with_m(tmp_path):
    kmp_launch = pathlib.Path(sys.executable).parent / "kmp-launch"
    if not kmp_launch.exists():
        pytest.skip("the kmp-launch console script is not installed next to this Python")
    (tmp_path / "kmp_cli_mod.py").write_text(
        "import os, sys\nprint(os.environ['KMP_WORKER_INDEX'], __name__, sys.argv[1:])\n")
    done, _ = _cli("-n", "3", "--no-strategy", "--all-output", "-m", "kmp_cli_mod", "x",
                   cwd=tmp_path, module=False)
    assert done.returncode == 0, done.stderr
    expected = [f"[worker {i}] {i} __main__ ['x']" for i in range(3)]
    assert sorted(done.stdout.splitlines()) == expected


def test_a_failing_worker_stops_the_others_and_sets_the_exit_code(script, tmp_path):
    done, _ = _cli("--no-strategy", str(script), "raise", str(tmp_path), cwd=tmp_path)
    assert not list(tmp_path.glob("slept-*"))  # stopped before their sleep ended
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "[worker 1]" not in done.stderr  # its output is in its log, and its end here:
    assert "kmp-launch: worker 1 of 2 raised RuntimeError (exit code 1). " \
           "The other workers were stopped by the launcher." in lines
    header = lines.index("kmp-launch: last lines of worker 1's output (all of it in "
                         f"{_log_folder(done.stderr)}/worker-1.log):")
    # Its stdout and stderr come through two pipes, each read by its own thread: the
    # stdout line can come before or after the traceback, each stream's lines in order.
    tail = lines[header + 1:]
    assert [x for x in tail if x.startswith("index=")] == [
        x for x in tail if x.startswith("index=1 task=1 argv=['raise'")] != []
    traceback = [x for x in tail if not x.startswith("index=")]
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "RuntimeError: script boom on worker 1"
    assert "runpy" not in done.stderr
    assert _gone(int((tmp_path / "worker-0").read_text()))


def test_the_exit_code_is_the_first_failing_workers(script, tmp_path):
    done, _ = _cli("--no-strategy", str(script), "exit7", str(tmp_path), cwd=tmp_path)
    assert not list(tmp_path.glob("slept-*"))  # stopped before their sleep ended
    assert done.returncode == 7
    assert "kmp-launch: worker 1 of 2 exited with code 7." in done.stderr
    assert _gone(int((tmp_path / "worker-0").read_text()))


def test_timeout_stops_the_workers_with_exit_code_124(script, tmp_path):
    done, _ = _cli("--timeout", "1.5", "--no-strategy", str(script), "sleep", str(tmp_path),
                         cwd=tmp_path)
    assert not list(tmp_path.glob("slept-*"))  # stopped before their sleep ended
    assert done.returncode == 124
    assert ("kmp-launch: The run did not finish within timeout=1.5 seconds: workers 0, 1 of 2 "
            "had not finished. All workers were stopped.\n") in done.stderr
    assert "\nPython stacks of worker 1 of 2 (all threads):\n" in done.stderr  # not shown else
    assert all(_gone(int(p.read_text())) for p in tmp_path.glob("worker-*"))


def test_help_exits_0_and_documents_n(tmp_path):
    done, _ = _cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    assert "-n N, --num-workers N" in done.stdout and "-m module" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tutorial_script_creating_its_own_strategy_runs(tmp_path):
    pytest.importorskip("keras_mgpu_plugins.strategy")
    script = tmp_path / "tutorial.py"
    script.write_text(textwrap.dedent("""
        import tensorflow as tf
        from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy
        made_by_launcher = get_strategy("multi_worker")
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # as in TF's tutorial
        total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        replicas = strategy.num_replicas_in_sync
        print("RESULT", type(made_by_launcher).__name__, replicas, float(total),
              strategy is made_by_launcher)
        try:  # asking for another: refused (two in one process can hang)
            tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=tf.distribute.experimental.CommunicationOptions(
                    implementation="RING", timeout_seconds=5.0))
        except Exception as err:
            print("REFUSED", type(err).__name__, str(err).split(": ")[-1].split(".")[0])
    """))
    done, _ = _cli("-n", "2", "--timeout", "150", "--all-output", str(script), cwd=tmp_path,
                   timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    results = sorted(line for line in done.stdout.splitlines() if "RESULT" in line)
    # one_multi_worker_strategy: the script's own is the worker's (a second could hang)
    assert results == [f"[worker {i}] RESULT CollectiveAllReduceStrategy 2 2.0 True"
                       for i in range(2)]
    refused = sorted(line for line in done.stdout.splitlines() if "REFUSED" in line)
    assert refused == [f"[worker {i}] REFUSED StrategyError communication_options"
                       for i in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_raising_mid_fit_exits_1_not_killed(tmp_path):
    """TF's collective runtime must not hold a failed worker until the launcher kills it."""
    script = tmp_path / "fit_fails.py"
    script.write_text(textwrap.dedent("""
        import os
        import keras, numpy as np
        import keras_mgpu_plugins as kmp

        @kmp.parallelize
        def build():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            return model

        class Boom(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 1 and os.environ["KMP_WORKER_INDEX"] == "1":
                    raise RuntimeError("boom on worker 1")

        x = np.random.rand(64, 4).astype("float32")
        build().fit(x, x.sum(1), batch_size=8, epochs=50, verbose=0, callbacks=[Boom()])
    """))
    done, _ = _cli("-n", "2", "--timeout", "150", str(script), cwd=tmp_path, timeout=200)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "worker 1 of 2 raised RuntimeError (exit code 1)" in done.stderr
    assert done.stderr.splitlines()[-1] == "RuntimeError: boom on worker 1"  # its log's end


PROGRESS_SCRIPT = """
import os
import keras, numpy as np
import keras_mgpu_plugins as kmp

@kmp.parallelize
def build():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model

x = np.ones((64, 4), "float32")
model = build()
model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=2)
model.evaluate(x, x[:, :1], batch_size=16, verbose=2)
print("done on worker", os.environ["KMP_WORKER_INDEX"], flush=True)
"""


def _progress_lines(text: str) -> list[str]:  # Keras's verbose=2 line: "4/4 - 0s - ... loss: ..."
    return [line for line in text.splitlines() if " - loss: " in line]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_only_the_chief_shows_a_progress_bar_unless_all_output(tmp_path):
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS_SCRIPT)
    done, _ = _cli("-n", "2", "--timeout", "150", "--log-dir", "logs", str(script),
                   cwd=tmp_path, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = _progress_lines(done.stdout)  # fit's 2 epochs and evaluate: the chief's only
    assert len(shown) == 3 and all(line.startswith("[worker 0] ") for line in shown), shown
    log_1 = (tmp_path / "logs" / "worker-1.log").read_text()
    assert "done on worker 1" in log_1 and _progress_lines(log_1) == []  # verbose forced to 0
    assert len(_progress_lines((tmp_path / "logs" / "worker-0.log").read_text())) == 3

    done, _ = _cli("-n", "2", "--timeout", "150", "--all-output", str(script), cwd=tmp_path,
                   timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = _progress_lines(done.stdout)
    assert sorted(line[:11] for line in shown) == ["[worker 0] "] * 3 + ["[worker 1] "] * 3
