"""The closures kmp's parameter-server `fit` sends to the workers, and how it waits for them.

A closure is one `tf.function` run on one worker by the `ClusterCoordinator`: it runs the
model's own `train_step` (Keras's, or the model class's override) on
`steps_per_execution` batches in a row, reading and updating the variables on the
parameter servers, and returns the logs of its last step (the metrics, whose variables
live on the parameter servers too: every worker's updates count). A closure whose
worker is lost is run again on another worker by the coordinator.

`Window` keeps a few closures in flight per worker and hands the chief's callbacks each
closure's logs in the order the closures were sent (`logs_of`: read again, once the
coordinator has run it again, when its worker was lost while the chief read them).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

#: Closures in flight per worker: one running, one waiting, so no worker waits for the chief.
IN_FLIGHT_PER_WORKER = 2


def train_closure(model: Any, strategy: Any, source: Any) -> Any:
    """The `tf.function` a worker runs for `len(bounds) - 1` (or `count`) steps of `source`."""
    import tensorflow as tf

    from keras_mgpu_plugins.backends.tensorflow.parameter_server.data import ArrayInput

    def step(data: Any) -> Any:
        logs = strategy.run(model.train_step, args=(data,))
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], logs)

    # Like Keras's own step functions: no AutoGraph conversion of the model's train_step.
    if isinstance(source, ArrayInput):
        @tf.function(autograph=False)
        def run_on_rows(rows: Any, bounds: Any) -> Any:
            batch = source.batches(rows, bounds)
            return _repeat(step, batch, tf.shape(bounds, out_type=tf.int64)[0] - 1)

        return run_on_rows

    @tf.function(autograph=False)
    def run_on_iterator(iterator: Any, count: Any) -> Any:
        return _repeat(step, lambda i: next(iterator), count)

    return run_on_iterator


def _repeat(step: Callable[[Any], Any], batch: Callable[[Any], Any], count: Any) -> Any:
    """`step(batch(i))` for i in [0, count): the logs of the last (a graph loop, traced once)."""
    import tensorflow as tf

    logs = step(batch(tf.constant(0, tf.int64)))

    def body(i: Any, _: Any) -> Any:
        return i + 1, step(batch(i))

    _, logs = tf.while_loop(lambda i, _: i < count, body,
                            (tf.constant(1, tf.int64), logs))
    return logs


class Window:
    """Closures in flight, their logs handed to `on_done(end_step, logs)` in sending order.

    Args:
        coordinator: The `ClusterCoordinator`.
        num_workers: Workers of the cluster (the window is `IN_FLIGHT_PER_WORKER` each).
        on_done: Called with a closure's last step and its logs (NumPy), in order.
    """

    def __init__(self, coordinator: Any, num_workers: int,
                 on_done: Callable[[int, dict], None]) -> None:
        self.coordinator, self.on_done = coordinator, on_done
        self.size = IN_FLIGHT_PER_WORKER * max(1, num_workers)
        self.pending: collections.deque = collections.deque()
        self.last_logs: dict = {}

    def send(self, fn: Any, args: tuple, end_step: int) -> None:
        """Schedules `fn(*args)` on a free worker; hands over the oldest logs when full."""
        self.pending.append((end_step, self.coordinator.schedule(fn, args=args)))
        while len(self.pending) > self.size:
            self._hand_over()

    def drain(self) -> dict:
        """Waits for every closure sent (an error of one is raised), hands over their logs."""
        self.coordinator.join()
        while self.pending:
            self._hand_over()
        return self.last_logs

    def abandon(self) -> None:
        """After an error on the chief: waits for the closures in flight, keeps their errors
        to itself (the chief's error is the one raised)."""
        self.pending.clear()
        try:
            self.coordinator.join()
        except Exception:  # noqa: BLE001, S110 - the caller is already raising
            pass

    def _hand_over(self) -> None:
        end_step, remote = self.pending.popleft()
        self.last_logs = logs_of(self.coordinator, remote)
        self.on_done(end_step, self.last_logs)


def logs_of(coordinator: Any, remote: Any) -> Any:
    """The result (NumPy) of the closure behind `remote`, read once it is final.

    TensorFlow marks a closure's result ready once its worker was sent the function, which
    the worker may still be running, and `fetch` then copies the result from that worker.
    When the worker is lost meanwhile, that copy fails (`UnavailableError`: connection
    refused), but the coordinator runs the closure again on another worker and copies the
    new result itself. So after a failed `fetch`: wait until every closure sent is done
    (`join`, which raises a closure's own error, as `fetch` would), then read the result
    again. Without this, tests/multi_worker/test_parameter_server.py's killed-worker test
    fails on the chief in 3 of 3 runs.
    """
    try:
        return remote.fetch()
    except Exception:  # noqa: BLE001 - join and the second fetch raise what is not a lost worker
        coordinator.join()
        return remote.fetch()
