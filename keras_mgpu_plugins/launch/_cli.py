"""The `kmp-launch` command (`python -m keras_mgpu_plugins.launch`): `main`.

Parses the launcher's own options (those before the script or `-m module`),
then runs the script in N local workers through `launch._run`, and turns the
outcome into the process exit code.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from keras_mgpu_plugins.launch._common import (
    DEFAULT_STALL_TIMEOUT,
    DEFAULT_STOP_GRACE_S,
    STALL_TIMEOUT_ENV,
    _check_common,
    _check_num_ps,
    _run,
    _worker_environ,
    resolve_stall_timeout,
)
from keras_mgpu_plugins.launch._errors import (
    JobStoppedError,
    LaunchError,
    LaunchTimeoutError,
    WorkerFailedError,
)

_CLI_DESCRIPTION = """\
Run a Python script (or module) in N local worker processes, as a TensorFlow
multi-worker job on localhost.

Each worker runs `script.py args...` as __main__, with TF_CONFIG describing a
cluster of N workers on free localhost ports and this one's index, plus
KMP_LAUNCH_WORKER=1, KMP_NUM_WORKERS=N, KMP_WORKER_INDEX=i, KMP_JOB_ID
(one id for the whole run; the parent's value if set) and KMP_JOB_DIR (a
private folder the workers share, removed at the end). Unless
--no-strategy is given, each worker creates its MultiWorkerMirroredStrategy
before the script starts (TensorFlow needs collective ops configured before
its runtime starts); kmp.parallelize, or a MultiWorkerMirroredStrategy the
script creates itself, then uses it. With KERAS_BACKEND=jax, each worker
initialises jax.distributed instead (coordinator: worker 0's port, bound to
127.0.0.1), and kmp.parallelize uses keras.distribution over every process.

Parameter servers (TensorFlow): with --ps P the job is a parameter-server
cluster: a "chief" process runs the script and coordinates, N "worker"
processes run the steps it sends them, and P "ps" processes hold the
variables; @kmp.parallelize(strategy="parameter_server") (or "auto") builds
the model there. Workers and parameter servers only serve; their output goes
to worker-<i>.log and ps-<i>.log. A worker that exits is started again (3
times at most) while the chief goes on with the other workers.

Output: every worker's stdout and stderr go to its log file,
$TMPDIR/kmp-launch-logs/<job id>/worker-<i>.log (--log-dir DIR to choose the
folder; the path is printed); worker 0's is also shown here, and the other
workers' Keras progress bars are off. The backends' own runtime log lines
(TensorFlow's C++ logs, its coordination service's lines, JAX's and torch's
[Gloo] lines) are left out here and kept in the log files: --verbose shows them.
--all-output shows every worker's output here, all of it, progress bars
included. Lines shown are prefixed with "[worker i] ".
When a worker whose output was not shown fails, the last lines of its log are
printed.

Fail-fast: when a worker exits non-zero or dies, the others (and every process
they started) are stopped within seconds. The exit code is 0 when every worker
succeeds, else the first failing worker's exit code (1 for a worker that raised,
even one the launcher had to stop after it; 128+N if it was killed by signal N),
124 when --timeout expires, and 130 on Ctrl-C.

Stop signals: SIGTERM or SIGUSR1 sent to kmp-launch (a scheduler's preemption
notice, a Kubernetes eviction) is forwarded to every worker. In a model.fit with
kmp.callbacks.BackupAndRestore, the workers finish their step, agree on the
step to stop at, the backup is written at that step, and kmp-launch exits with
code 75: run the same command again to resume from that step. Without
BackupAndRestore each worker says that nothing was saved and the exit code is
128+N (143 for SIGTERM). The workers get --stop-grace SECONDS (default 120) to
stop; the same signal again stops them at once. Whatever the ending (success,
a failed worker, --timeout, Ctrl-C, a stop signal), the job's private folder
(kmp-launch-* in the temporary folder: spec, job folder) is removed; the log
files stay.

