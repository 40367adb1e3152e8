"""`kmp.launch` ships the source of what it pickles by value: AutoGraph works in the workers.

cloudpickle names every code object it pickles by value `"<dynamic-code>"`, so a function
of `__main__` had no source in the workers: AutoGraph ran `tf.function` / `Dataset.map`
functions unconverted ("AutoGraph could not transform ...") and `if x < 0:` over a tensor
raised `OperatorNotAllowedInGraphError`, where one process works. Scripts run as
`python dir/script.py` from another folder, as `python -c`, and a notebook-like cell
(source in `linecache` only); `kmp-launch` runs the same script as a program.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(300)]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
AUTOGRAPH_WARNING = "AutoGraph could not transform"

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import keras
    import tensorflow as tf
    import keras_mgpu_plugins as kmp


    def clip(features, label):
        a = features["a"]
        if a[0] < 0:  # Python control flow over a tensor: converted by AutoGraph
            a = -a
        return {"a": a, "b": features["b"]}, label


    @tf.function
    def signed_sum(xs):
        total = tf.constant(0.0)
        for x in xs:
            if x > 1.0:
                total += x
            else:
                total -= x
        return total


    def build():
        a, b = keras.Input((1,), name="a"), keras.Input((1,), name="b")
        out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(3))(
            keras.layers.Concatenate()([a, b]))
        model = keras.Model({"a": a, "b": b}, out)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model


    def job():
        rng = np.random.default_rng(7)
        a, b = rng.normal(size=(2, 64, 1)).astype("float32")
        y = (2 * np.abs(a) - b).astype("float32")
        data = tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, y)).map(clip)
        model = kmp.parallelize(build)()
        model.fit(data.batch(16), epochs=2, verbose=0)
        return {"mapped": [float(f["a"][0]) for f, _ in data.take(4)],
                "signed_sum": float(signed_sum(tf.constant([2.0, 0.5, 3.0]))),
                "weights": [w.tolist() for w in model.get_weights()]}


    if __name__ == "__main__":
        if sys.argv[1:] == ["launch"]:
            workers = kmp.launch(job, num_workers=2, timeout=240)
            print("RESULT " + json.dumps({"workers": workers, "one": job()}), flush=True)
        else:  # a program run by kmp-launch: every worker runs it
            print("RESULT " + json.dumps(job()), flush=True)
''')

# `python -c`: a cell compiled under a file name that exists nowhere, its lines in linecache
# only, as IPython/ipykernel do; and inspect.getsource of a function of the program itself
# (AutoGraph leaves code named "<string>" unconverted, in one process too).
DASH_C = textwrap.dedent('''
    import inspect, json, linecache
    import keras_mgpu_plugins as kmp

    def double(x):
        return 2 * x

    CELL = """
    import tensorflow as tf

    def clip(x):
        if x < 0:
            x = -x
        return x

    def cell_job():
        data = tf.data.Dataset.from_tensor_slices([-2.0, 1.0, -3.0, 0.5]).map(clip)
        try:
            source = inspect.getsource(double)
        except OSError as err:
            source = str(err)
        return [float(v) for v in data], source
    """
    name = "/nonexistent/ipykernel_0/cell-1.py"
    linecache.cache[name] = (len(CELL), None, CELL.splitlines(True), name)
    exec(compile(CELL, name, "exec"), globals())
    workers = kmp.launch(cell_job, num_workers=2, timeout=240, create_strategy=False)
    print("RESULT " + json.dumps({"workers": workers, "one": cell_job()}), flush=True)
''')


def _env() -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "KMP_")) and k != "TF_CONFIG"}
    return {**env, "PYTHONPATH": pythonpath, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _run(command: list[str], cwd: pathlib.Path) -> tuple[str, list[dict]]:
    done = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=280)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    results = [json.loads(line.partition("RESULT ")[2]) for line in done.stdout.splitlines()
               if "RESULT " in line]
    return output, results


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    (root / "prog").mkdir()
    (root / "elsewhere").mkdir()
    path = root / "prog" / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def launched(script):
    # Started from another folder, with a relative path: `python ../prog/train.py launch`.
    return _run([sys.executable, os.path.join("..", "prog", "train.py"), "launch"],
                cwd=script.parent.parent / "elsewhere")


def test_autograph_converts_main_functions_in_the_workers(launched):
    output, [result] = launched
    assert AUTOGRAPH_WARNING not in output and "OperatorNotAllowedInGraphError" not in output
    one = result["one"]
    assert len(one["mapped"]) == 4 and min(one["mapped"]) >= 0  # the `if` ran
    assert one["signed_sum"] == 4.5
    for worker in result["workers"]:
        assert worker["mapped"] == one["mapped"] and worker["signed_sum"] == one["signed_sum"]
    first, second = (w["weights"] for w in result["workers"])
    assert first == second  # bit-identical across the workers
    for got, want in zip(first, one["weights"], strict=True):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)


def test_kmp_launch_runs_the_same_script_as_a_program(script, launched):
    output, results = _run([sys.executable, "-m", "keras_mgpu_plugins.launch", "-n", "2",
                            "--all-output", "--timeout", "240", str(script), "program"],
                           cwd=script.parent.parent / "elsewhere")
    assert AUTOGRAPH_WARNING not in output
    one = launched[1][0]["one"]
    assert len(results) == 2
    for result in results:
        assert result["mapped"] == one["mapped"] and result["signed_sum"] == one["signed_sum"]
        for got, want in zip(result["weights"], one["weights"], strict=True):
            np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)


def test_dash_c_program_and_notebook_cell_keep_their_source(tmp_path):
    output, [result] = _run([sys.executable, "-c", DASH_C], cwd=tmp_path)
    assert AUTOGRAPH_WARNING not in output
    assert result["one"] == [[2.0, 1.0, 3.0, 0.5], "could not get source code"]
    # The workers have the program's source (from sys.orig_argv): inspect finds it there,
    # and tracebacks show its lines; AutoGraph leaves "<string>" code unconverted anyway.
    assert result["workers"] == [[[2.0, 1.0, 3.0, 0.5], "def double(x):\n    return 2 * x\n"]] * 2
