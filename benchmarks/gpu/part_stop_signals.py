"""What watching for stop signals costs per step on the device: one process, JAX.

`benchmarks/callbacks_overhead.py`'s job run in this process (no launcher: one process
of one device, as a job on one GPU runs): its MLP (64-`width`-`width`-10, Adam, batch 256,
`@kmp.parallelize`), fits of `epochs` x `steps` steps, each next to its reference's, the
order alternating between `rounds` rounds, the median of the rounds' ratios (speed per
step, subject / reference; epoch-level hooks, the backup's saves, taken off and reported
apart in ms per epoch):

- `BackupAndRestore`: `BackupAndRestore()` at its defaults (the stop signals watched)
  against a plain fit with no callback;
- `stop_signals`: `BackupAndRestore()` against `BackupAndRestore(stop_signals=None)`: the
  watch alone.

On a GPU a step of this small model is mostly the host's work (Keras's loop, the
dispatch), so a per-step cost of the watch shows here at its largest. The goal is
callbacks_overhead.py's: a ratio >= 0.99.
"""

from __future__ import annotations

import tempfile

import common

SIZES = {
    "gpu": {"steps": 100, "epochs": 2, "rounds": 3, "width": 1024},
    "cpu": {"steps": 4, "epochs": 2, "rounds": 1, "width": 32},
}
PAIRS = (("BackupAndRestore", "BackupAndRestore", "plain"),
         ("stop_signals", "BackupAndRestore", "BackupAndRestore(stop_signals=None)"))
GOAL = 0.99


def run(rec: common.Recorder, size: dict) -> None:
    import callbacks_overhead  # benchmarks/ (part.py puts it on sys.path)
    import keras

    steps, epochs = size["steps"], size["epochs"]
    with rec.step("fits"), tempfile.TemporaryDirectory(prefix="kmp-gpu-stop-") as folder:
        found = callbacks_overhead.job(steps, epochs, size["rounds"], size["width"], folder,
                                       pairs=PAIRS, warmup=("BackupAndRestore", "plain"))
        summary = callbacks_overhead.summarize(found["times"], steps, epochs)
        for figures in summary.values():
            figures.update(goal=GOAL, extra_ms_per_step=figures["step_ms"]
                           - figures["reference_step_ms"])
        rec.put(keras_backend=keras.backend.backend(), device=_device(),
                replicas=found["replicas"], **summary,
                how=f"callbacks_overhead.job in one process: MLP 64-{size['width']}-"
                    f"{size['width']}-10, Adam, batch 256, fits of {epochs} epochs x {steps} "
                    f"steps each next to its reference's, median of {size['rounds']} rounds; "
                    "epoch-level hooks not counted")


def _device() -> str:
    import jax

    return str(jax.devices()[0])
