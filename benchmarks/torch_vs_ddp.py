"""kmp on torch against a hand-written DDP loop, and against Keras's own DDP `fit` where installed.

Every job is 2 fresh processes started by `kmp.launch(..., create_strategy=False)` with
`KERAS_BACKEND=torch` (gloo on CPUs, one device each), so the parent may run any backend.
Same model as `workers_vs_loop.py` (an MLP of two hidden layers, `--width` units), Adam,
global batch 256 (128 rows per process), the same generated arrays, no shuffle:

- kmp: `@kmp.parallelize` (which joins the process group) and `fit(x, y, batch_size=256)`
  on the global arrays: each process fed its half of every global batch;
- loop: keras.io's "Multi-GPU distributed training with PyTorch" guide: the Keras model
  wrapped in `torch.nn.parallel.DistributedDataParallel`, `torch.optim.Adam` over its
  parameters, a `DataLoader` with a `DistributedSampler` (batch 128 per process), and its
  `train_model` loop (`zero_grad`, `backward`, `step`, `loss.item()` each step);
- upstream (only where the installed Keras wraps the model in DDP in `fit`, keras-nightly:
  keras-team/keras#23316): `keras.distribution.initialize()` and plain `fit` of each
  process's own half of the rows (`batch_size=128`): what a user of that Keras writes;
- alone (`--explain`): plain Keras `fit` of each process's half, no process group, no
  collective (two separate models): Keras's own cost per step on these processes, which
  splits the gap to the loop into Keras's part (alone / loop) and kmp's (kmp / alone).

In a job, after a warm-up epoch, `--repeats` epochs of `--steps` steps are timed each from
its start to its end; a job's throughput is rank 0's median of global samples per second.
The sides alternate for `--rounds` rounds (kmp first in even rounds); each round gives a
ratio kmp / other, and the median ratio is reported with every round's.

    python benchmarks/torch_vs_ddp.py [--quick] [--rounds 5] [--repeats 3] [--steps 160]
                                      [--explain] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _suite import LOOP, PLAIN, Report, add_arguments
from workers_vs_loop import BATCH, _data, _layers  # the same MLP and data

WIDTH = 512
ENV = {"KERAS_BACKEND": "torch", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def _model(width: int):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(_layers(width))
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _rate(seconds: list[float], steps: int) -> dict:
    import keras_mgpu_plugins as kmp

    return {"samples_per_sec": statistics.median(BATCH * steps / s for s in seconds),
            "rank": kmp.topology().worker_index}


def _timed_fits(model, x, y, batch: int, steps: int, repeats: int) -> dict:
    """A warm-up epoch of `fit`, then `repeats` epochs timed each."""
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        seconds.append(time.perf_counter() - start)
    return _rate(seconds, steps)


def kmp_job(steps: int, repeats: int, width: int) -> dict:
    """One process of the kmp side: `@kmp.parallelize` and `fit` of the global arrays."""
    import keras_mgpu_plugins as kmp

    model = kmp.parallelize(_model)(width)
    x, y = _data(BATCH, steps)
    return _timed_fits(model, x, y, BATCH, steps, repeats)


def loop_job(steps: int, repeats: int, width: int) -> dict:
    """One process of the keras.io guide's hand-written DDP loop."""
    import torch

    import keras_mgpu_plugins as kmp

    here = kmp.topology()
    address = (here.cluster_spec.get("worker") or here.cluster_spec["chief"])[0]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{address.rpartition(':')[2]}",
        rank=here.worker_index, world_size=here.num_workers)
    model = _model(width)
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = _data(BATCH, steps)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH // here.num_workers,
                                         sampler=sampler)

    def train_epoch() -> None:  # the guide's train_model, one epoch
        running_loss, running_loss_count = 0.0, 0
        for inputs, targets in loader:
            outputs = ddp_model(inputs)
            loss = loss_fn(outputs, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            running_loss_count += 1

    train_epoch()  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        train_epoch()
        seconds.append(time.perf_counter() - start)
    torch.distributed.destroy_process_group()
    return _rate(seconds, steps)


def upstream_job(steps: int, repeats: int, width: int) -> dict:
    """One process of Keras's own DDP `fit` (keras-nightly): each process its own half."""
    import keras

    import keras_mgpu_plugins as kmp

    here = kmp.topology()
    address = (here.cluster_spec.get("worker") or here.cluster_spec["chief"])[0]
    keras.distribution.initialize(f"127.0.0.1:{address.rpartition(':')[2]}",
                                  here.num_workers, here.worker_index)
    model = _model(width)
    x, y = _half(here.worker_index, here.num_workers, *_data(BATCH, steps))
    return _timed_fits(model, x, y, BATCH // here.num_workers, steps, repeats)


def alone_job(steps: int, repeats: int, width: int) -> dict:
    """One process of plain Keras `fit` of its own half of the rows, nothing shared."""
    import keras_mgpu_plugins as kmp

    here = kmp.topology()
    model = _model(width)
    x, y = _half(here.worker_index, here.num_workers, *_data(BATCH, steps))
    return _timed_fits(model, x, y, BATCH // here.num_workers, steps, repeats)


def _half(index: int, count: int, x, y) -> tuple:
    """Process `index`'s rows of every global batch (as a DistributedSampler without shuffle
    gives them, contiguous per batch here)."""
    share = BATCH // count
    rows = [i for start in range(0, len(x), BATCH)
            for i in range(start + index * share, start + (index + 1) * share)]
    return x[rows], y[rows]


def upstream_has_ddp() -> bool:
    """Whether the installed Keras wraps the model in DDP in `fit` (read from its source)."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.origin:
        return False
    trainer = pathlib.Path(spec.origin).parent / "src" / "backend" / "torch" / "trainer.py"
    return trainer.is_file() and "DistributedDataParallel" in trainer.read_text()


JOBS = {"kmp": kmp_job, "loop": loop_job, "upstream": upstream_job, "alone": alone_job}


def _job(name: str, steps: int, repeats: int, width: int) -> float:
    import keras_mgpu_plugins as kmp

    results = kmp.launch(JOBS[name], num_workers=2, args=(steps, repeats, width),
                         create_strategy=False, env=ENV, timeout=1800, stall_timeout=None)
    return next(r["samples_per_sec"] for r in results if r["rank"] == 0)


def measure(other: str = "loop", steps: int = 160, repeats: int = 3, rounds: int = 5,
            width: int = WIDTH) -> dict:
    """kmp against `other` ("loop", "upstream" or "alone"): median samples/s of each, ratios
    per round."""
    kmp_rates, other_rates, ratios = [], [], []
    for r in range(rounds):
        order = ("kmp", other) if r % 2 == 0 else (other, "kmp")
        got = {name: _job(name, steps, repeats, width) for name in order}
        kmp_rates.append(got["kmp"])
        other_rates.append(got[other])
        ratios.append(got["kmp"] / got[other])
    return {"kmp": statistics.median(kmp_rates), "other": statistics.median(other_rates),
            "ratio": statistics.median(ratios), "ratios": ratios, "name": other}


#: What each other side is, and the goal kmp's fit is held to against it.
OTHERS = {"loop": ("the keras.io guide's hand-written DDP loop", LOOP),
          "upstream": ("Keras's own DDP fit (keras-nightly)", PLAIN),
          "alone": ("plain Keras fit, no collective (--explain)", None)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--explain", action="store_true",
                        help="also against plain Keras fit with no collective (alone)")
    args = parser.parse_args(argv)
    steps, repeats, rounds, width = ((16, 1, 1, 64) if args.quick else
                                     (args.steps, args.repeats, args.rounds, args.width))
    others = (["loop"] + (["upstream"] if upstream_has_ddp() else [])
              + (["alone"] if args.explain else []))
    report = Report("torch_vs_ddp", "kmp on torch against a hand-written DDP loop, and "
                    "against Keras's own DDP fit", args.quick)
    if "upstream" not in others:
        report.note("Keras's own DDP fit: not measured (the installed Keras has none; "
                    "keras-nightly has, keras-team/keras#23316).")
    for other in others:
        r = measure(other, steps, repeats, rounds, width)
        name, goal = OTHERS[other]
        print(f"kmp fit {r['kmp']:,.0f} samples/s, {other} {r['other']:,.0f} samples/s: "
              f"ratio {r['ratio']:.3f}x (rounds {', '.join(f'{x:.3f}' for x in r['ratios'])})",
              flush=True)
        report.ratio(other, f"kmp fit / {name}, samples/s", r["ratio"], goal, r["ratios"],
                     f"2 gloo processes of kmp.launch, one thread each, MLP 64-{width}-{width}"
                     f"-10, Adam, global batch {BATCH}, {steps}-step epochs, median of "
                     f"{repeats} timed epochs per job, median of {rounds} alternating rounds")
        report.row(f"kmp fit (against {other})", r["kmp"], "samples/s")
        report.row(name, r["other"], "samples/s")
    return report.finish(args.json)


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "torch")
    main()
