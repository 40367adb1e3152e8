"""`python -m keras_mgpu_plugins.run`: the script runs as with `python`; usage errors.

With no cluster in the environment it creates nothing and imports no TensorFlow; the
multi-worker runs (TF_CONFIG and SLURM variables) are in tests/multi_worker/test_cluster_env.py.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from keras_mgpu_plugins import run

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys
    print("argv", sys.argv[1:], "name", __name__, "path0", sys.path[0],
          "tf", "tensorflow" in sys.modules)
    if sys.argv[1:] == ["raise"]:
        raise ValueError("boom in the script")
    if sys.argv[1:] == ["exit"]:
        sys.exit(7)
""")


def _run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "KMP_")) and k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), cwd.as_posix(),
                                                      os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "keras_mgpu_plugins.run", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def script(tmp_path):
    (tmp_path / "prog").mkdir()
    path = tmp_path / "prog" / "train.py"
    path.write_text(SCRIPT)
    return path


def test_a_script_runs_as_main_with_its_arguments_and_folder(script, tmp_path):
    done = _run(str(script), "a", "--flag", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"argv ['a', '--flag'] name __main__ path0 {script.parent} "
                                   "tf False")


def test_a_module_runs_with_m(script, tmp_path):
    (script.parent / "__init__.py").write_text("")
    done = _run("-m", "prog.train", "x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("argv ['x'] name __main__ path0 ")


def test_a_failing_script_exits_1_with_its_own_traceback(script, tmp_path):
    done = _run(str(script), "raise", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ValueError: boom in the script"
    assert f'File "{script}", line 6, in <module>' in done.stderr
    assert "runpy" not in done.stderr and "keras_mgpu_plugins" not in done.stderr


def test_sys_exit_keeps_its_code(script, tmp_path):
    assert _run(str(script), "exit", cwd=tmp_path).returncode == 7


def test_usage_errors(tmp_path, capsys):
    assert run.main([]) == 2
    assert run.main(["--help"]) == 0
    assert "python -m keras_mgpu_plugins.run (script.py | -m module)" in capsys.readouterr().out
    assert run.main([str(tmp_path / "missing.py")]) == 2
    assert f"Received: script={str(tmp_path / 'missing.py')!r}" in capsys.readouterr().err
    assert run.main(["-m"]) == 2
    assert "-m needs a module name" in capsys.readouterr().err
