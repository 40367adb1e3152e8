"""What every part of the GPU run shares: its record file, timing, and the run's ceilings.

A part runs in a process of its own (`part.py NAME`), started by `run.py`, which kills it
when its time budget is spent. So a part writes what it measured as it goes: every
`Recorder.put` and every finished `Recorder.step` rewrites the part's record file
(atomically), and a part killed half-way leaves its first figures behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

#: Set by run.py for each part: the run's JSON as written so far (the ceilings part's figures).
RUN_JSON_ENV = "KMP_GPU_RUN_JSON"


class Recorder:
    """A part's findings, rewritten to `path` after each change.

    `result` holds the figures (`put`); `steps` each sub-measurement's status, seconds and,
    if it failed, its message (`step`). A failed step is recorded and the part goes on.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.result: dict[str, Any] = {}
        self.steps: dict[str, dict[str, Any]] = {}
        self.skipped: str | None = None

    def put(self, **values: Any) -> None:
        self.result.update(values)
        self.flush()

    def skip(self, reason: str) -> None:
        """The whole part does not apply here (e.g. the torch lane is not present)."""
        self.skipped = reason
        self.flush()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[dict[str, Any]]:
        """Runs one sub-measurement: its exception is recorded (message, traceback's end)
        and swallowed, so the part goes on to the next one."""
        entry: dict[str, Any] = {"status": "running"}
        self.steps[name] = entry
        self.flush()
        start = time.perf_counter()
        print(f"[{name}] ...", flush=True)
        try:
            yield entry
        except Exception as err:  # recorded, not raised: the next step still runs
            traceback.print_exc()
            entry.update(status="failed", message=f"{type(err).__name__}: {err}"[:2000],
                         traceback=traceback.format_exc()[-3000:])
        else:
            if entry["status"] == "running":
                entry["status"] = "ok"
        entry["seconds"] = round(time.perf_counter() - start, 2)
        print(f"[{name}] {entry['status']} in {entry['seconds']} s", flush=True)
        self.flush()

    @property
    def failed(self) -> list[str]:
        return [f"{name}: {s.get('message', s['status'])}" for name, s in self.steps.items()
                if s["status"] not in ("ok", "skipped")]

    def flush(self) -> None:
        if not self.path:
            return
        data = {"result": self.result, "steps": self.steps, "skipped": self.skipped}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, default=_jsonable)
        os.replace(tmp, self.path)


def _jsonable(value: Any) -> Any:
    """NumPy scalars as plain numbers; anything else JSON lacks as text."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "size", 1) == 1 else str(value)


def run_so_far() -> dict[str, Any]:
    """The run's JSON as run.py last wrote it (`{}` when started alone)."""
    path = os.environ.get(RUN_JSON_ENV)
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """The median wall time of `fn()`, which must wait for its own device work."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bf16_matmul_tflops(n: int, repeats: int = 10, chain: int = 10) -> dict[str, Any]:
    """TFLOP/s of an n x n x n bfloat16 matrix product through `jax.jit`, random inputs.

    Each timing is `chain` products issued back to back, then one wait, so that the
    host's launch and wait cost little against the products; the median of `repeats`.
    """
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 4)
    a, b = (jax.random.normal(k, (n, n), jnp.bfloat16) for k in keys[:2])
    c, d = (jax.random.normal(k, (n, n), jnp.bfloat16) for k in keys[2:])
    product = jax.jit(lambda x, y: x @ y)

    def run() -> None:
        outs = [product(a, b) if i % 2 == 0 else product(c, d) for i in range(chain)]
        for out in outs:  # all issued first: the waits follow the products
            out.block_until_ready()

    seconds = median_seconds(run, repeats, warmup=2) / chain
    return {"n": n, "seconds_per_product": seconds, "tflops": 2 * n**3 / seconds / 1e12,
            "how": f"jax.jit(x @ y), bfloat16, random normal inputs (2 pairs alternating), "
                   f"median of {repeats} timings of {chain} products each"}


def device_copy_gbps(nbytes: int, repeats: int = 10) -> dict[str, Any]:
    """GB/s of a device-to-device copy of `nbytes`, counting bytes read plus bytes written
    (as KINDS.md counts it), two ways: `jax.device_put(x, device, may_alias=False)`,
    and a jitted elementwise kernel that reads and writes every byte once (`x + 1`)."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    x = jax.random.normal(jax.random.key(1), (nbytes // 4,), jnp.float32)
    add = jax.jit(lambda v: v + 1)
    found: dict[str, Any] = {"bytes": int(x.nbytes), "device": str(device)}
    try:
        copy = median_seconds(lambda: jax.device_put(x, device, may_alias=False)
                              .block_until_ready(), repeats, warmup=2)
        found["device_put_gbps"] = 2 * x.nbytes / copy / 1e9
    except TypeError as err:  # an older JAX without may_alias
        found["device_put_gbps"] = None
        found["device_put_error"] = str(err)
    kernel = median_seconds(lambda: add(x).block_until_ready(), repeats, warmup=2)
    found["elementwise_gbps"] = 2 * x.nbytes / kernel / 1e9
    found["how"] = f"median of {repeats}; bytes read + bytes written"
    return found


def ceiling(name: str, fallback: Callable[[], Any]) -> Any:
    """A ceiling the `ceilings` part measured in this run (`name` in its result), else
    `fallback()`, measured now (a part started alone, or the ceilings part failed)."""
    found = run_so_far().get("parts", {}).get("ceilings", {}).get("result", {}).get(name)
    return found if found is not None else fallback()


def log(*args: Any) -> None:
    print(*args, flush=True, file=sys.stdout)
