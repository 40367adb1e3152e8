"""`python -m keras_mgpu_plugins.run`: a script as one worker of a scheduler's job.

```bash
srun python -m keras_mgpu_plugins.run train.py --epochs 3       # SLURM
python -m keras_mgpu_plugins.run train.py --epochs 3            # TF_CONFIG set (Kubernetes, by hand)
python -m keras_mgpu_plugins.run -m mypackage.train --epochs 3  # a module, as python -m
```

It reads the job from the environment (`kmp.topology()`: `TF_CONFIG`, SLURM's
variables) and, when it has several workers, creates the process's
`MultiWorkerMirroredStrategy` (`kmp.strategy.get_strategy("multi_worker")`)
before the script runs, because TensorFlow configures collective ops only
before its runtime starts; `@kmp.parallelize` then uses that strategy, wherever
the script applies it. Then it runs the script as `python script.py args` would:
as `__main__`, with `sys.argv` and the script's folder first on `sys.path`.
A script that runs TensorFlow work at module level (`Normalization.adapt`, an
image resize, a `tf.data` pipeline) before its factory is decorated therefore
runs unchanged, as under `kmp-launch`, whose workers run their script through
`prepare` and `run_program` here. With one worker nothing is created and
TensorFlow is not imported: it is `python script.py`.

Why a command and not an import at the top of the script: nothing of the script
can run before it (an import can be reordered by a formatter, or come after
another import that already runs TensorFlow ops), and the script itself stays
the same under one process, `kmp-launch` and a scheduler.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

USAGE = "usage: python -m keras_mgpu_plugins.run (script.py | -m module) [args ...]"
_HELP = """\
Runs the script (or module) as `python` would, as one worker of a multi-worker
job that a scheduler started (SLURM's srun, Kubernetes, TF_CONFIG set by hand).
When the environment describes several workers, the MultiWorkerMirroredStrategy
is created first, before the script can run any TensorFlow op, as each
kmp-launch worker does: TensorFlow-work at module level (a layer's adapt, an
image resize, a tf.data pipeline) before @kmp.parallelize is then fine.

examples:
  srun python -m keras_mgpu_plugins.run train.py --epochs 3
  python -m keras_mgpu_plugins.run -m mypackage.train --epochs 3"""


def prepare(create_strategy: bool, stall_timeout: float | None = None) -> None:
    """What a worker does before any user code: the strategy, then the watchdog.

    Args:
        create_strategy: Join the job now (the job has several workers and the
            backend's runtime has not started): TensorFlow's multi-worker strategy,
            or `jax.distributed` on JAX.
        stall_timeout: For the launcher's workers (`kmp-launch`, `kmp.launch`): a
            `StallWatchdog` with this timeout in every `fit`, or `None`. Applied as
            soon as Keras is imported (now, if it is): the bootstrap itself never
            imports Keras for it, so the script may still choose its backend first.

    A worker or parameter server of a parameter-server cluster (`TF_CONFIG` with `"ps"`
    tasks, `kmp-launch --ps`) runs TensorFlow's server here and never returns: only the
    chief runs the script.
    """
    from keras_mgpu_plugins import _stop_signals
    from keras_mgpu_plugins.cluster.topology import topology_from_env

    plan = topology_from_env(os.environ)
    if plan.serves:
        from keras_mgpu_plugins import _backend

        _backend.active().serve_parameter_server(plan)  # never returns
    if create_strategy:  # TensorFlow: the multi-worker strategy; JAX: jax.distributed
        from keras_mgpu_plugins import _backend
        from keras_mgpu_plugins.compat import _policy

        _policy.check()  # every lane's version policy, before Keras is imported

        _backend.active().join_job()
    from keras_mgpu_plugins.verify import _config as verify_run

    verify = verify_run.current()
    if verify is not None:  # a process of a kmp-verify run: seeded, recorded
        from keras_mgpu_plugins.verify import _hooks

        _hooks.install(verify)
    # After the runtime's own SIGTERM notifier: a stop signal ends the worker cleanly, or
    # (in a fit with BackupAndRestore) at the step the workers agree on, saved.
    _stop_signals.install(_stop_signals.parse(_stop_signals.DEFAULT_SIGNALS))
    if stall_timeout is not None:
        from keras_mgpu_plugins._after_import import when_imported

        def watch_every_fit(keras: object) -> None:
            from keras_mgpu_plugins.callbacks.stall_watchdog import add_to_every_fit

            add_to_every_fit(stall_timeout)

        when_imported("keras", watch_every_fit)


def run_program(target: str, argv: Sequence[str], module: bool = False) -> None:
    """Runs a script (or, with `module`, a module) as `__main__`, as `python` would.

    Args:
        target: The script's path, or the module's name.
        argv: The program's arguments (`sys.argv[1:]`).
        module: `target` is a module name (`python -m target`).
    """
    sys.argv[:] = [target, *argv]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:  # as `python script.py`: the script's folder first on sys.path
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m keras_mgpu_plugins.run`. Returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{_HELP}", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0].startswith("-m"):
        module = args[0][2:] or (args[1] if len(args) > 1 else "")
        target, rest, is_module = module, args[1 if args[0][2:] else 2:], True
        if not target:
            print(f"{USAGE}\n-m needs a module name. Received: {args}", file=sys.stderr)
            return 2
    else:
        target, rest, is_module = args[0], args[1:], False
        if not os.path.isfile(target):
            print(f"keras_mgpu_plugins.run: can't open file {target!r}: no such file. "
                  f"Received: script={target!r}", file=sys.stderr)
            return 2
    from keras_mgpu_plugins.cluster.topology import topology
    from keras_mgpu_plugins.errors import TrainingStopped

    plan = topology()
    try:
        prepare(create_strategy=plan.is_multi_worker and not plan.is_parameter_server_cluster)
        run_program(target, rest, is_module)
    except TrainingStopped as stopped:  # said already; the runtime could hold the interpreter
        from keras_mgpu_plugins.launch._exit import _exit_after_failure

        _exit_after_failure(int(stopped.code))
    except SystemExit:
        raise
    except BaseException as err:  # noqa: B036 - printed like Python does, then a sure exit
        from keras_mgpu_plugins.launch._exit import _exit_after_failure, _user_traceback

        print(_user_traceback(err), end="", file=sys.stderr)
        _exit_after_failure(1)  # the collective runtime could hold the interpreter
    return 0


if __name__ == "__main__":
    sys.exit(main())
