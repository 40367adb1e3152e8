"""The likely causes of a difference, from what kmp saw in the parallel run's model.

`likely(facts, comparison, lane)` returns `(key, sentence)` pairs, the likeliest first.
Each cause kmp can name (`CAUSES`) is present in the model or not (`_facts`); among
those present, the ones the differing figures point to come first: a variable of its
layers among those that differ most, or only metrics differing (the loss and the
variables within noise: a metric that is not reduced).
"""

from __future__ import annotations

from typing import Any

#: Every cause the report can name.
CAUSES = ("batchnorm", "train_step", "loss", "embedding", "metric", "random_layers",
          "steps_per_execution", "loss_scale")

_KERAS_REDUCTIONS = ("sum_over_batch_size", "mean", "sum", None)


def _touches(layers: list[str], top: list[tuple[str, float]]) -> int:
    """4 when the variable that differs most is one of `layers`', 2 when another of the
    top ones is, else 0."""
    hits = [any(f"/{layer}/" in f"/{name}" for layer in layers) for name, _ in top]
    return 4 if hits[:1] == [True] else 2 if any(hits) else 0


def likely(facts: dict[str, Any] | None, comparison: Any, lane: str) -> list[tuple[str, str]]:
    """The causes present in the model, the likeliest first (see the module docstring)."""
    if not facts:
        return []
    top = comparison.top_variables
    loss_parted = any(k == "loss" for k in comparison.parted_keys)
    only_metrics = bool(comparison.parted_keys) and not loss_parted and \
        "variables" not in comparison.first_what
    found: list[tuple[int, str, str]] = []

    def add(score: int, key: str, sentence: str) -> None:
        found.append((score, key, sentence))

    compiled = {m["name"] for m in facts["metrics"]}
    for key in comparison.parted_keys:
        if key != "loss" and key not in compiled:
            add(6 if only_metrics else 2, "metric",
                f"the logged value {key!r} is not a metric Keras reduces over the replicas: a "
                "custom train_step returns it from each replica's share of the batch (feed it "
                "to a keras.metrics.Metric tracked by the model, e.g. keras.metrics.Mean)")
    custom_metrics = [m for m in facts["metrics"] if not m["module"].startswith("keras.")
                      and m["name"] in comparison.parted_keys]
    for metric in custom_metrics:
        add(6 if only_metrics else 2, "metric",
            f"metric {metric['name']!r} ({metric['class']}) is not reduced as one device "
            "computes it: its state is each replica's own (make every state variable a sum "
            "Keras adds over the replicas, e.g. with self.add_variable(..., aggregation='sum'))")
    if only_metrics and found:  # the loss and the variables agree: a metric's own reduction
        return [(k, s) for _, k, s in sorted(found, key=lambda f: -f[0])]
    unsynced = [b["layer"] for b in facts["batchnorm"] if not b["synchronized"]]
    if unsynced:
        add(5 + _touches(unsynced, top), "batchnorm",
            f"BatchNormalization without sync_batchnorm ({', '.join(unsynced[:4])}): each "
            "replica normalises over its own share of the batch. Use "
            "@kmp.parallelize(sync_batchnorm=True)")
    drawing = [r["layer"] for r in facts["random_layers"] if r["draws"]]
    uncovered = facts.get("uncovered") or []
    if uncovered:
        add(6, "random_layers",
            f"layers drawing random numbers ({', '.join(uncovered[:4])}) draw through a "
            "function kmp cannot draw as one device (categorical, shuffle, gamma, binomial, "
            "beta): each replica draws other numbers than one device")
    elif drawing and not facts.get("random_layers_as_one_device"):
        add(5, "random_layers",
            f"layers drawing random numbers ({', '.join(drawing[:4])}) draw other numbers on "
            "each replica than one device draws for the same rows. Use "
            "@kmp.parallelize(random_layers=\"one_device\")" + (
                "" if lane != "jax" else " (on JAX they draw over the global batch already)"))
    if facts["train_step"]:
        add(4 + loss_parted, "train_step",
            f"a custom train_step ({facts['train_step']}) whose loss may not be scaled for "
            "the global batch: on N replicas each computes its share's loss and the gradients "
            "are summed (compute the loss with self.compute_loss, or divide a sum by the "
            "global batch, and call self.optimizer.apply)")
    weighted = [str(loss["name"]) for loss in facts["losses"]
                if loss["reduction"] == "mean_with_sample_weight"]
    unscaled = [str(loss["name"]) for loss in facts["losses"]
                if loss["reduction"] not in _KERAS_REDUCTIONS or (
                    not loss["module"].startswith("keras") and loss["reduction"] is None)]
    if weighted:
        add(4 + loss_parted, "loss",
            f"a loss divided by each replica's own sample weights ({', '.join(weighted)}: "
            "reduction='mean_with_sample_weight'), not the global batch's; use "
            "reduction='sum_over_batch_size'")
    elif unscaled:
        add(4 + loss_parted, "loss",
            f"a loss not averaged over the global batch ({', '.join(unscaled)}): a sum, or a "
            "function of your own, over each replica's share; use "
            "reduction='sum_over_batch_size', or divide by the global batch")
    if facts["embeddings"]:
        add(2 + _touches(facts["embeddings"], top), "embedding",
            f"sparse gradients of {', '.join(facts['embeddings'][:4])}: a row the batch "
            "repeats gets one slice per replica and occurrence (kmp sums them per row for "
            "the optimizer it was compiled with; another optimizer, or a custom train_step's, "
            "does not)")
    if facts["loss_scale"] or "float16" in facts["dtype_policy"]:
        add(3, "loss_scale",
            f"mixed precision ({facts['dtype_policy']}, loss scaling): each replica rounds its "
            "share's gradient to float16 before the sum, one device rounds the sum once")
    if facts["steps_per_execution"] > 1:
        add(1, "steps_per_execution",
            f"steps_per_execution={facts['steps_per_execution']}: the logs are reduced once "
            "per execution; compare with steps_per_execution=1")
    found.sort(key=lambda f: -f[0])
    return [(k, s) for _, k, s in found]
