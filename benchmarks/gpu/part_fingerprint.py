"""`WeightSyncVerifier`'s fingerprints on the GPU against a device-to-device copy.

On JAX the verifier fingerprints every copy of every variable (`backends.jax.replica_copies.
Tracked.fingerprints`: each copy read to the host, a CRC-32 of its bytes). Over a model of
`mb` MB of float32 weights (`@kmp.parallelize`, `layers` square Dense layers), medians of
`repeats` calls, in GB of weights per second:

- `fingerprint`: `Tracked.fingerprints()`, what one check costs on each process;
- `host_read`: the same copies read to the host alone (`np.asarray`), no CRC;
- `device_copy`: every variable copied on its device (`jax.device_put(may_alias=False)`),
  the yardstick: it reads (and writes) every byte once on the device.

With one GPU the verifier has no second copy to compare and checks nothing during `fit`;
these are the figures a check costs per device where there are copies.
"""

from __future__ import annotations

import common

SIZES = {
    "gpu": {"mb": 1024, "layers": 8, "repeats": 3},
    "cpu": {"mb": 4, "layers": 2, "repeats": 2},
}


def run(rec: common.Recorder, size: dict) -> None:
    import jax
    import keras
    import numpy as np

    import keras_mgpu_plugins as kmp
    from keras_mgpu_plugins.backends.jax.replica_copies import Tracked
    from keras_mgpu_plugins.callbacks._weight_sync import DEFAULT_STATISTICS

    width = int((size["mb"] * 2**20 / 4 / size["layers"]) ** 0.5)

    @kmp.parallelize
    def build() -> keras.Model:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((width,))]
                                 + [keras.layers.Dense(width) for _ in range(size["layers"])])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = build()
    values = [v.value for v in model.weights]
    nbytes = sum(int(v.nbytes) for v in values)
    tracked = Tracked(list(model.weights), [], DEFAULT_STATISTICS, key=("bench",))
    rec.put(bytes=nbytes, variables=len(values), width=width,
            devices=sorted({str(d) for v in values for d in v.devices()}))
    rates: dict[str, float] = {}
    calls = {
        "fingerprint": tracked.fingerprints,
        "host_read": lambda: [np.asarray(v) for v in values],
        "device_copy": lambda: [c.block_until_ready() for c in [
            jax.device_put(v, next(iter(v.devices())), may_alias=False) for v in values]],
    }
    for name, call in calls.items():
        with rec.step(name):
            seconds = common.median_seconds(call, size["repeats"])
            rates[name] = nbytes / seconds / 1e9
            rec.put(gb_per_s=dict(rates))
    if "fingerprint" in rates and "device_copy" in rates:
        rec.put(ratio_fingerprint_to_device_copy=rates["fingerprint"] / rates["device_copy"],
                ratio_fingerprint_to_host_read=rates["fingerprint"] / rates.get("host_read", np.nan),
                device_copy_read_plus_write_gb_per_s=2 * rates["device_copy"],
                how=f"median of {size['repeats']} calls after one warm-up; GB of weights per s")