--max-restarts N runs the job again, up to N times, when a worker was stopped
by a signal (SIGTERM, SIGUSR1 sent to it, not to kmp-launch) or killed (SIGKILL,
the out-of-memory killer): the script resumes from its BackupAndRestore backup.
Each restart is named with its cause; the workers see KMP_RESTART=k. A worker
that raised is not restarted (a rerun would raise again).

No hang is silent: every model.fit in every worker runs with
kmp.callbacks.StallWatchdog(timeout=SECONDS) (a fit that has its own keeps it):
when no worker makes progress for that long, each prints its Python stacks and
the job fails (exit code 70), naming the stuck worker. --stall-timeout SECONDS
sets it (default: $KMP_STALL_TIMEOUT where set, else 600, far above a first
step's compilation); --stall-timeout 0 runs no watchdog. When --timeout
expires, the workers still running print their Python stacks, and the message
names them."""

_CLI_EPILOG = """\
examples:
  kmp-launch -n 2 train.py --epochs 3
  kmp-launch -n 2 --ps 1 train.py              # chief + 2 workers + 1 parameter server
  kmp-launch -n 4 --timeout 600 -m mypackage.train --epochs 3
  kmp-launch -n 2 --stall-timeout 1800 train.py    # a first step that compiles for long
  kmp-launch -n 2 --stall-timeout 0 train.py       # no StallWatchdog
  kmp-launch -n 2 --max-restarts 3 train.py        # rerun after a stop or a lost worker
  kmp-launch -n 2 --all-output --log-dir logs train.py
  python -m keras_mgpu_plugins.launch -n 2 --no-strategy script.py a b"""

_VALUE_OPTIONS = ("-n", "--num-workers", "--ps", "--timeout", "--stall-timeout", "--log-dir",
                  "--stop-grace", "--max-restarts")


def _positive(kind: type, flag: str, zero: str = "") -> Callable[[str], Any]:
    """A parser of positive numbers of `kind`; with `zero` (what 0 means), of 0 too."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            what = "integer" if kind is int else "number"
            valid = f"a positive {what}" + (f", or 0 ({zero})" if zero else "")
            raise argparse.ArgumentTypeError(f"must be {valid}. Received: {flag}={text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kmp-launch", description=_CLI_DESCRIPTION, epilog=_CLI_EPILOG,
        usage="kmp-launch [-n N] [--ps P] [--timeout SECONDS] [--stall-timeout SECONDS] "
              "[--stop-grace SECONDS] [--max-restarts N] [--no-strategy] [--all-output] [--verbose] "
              "[--log-dir DIR] "
              "(script.py | -m module) [args ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--num-workers", type=_positive(int, "-n"), default=2, metavar="N",
                        help="number of worker processes (default: 2)")
    parser.add_argument("--ps", type=_positive(int, "--ps", zero="no parameter servers"),
                        default=0, metavar="P",
                        help="number of parameter servers (TensorFlow): the job is then a "
                             "chief that runs the script, N workers and P parameter servers "
                             "(default: 0, every worker runs the script)")
    parser.add_argument("--timeout", type=_positive(float, "--timeout"), metavar="SECONDS",
                        help="stop every worker and exit with code 124 after this many seconds, "
                             "naming the workers still running, with their Python stacks")
    parser.add_argument("--stall-timeout", type=_positive(float, "--stall-timeout",
                                                          zero="no StallWatchdog"),
                        metavar="SECONDS",
                        help="the timeout of the kmp.callbacks.StallWatchdog added to every "
                             f"model.fit in every worker (default: ${STALL_TIMEOUT_ENV} where "
                             f"set, else {DEFAULT_STALL_TIMEOUT:g}); 0: no watchdog")
    parser.add_argument("--stop-grace", type=_positive(float, "--stop-grace"),
                        default=DEFAULT_STOP_GRACE_S, metavar="SECONDS",
                        help="after a stop signal (SIGTERM, SIGUSR1), how long the workers get "
                             "to save at the agreed step and exit before they are stopped "
                             f"(default: {DEFAULT_STOP_GRACE_S:g})")
    parser.add_argument("--max-restarts", type=_positive(int, "--max-restarts", zero="none"),
                        default=0, metavar="N",
                        help="run the job again, up to N times, when a worker was stopped by a "
                             "signal or killed: the script resumes from its BackupAndRestore "
                             "backup (default: 0)")
    parser.add_argument("--no-strategy", action="store_true",
                        help="do not create the multi-worker strategy before the script starts")
    parser.add_argument("--all-output", action="store_true",
                        help="show every worker's output here, prefixed, progress bars included "
                             "(default: worker 0's; the others' go to their log files)")
    parser.add_argument("--verbose", action="store_true",
                        help="show worker 0's output here with the backends' runtime log lines "
                             "(TensorFlow's C++ logs, coordination and Gloo lines; by default "
                             "they go to the log files only)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="folder of the workers' log files worker-<i>.log (default: "
                             "$TMPDIR/kmp-launch-logs/<job id>)")
    parser.add_argument("-m", dest="module", metavar="module",
                        help="run a module as a script (as `python -m module`)")
    parser.add_argument("script", nargs="?", help="the script each worker runs")
    parser.add_argument("args", nargs="*", help="arguments passed to the script or module")
    return parser


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits the launcher's options from the script's: the script (or `-m module`) ends them."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" or arg == "--":
            return list(argv[: i + 2]), list(argv[i + 2:])
        if arg.startswith("-m"):  # -mmodule
            return list(argv[: i + 1]), list(argv[i + 1:])
        if not arg.startswith("-") or arg == "-":
            return list(argv[: i + 1]), list(argv[i + 1:])
        i += 2 if arg in _VALUE_OPTIONS else 1
    return list(argv), []


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kmp-launch` and `python -m keras_mgpu_plugins.launch`.

    Args:
        argv: Command-line arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The process exit code (see `kmp-launch --help`).
    """
    own, rest = _split_argv(list(sys.argv[1:] if argv is None else argv))
    parser = _parser()
    try:
        options = parser.parse_args(own)
        if (options.script is None) == (options.module is None):
            parser.error("give exactly one of a script or -m module. "
                         f"Received: script={options.script!r}, -m={options.module!r}")
    except SystemExit as exit_:  # --help, or a usage error argparse already printed
        return exit_.code if isinstance(exit_.code, int) else 0
    if options.script is not None and not os.path.isfile(options.script):
        print(f"kmp-launch: can't open file {options.script!r}: no such file. "
              f"Received: script={options.script!r}", file=sys.stderr)
        return 2
    environ = _worker_environ(None)
    try:
        stall = options.stall_timeout
        stall_timeout = resolve_stall_timeout("auto" if stall is None else stall or None, environ)
    except ValueError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return 2
    try:
        _check_num_ps(options.ps, environ)
    except ValueError as err:
        print(f"kmp-launch: {str(err).replace('num_ps', '--ps')}", file=sys.stderr)
        return 2
    spec = {"mode": "script" if options.module is None else "module", "num_ps": options.ps,
            "target": options.script or options.module, "argv": [*options.args, *rest],
            "create_strategy": not options.no_strategy, "stall_timeout": stall_timeout}
    try:
        _check_common(options.num_workers, options.timeout)
        _run(spec, options.num_workers, options.timeout, environ,
             output=("all" if options.all_output else "verbose" if options.verbose else "chief"), log_dir=options.log_dir,
             stop_grace=options.stop_grace, max_restarts=options.max_restarts)
    except JobStoppedError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return err.exit_code
    except WorkerFailedError as err:
        print(f"kmp-launch: {err.summary}", file=sys.stderr)
        if not err.output_shown and err.output_tail:  # its traceback went to its log only: the cause, here
            print(f"kmp-launch: last lines of worker {err.worker_index}'s output (all of it in "
                  f"{err.log_path}):\n" + "\n".join(err.output_tail), file=sys.stderr)
        code = err.exitcode or 1
        return 128 - code if code < 0 else code
    except LaunchTimeoutError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return 124
    except LaunchError as err:
        print(f"kmp-launch: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kmp-launch: interrupted; all workers were stopped.", file=sys.stderr)
        return 130
    return 0

