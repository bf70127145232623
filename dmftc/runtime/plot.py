"""Figures of a Solution: saddle-point means and equal-time variances N Var(q(t))."""
from __future__ import annotations

import numpy as np


def plot_solution(sol, path):
    if getattr(sol, "kind", None) == "deep":  # dmftc.runtime.deep_spec.DeepSpecSolution draws itself
        return sol.plot(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sol.names
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.5), squeeze=False)
    for j, n in enumerate(names):
        m, v = sol.mean(n), sol.var(n)
        for curve_m, curve_v in zip(m.reshape(-1, m.shape[-1]), v.reshape(-1, v.shape[-1])):
            axes[0, j].plot(sol.times, curve_m)
            axes[1, j].plot(sol.times, curve_v)
        axes[0, j].set_title(f"{n}: mean (N = inf)")
        axes[1, j].set_title(f"N Var({n})")
        axes[1, j].set_xlabel("t")
    fig.suptitle(f"{sol.model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return np.asarray(path)
