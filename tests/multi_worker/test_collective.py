"""The cross-worker primitives callbacks build on, between 2 real workers."""

from __future__ import annotations

import numpy as np
import pytest

import keras_mgpu_plugins as kmp

pytestmark = [pytest.mark.multi_worker, pytest.mark.slow, pytest.mark.timeout(240)]


def exchange():
    from keras_mgpu_plugins import collective
    from keras_mgpu_plugins.backends.tensorflow.strategy import get_strategy

    strategy = get_strategy("multi_worker")
    rank = collective.worker_index()
    return {
        "rank": rank,
        "chief": collective.is_chief(),
        "workers": collective.num_workers(),
        "spans": collective.spans_workers(strategy),
        "floats": collective.all_gather(np.array([rank, 0.1 + rank]), strategy),
        "ints": collective.all_gather(np.array([2**62 + rank], dtype=np.int64), strategy),
        "bools": collective.all_gather(np.array([rank == 1]), strategy),
        "any": collective.agree(rank == 1, strategy),
        "all": collective.agree(rank == 1, strategy, how="all"),
        "chief_vote": collective.agree(rank == 0, strategy, how="chief"),
        "broadcast": collective.broadcast(np.array([10.0 * (rank + 1)]), strategy),
        "together_ok": collective.together(lambda: rank * 2, "doubling", strategy),
        "together_failed": failed_together(collective, strategy, rank),
        "same_ok": collective.same_settings({"patience": 3, "mode": "min"}, "Stopper", strategy),
        "same_differs": differing_settings(collective, strategy, rank),
    }


def differing_settings(collective, strategy, rank):
    try:
        collective.same_settings({"patience": 3 + rank, "mode": "min", "every": None},
                                 "Stopper", strategy)
    except collective.SettingsDifferError as err:
        return str(err)
    return None


def failed_together(collective, strategy, rank):
    def fail_on_worker_1():
        if rank == 1:
            raise KeyError("only here")

    try:
        collective.together(fail_on_worker_1, "the step", strategy)
    except Exception as err:  # noqa: BLE001 - the test checks what each worker raised
        return f"{type(err).__name__}: {err}"
    return None


def test_collectives_between_two_workers():
    results = kmp.launch(exchange, num_workers=2, timeout=200)
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["chief"] for r in results] == [True, False]
    for r in results:
        assert r["workers"] == 2 and r["spans"]
        np.testing.assert_array_equal(r["floats"], [[0.0, 0.1], [1.0, 1.1]])
        assert r["floats"].dtype == np.float64
        np.testing.assert_array_equal(r["ints"], [[2**62], [2**62 + 1]])  # exact past 2**53
        np.testing.assert_array_equal(r["bools"], [[False], [True]])
        assert (r["any"], r["all"], r["chief_vote"]) == (True, False, True)
        np.testing.assert_array_equal(r["broadcast"], [10.0])
    assert [r["together_ok"] for r in results] == [0, 2]
    assert [r["same_ok"] for r in results] == [None, None]
    for rank, r in enumerate(results):  # both raise, each naming its own value
        assert r["same_differs"] == (
            "Stopper must be created with the same arguments on every worker: they decide "
            "where it runs collective operations, and a worker that runs fewer would leave the "
            f"others waiting. Differing: patience (here {3 + rank}; differs from the chief's on "
            "worker(s) 1)."
        )
    # the cause travels: every worker raises naming the failing worker's error
    assert [r["together_failed"] for r in results] == [
        "PeerFailedError: the step failed (worker 1: KeyError: 'only here'). "
        "Every worker stops here.",
        "KeyError: 'only here'",
    ]


def test_collectives_answer_locally_in_one_process():
    from keras_mgpu_plugins import collective

    assert collective.all_gather([1.5, 2.0]).tolist() == [[1.5, 2.0]]
    assert collective.agree(False) is False and collective.agree(True, how="all") is True
    assert collective.broadcast([3]).tolist() == [3]
    with pytest.raises(ValueError, match="Received: how='most'"):
        collective.agree(True, how="most")
    assert collective.together(lambda: "done", "a step") == "done"
    assert collective.same_settings({"patience": object()}, "Stopper") is None  # nothing to compare
    with pytest.raises(KeyError, match="only here"):  # its own error, untouched
        collective.together(lambda: {}["only here"], "a step")
