"""One part of the GPU run, in this process: `python benchmarks/gpu/part.py NAME --result FILE`.

Runs `part_<NAME>.run(recorder, sizes)` with the part's GPU sizes (`SIZES["gpu"]`), or its
tiny CPU sizes with `--cpu-dry-run`; the recorder rewrites FILE as figures come in (run.py
merges it into the run's JSON). Exits 1 if a step of the part failed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the parts and common.py
sys.path.insert(1, os.path.dirname(HERE))  # benchmarks/: the existing benchmark scripts

from common import Recorder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--result", help="the part's record file (JSON)")
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"part_{args.name}")
    sizes = module.SIZES["cpu" if args.cpu_dry_run else "gpu"]
    recorder = Recorder(args.result)
    recorder.put(sizes=sizes)
    try:
        module.run(recorder, sizes)
    except Exception as err:  # outside any step: recorded as the part's own failure
        import traceback

        traceback.print_exc()
        recorder.steps["part"] = {"status": "failed", "message": f"{type(err).__name__}: {err}"[:2000],
                                  "traceback": traceback.format_exc()[-3000:]}
        recorder.flush()
    if recorder.failed:
        print("failed steps:\n  " + "\n  ".join(recorder.failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
