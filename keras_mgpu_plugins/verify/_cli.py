"""The `kmp-verify` command (`python -m keras_mgpu_plugins.verify`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

_DESCRIPTION = """\
Prove that your @kmp.parallelize'd script trains on N devices as on one device,
or learn where the two part.

The script runs unchanged, three times, each from the same seed (Python's random,
NumPy's global generator, Keras and its backend): on one device; on one device
with the rows of each training batch reversed (the script's own float noise: N
replicas sum in another order); and on N devices, simulated on this machine's
first GPU or its CPU (TensorFlow, JAX), or N processes with --processes. Keras on
torch trains one device per process: there -n N always means N processes. A
kmp.simulate_devices(n) or kmp.launch(...) call in the script follows the run.

The first --steps training steps of the first model.fit are recorded (the loss
and metrics after each step, every variable), then that fit stops; each epoch's
validation logs, every variable at the end, and the first evaluate and predict
after it. A figure is within noise when its difference from one device is at
most 10 times its difference in the noise run (1e-6 at least), or --tolerance.

Verdict and exit code: EQUAL (0): every figure within noise. DIFFER (1): the
first step where the loss, a metric or the variables leave the noise, the
variables that differ most there, and the likely cause kmp sees in the model.
CANNOT COMPARE (1): the script never calls fit, calls it on a model
@kmp.parallelize did not build, reads a random source kmp cannot seed, or trains
on other data in the runs; the reason is named. Usage errors exit with 2."""

_EPILOG = """\
examples:
  kmp-verify -n 2 train.py --epochs 3
  kmp-verify -n 4 --steps 16 --json verify.json train.py
  kmp-verify -n 2 --processes -m mypackage.train
  KERAS_BACKEND=torch kmp-verify -n 2 train.py       # 2 processes"""

_VALUE_OPTIONS = ("-n", "--num-workers", "--steps", "--tolerance", "--json", "--timeout",
                  "--log-dir", "--random-layers", "--fits")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kmp-verify", description=_DESCRIPTION, epilog=_EPILOG,
        usage="kmp-verify [-n N] [--steps K] [--fits F] [--tolerance T] [--processes] [--json PATH] "
              "[--random-layers {one_device,script}] [--timeout SECONDS] [--log-dir DIR] "
              "(script.py | -m module) [args ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num-workers", type=int, default=2, metavar="N",
                        help="devices (or processes) compared with one device (default: 2)")
    parser.add_argument("--steps", type=int, default=None, metavar="K",
                        help="training steps of the first fit to compare (default: 32)")
    parser.add_argument("--fits", type=int, default=1, metavar="F",
                        help="how many of the script's fits to compare, the first ones, each "
                             "with the evaluate and predict after it (default: 1)")
    parser.add_argument("--tolerance", type=float, default=None, metavar="T",
                        help="absolute tolerance of every figure (default: 10 times the "
                             "script's measured noise; the noise run is then skipped)")
    parser.add_argument("--processes", action="store_true",
                        help="N processes of one device each instead of N devices in one "
                             "process (on torch always)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--random-layers", choices=("one_device", "script"),
                        default="one_device",
                        help="one_device (default): random layers (Dropout, augmentation) "
                             "draw one device's numbers in every run; script: as the script "
                             "says (@kmp.parallelize(random_layers=...))")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="seconds each run may take (default: no limit)")
    parser.add_argument("--log-dir", metavar="DIR",
                        help="folder of the runs' outputs (default: a new temporary folder)")
    parser.add_argument("-m", dest="module", metavar="module",
                        help="run a module as a script (as `python -m module`)")
    parser.add_argument("script", nargs="?", help="the script to verify")
    parser.add_argument("args", nargs="*", help="the script's arguments")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """kmp-verify's options, then the script's (the script or `-m module` ends them)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "--"):
            return argv[: i + 2], argv[i + 2:]
        if arg.startswith("-m"):
            return argv[: i + 1], argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return argv[: i + 1], argv[i + 1:]
        i += 2 if arg in _VALUE_OPTIONS else 1
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    """Runs kmp-verify; returns the exit code (0 equal, 1 differ or cannot compare, 2 usage)."""
    from keras_mgpu_plugins.verify import _verification as verify
    from keras_mgpu_plugins.verify._runs import Target

    own, rest = _split(list(sys.argv[1:] if argv is None else argv))
    parser = _parser()
    try:
        options = parser.parse_args(own)
        if (options.script is None) == (options.module is None):
            parser.error("give exactly one of a script or -m module. Received: "
                         f"script={options.script!r}, -m={options.module!r}")
        steps = verify.DEFAULT_STEPS if options.steps is None else options.steps
        verify.check(options.num_workers, steps, options.tolerance, options.timeout,
                      options.random_layers, options.fits)
    except ValueError as err:
        flag = str(err).replace("num_workers", "-n").replace("steps", "--steps").replace(
            "fits", "--fits")
        print(f"kmp-verify: {flag}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help, or a usage error argparse printed
        return exit_.code if isinstance(exit_.code, int) else 0
    if options.script is not None and not os.path.isfile(options.script):
        print(f"kmp-verify: can't open file {options.script!r}: no such file. "
              f"Received: script={options.script!r}", file=sys.stderr)
        return 2
    target = Target(script=options.script or options.module, module=options.module is not None,
                    argv=(*options.args, *rest))
    try:
        report = verify.run(target, options.num_workers, steps=steps,
                            tolerance=options.tolerance, processes=options.processes,
                            json_path=options.json, timeout=options.timeout,
                            log_dir=options.log_dir, random_layers=options.random_layers,
                            fits=options.fits)
    except KeyboardInterrupt:
        print("kmp-verify: interrupted; every run was stopped.", file=sys.stderr)
        return 130
    print(report)
    return report.exit_code
