"""Each setting a lane cannot honour is refused when the factory is decorated (before any
model or step, on every process alike), naming the setting, the lane and what works
instead: the table of docs/parallelize.md ("On each Keras backend"), on the lane this runs on."""

from __future__ import annotations

import pytest

import keras_mgpu_plugins as kmp

LANES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
#: Setting -> (its name in the message, the lanes that refuse it with ValueError).
SETTINGS = {
    "layout_map": ({"layout_map": {"dense.*kernel": (None, "model")}}, "layout_map",
                   ("tensorflow", "torch")),
    "model_parallel": ({"strategy": "model_parallel"}, "model_parallel", ("torch",)),
    "hybrid": ({"strategy": "hybrid"}, "hybrid", ("torch",)),
    "micro_batches": ({"micro_batches": 2}, "micro_batches", ("jax", "torch")),
    "devices": ({"strategy": "mirrored", "devices": ["CPU:0"]}, "devices", ("torch",)),
    "strategy_object": ({"strategy": object()}, "strategy object", ("jax", "torch")),
    "parameter_server": ({"strategy": "parameter_server"}, "parameter_server",
                         ("jax", "torch")),
}


def factory():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_setting_the_lane_cannot_honour_is_refused_naming_it(lane, setting):
    kwargs, name, refusing = SETTINGS[setting]
    if lane not in refusing:
        pytest.skip(f"{setting} is honoured on the {LANES[lane]} lane")
    with pytest.raises(ValueError) as raised:
        kmp.parallelize(**kwargs)(factory)()
    message = str(raised.value)
    assert name in message, message
    assert LANES[lane] in message, message  # the lane it runs on
    assert any(word in message for word in ("Use ", "use ", "Leave ", "Choose ")), message
