"""One process of a torch test job: `python -m tests.torch.job MODULE:FUNCTION OUT [JSON]`.

Runs `FUNCTION(**kwargs)` (kwargs from the JSON argument) and pickles what it returns to
OUT; an exception is pickled as its text, then re-raised (the process exits non-zero).
The tests start it as torchrun would (`helpers.start`: `WORLD_SIZE`, `RANK`, ...), or alone
for the one-device reference.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import traceback


def main(target: str, out: str, raw: str = "{}") -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    module, _, name = target.partition(":")
    try:
        result = getattr(importlib.import_module(module), name)(**json.loads(raw))
    except BaseException as err:
        with open(out, "wb") as f:
            pickle.dump({"error": f"{type(err).__name__}: {err}",
                         "traceback": traceback.format_exc()}, f)
        raise
    with open(out, "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
