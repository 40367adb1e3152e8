"""`kmp-launch` command line: option parsing, help and usage errors (no worker starts)."""

from __future__ import annotations

import importlib

import pytest

# The module, not the function `kmp.launch` that shares its name on the package.
launch_module = importlib.import_module("keras_mgpu_plugins.launch")
cli_module = importlib.import_module("keras_mgpu_plugins.launch._cli")
main = launch_module.main


@pytest.fixture(autouse=True)
def no_workers(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("no worker may start in these tests")

    monkeypatch.setattr(cli_module, "_run", fail)
    monkeypatch.delenv("KMP_STALL_TIMEOUT", raising=False)


@pytest.mark.parametrize(
    "argv, own, rest",
    [
        (["-n", "2", "t.py", "-n", "5", "--lr=1"], ["-n", "2", "t.py"], ["-n", "5", "--lr=1"]),
        (["-n2", "--timeout", "30", "t.py", "a"], ["-n2", "--timeout", "30", "t.py"], ["a"]),
        (["--timeout=3", "--no-strategy", "t.py"], ["--timeout=3", "--no-strategy", "t.py"], []),
        (["-m", "pkg.train", "--help"], ["-m", "pkg.train"], ["--help"]),
        (["-n", "3", "-mpkg.train", "x"], ["-n", "3", "-mpkg.train"], ["x"]),
        (["--", "-odd-name.py", "a"], ["--", "-odd-name.py"], ["a"]),
        (["--help"], ["--help"], []),
        (["--stall-timeout", "60", "t.py", "a"], ["--stall-timeout", "60", "t.py"], ["a"]),
        (["--log-dir", "logs", "--all-output", "t.py", "a"],
         ["--log-dir", "logs", "--all-output", "t.py"], ["a"]),
    ],
)
def test_the_script_or_module_ends_the_launchers_options(argv, own, rest):
    assert launch_module._split_argv(argv) == (own, rest)


def test_help_documents_the_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for text in ("-n N", "--timeout SECONDS", "--no-strategy", "-m module", "[worker i]",
                 "TF_CONFIG", "KMP_WORKER_INDEX", "124", "--stall-timeout SECONDS",
                 "StallWatchdog(timeout=SECONDS)", "KMP_JOB_DIR", "exit code 70",
                 "No hang is silent", "$KMP_STALL_TIMEOUT", "else 600", "--stall-timeout 0",
                 "--all-output", "--log-dir DIR", "kmp-launch-logs/<job id>/worker-<i>.log"):
        assert text in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "t.py"], "must be a positive integer. Received: -n=0"),
        (["-n", "two", "t.py"], "must be a positive integer. Received: -n=two"),
        (["--timeout", "-1", "t.py"], "must be a positive number. Received: --timeout=-1"),
        (["--timeout", "nan", "t.py"], "must be a positive number. Received: --timeout=nan"),
        (["-n", "2"], "give exactly one of a script or -m module"),
        (["--stall-timeout", "-1", "t.py"],
         "must be a positive number, or 0 (no StallWatchdog). Received: --stall-timeout=-1"),
        (["--stall-timeout", "soon", "t.py"],
         "must be a positive number, or 0 (no StallWatchdog). Received: --stall-timeout=soon"),
    ],
)
def test_usage_errors_exit_2_and_say_what_is_valid(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "usage: kmp-launch" in err


def test_a_missing_script_exits_2(capsys, tmp_path):
    missing = str(tmp_path / "missing.py")
    assert main(["-n", "2", missing]) == 2
    assert f"can't open file {missing!r}" in capsys.readouterr().err


def test_the_cli_exit_code_follows_the_first_failure(monkeypatch, tmp_path, capsys):
    script = tmp_path / "t.py"
    script.write_text("")
    outcomes = iter([
        launch_module.WorkerFailedError("m", summary="worker 1 of 2 exited with code 5.",
                                        worker_index=1, num_workers=2, exitcode=5),
        launch_module.WorkerFailedError("m", summary="killed", worker_index=0,
                                        num_workers=2, exitcode=-9),
        launch_module.LaunchTimeoutError("timed out", timeout=1.0, running_workers=[0]),
        KeyboardInterrupt(),
        launch_module.JobStoppedError("stopped, saved", signal="SIGTERM", saved=True,
                                      exit_code=75),
        launch_module.JobStoppedError("stopped, nothing saved", signal="SIGUSR1", saved=False,
                                      exit_code=138),
        None,
    ])
    seen = []

    def fake_run(spec, num_workers, timeout, environ, output="chief", log_dir=None,
                 stop_grace=None, max_restarts=0):
        seen.append((spec, num_workers, timeout))
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(cli_module, "_run", fake_run)
    codes = [main(["-n", "3", "--timeout", "9", str(script), "a"]) for _ in range(6)]
    assert codes == [5, 128 + 9, 124, 130, 75, 138]
    assert main(["--no-strategy", "--stall-timeout", "30", "-m", "pkg.mod", "b"]) == 0
    assert "kmp-launch: worker 1 of 2 exited with code 5." in capsys.readouterr().err
    assert seen[0] == (
        {"mode": "script", "target": str(script), "argv": ["a"], "create_strategy": True,
         "stall_timeout": 600.0, "num_ps": 0}, 3, 9.0)  # no hang is silent: the default watchdog
    assert seen[-1] == (
        {"mode": "module", "target": "pkg.mod", "argv": ["b"], "create_strategy": False,
         "stall_timeout": 30.0, "num_ps": 0}, 2, None)


@pytest.mark.parametrize("argv, env, expected", [
    ([], None, 600.0),  # launch.DEFAULT_STALL_TIMEOUT
    (["--stall-timeout", "45"], None, 45.0),
    (["--stall-timeout", "0"], None, None),  # no watchdog
    ([], "12.5", 12.5),  # KMP_STALL_TIMEOUT: the default, where set
    ([], "0", None),
    (["--stall-timeout", "45"], "12.5", 45.0),  # the option wins
])
def test_every_fit_gets_a_stall_watchdog_unless_told_not_to(monkeypatch, tmp_path, argv, env,
                                                             expected):
    script = tmp_path / "t.py"
    script.write_text("")
    if env is not None:
        monkeypatch.setenv("KMP_STALL_TIMEOUT", env)
    seen = []
    monkeypatch.setattr(cli_module, "_run", lambda spec, *args, **kwargs: seen.append(spec))
    assert main([*argv, str(script)]) == 0
    assert seen[0]["stall_timeout"] == expected


@pytest.mark.parametrize("value", ["soon", "-5", "inf"])
def test_a_bad_kmp_stall_timeout_exits_2_naming_it(monkeypatch, capsys, tmp_path, value):
    script = tmp_path / "t.py"
    script.write_text("")
    monkeypatch.setenv("KMP_STALL_TIMEOUT", value)
    assert main([str(script)]) == 2
    assert capsys.readouterr().err == (
        "kmp-launch: KMP_STALL_TIMEOUT must be a number of seconds (0: no StallWatchdog). "
        f"Received: KMP_STALL_TIMEOUT={value!r}\n")
