"""What a process of a `kmp-verify` run is told: one environment variable, read at call time.

`kmp-verify` (and `kmp.verify`) start each of their runs with `KMP_VERIFY` set to a JSON
object: the folder the records go to, which run this is (`"reference"`: one device;
`"noise"`: one device, each batch's rows in another order; `"parallel"`: N devices or
processes), how many devices each process has, how many processes the run has, and how
many steps to record. This module reads it, and holds the two overrides that keep a
script unchanged: `kmp.simulate_devices(n)` splits the device as the run says, whatever
`n` the script asks for, and `kmp.launch(fn, ...)` runs `fn` in the calling process
(kmp-verify started the processes the run needs already). No backend, no Keras.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
from typing import Any

#: The variable that makes a process part of a verify run (its JSON: `Config`).
ENV = "KMP_VERIFY"
#: The runs of one verification, in the order they are reported.
RUNS = ("reference", "noise", "parallel")


@dataclasses.dataclass(frozen=True)
class Config:
    """One run of a verification, as its processes see it.

    Attributes:
        folder: Where each process writes what it recorded.
        run: `"reference"`, `"noise"` or `"parallel"`.
        devices: Devices of each process (simulated where the backend allows).
        workers: Processes of the run.
        steps: Training steps of the first `fit` to record; the fit stops after them.
        seed: The seed every run starts from (`keras.utils.set_random_seed`).
        fits: How many fits to compare (the first ones).
        random_off: Random layers turned off in this run (they pass their inputs on): those
            that draw through functions kmp cannot draw as one device.
        random_layers: `"one_device"`: the random layers of the models `@kmp.parallelize`
            builds draw one device's numbers (its `random_layers` option); `"script"`: as
            the script says.
    """

    folder: str
    run: str
    devices: int = 1
    workers: int = 1
    steps: int = 32
    seed: int = 1337
    random_layers: str = "one_device"
    fits: int = 1
    random_off: tuple[str, ...] = ()

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def current() -> Config | None:
    """This process's run, or `None` outside a verify run."""
    text = os.environ.get(ENV)
    if not text:
        return None
    fields = json.loads(text)
    fields["random_off"] = tuple(fields.get("random_off", ()))
    return Config(**fields)


def devices_for(asked: int) -> int:
    """How many devices `kmp.simulate_devices(asked)` splits: the run's count in a verify
    run (the script's own count belongs to its normal runs), else `asked`."""
    config = current()
    return asked if config is None else config.devices


def launches_in_place() -> bool:
    """Whether `kmp.launch(fn, ...)` runs `fn` in this process: in a verify run, whose
    processes kmp-verify started already (one for the one-device runs, N for the parallel
    run with processes), a launch of its own would train on another count."""
    return current() is not None


#: The models `@kmp.parallelize` built in this process (a fit on another one cannot be
#: compared: kmp does not distribute it).
_BUILT: weakref.WeakSet = weakref.WeakSet()


def mark_built(model: Any) -> Any:
    """Notes that `@kmp.parallelize` built `model`; returns it."""
    try:
        _BUILT.add(model)
    except TypeError:  # not weakly referable: nothing kmp distributes
        pass
    return model


def built_by_kmp(model: Any) -> bool:
    return model in _BUILT


#: How many `@kmp.parallelize` factories are running now (a fit inside one, a teacher
#: trained while the factory builds its student, belongs to the building).
_BUILDING: list[int] = [0]


def building() -> bool:
    return _BUILDING[0] > 0


class Building:
    """Marks the time a decorated factory runs (`with Building(): factory()`)."""

    def __enter__(self) -> None:
        _BUILDING[0] += 1

    def __exit__(self, *exc: Any) -> None:
        _BUILDING[0] -= 1

