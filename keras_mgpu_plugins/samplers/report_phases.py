"""The plot's panels of where each worker's steps go: input, host, compute, per epoch."""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mgpu_plugins.samplers.stragglers import PHASES

#: Most workers drawn (one panel each); a larger job shows the first ones and says so.
MAX_PANELS = 8
_COLORS = {"input": "#d62728", "host": "#ff7f0e", "compute": "#1f77b4"}


def draw_phases(figure: Any, phases: np.ndarray) -> None:
    """Stacked bars, one panel per worker: ms per batch in each phase at each epoch.

    Args:
        figure: A matplotlib (sub)figure to draw into.
        phases: `(epochs, workers, 3)` ms per batch (input, host, compute); NaN as 0.
    """
    epochs, workers = phases.shape[0], phases.shape[1]
    shown = min(workers, MAX_PANELS)
    axes = np.atleast_1d(figure.subplots(1, shown, sharey=True))
    values = np.nan_to_num(phases)
    x = np.arange(1, epochs + 1)
    for w, ax in enumerate(axes):
        bottom = np.zeros(epochs)
        for p, phase in enumerate(PHASES):
            ax.bar(x, values[:, w, p], bottom=bottom, color=_COLORS[phase], label=phase,
                   width=0.8)
            bottom += values[:, w, p]
        ax.set_title(f"worker {w}" if workers > 1 else "this worker", fontsize=10, loc="left")
        ax.set_xlabel("epoch")
        ax.set_xticks(x if epochs <= 12 else x[:: max(1, epochs // 12)])
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("ms per batch")
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    more = f" (the first {shown} of {workers} workers)" if shown < workers else ""
    figure.suptitle("Time per batch by phase: input, host code, inside the step" + more,
                    fontsize=11)
