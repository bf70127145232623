"""Figures of a Solution: saddle-point means and equal-time variances N Var(q(t))."""
from __future__ import annotations

import numpy as np


def plot_solution(sol, path, width=None):
    """Means (top) and N Var (bottom) per order parameter; with ``width`` N also the mean at width N with its
    spread mean +- 2 sqrt(Sigma / N) (needs a solution with the mean correction)."""
    if getattr(sol, "kind", None) == "deep":  # dmftc.runtime.deep_spec.DeepSpecSolution draws itself
        return sol.plot(path, width=width)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sol.names
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.5), squeeze=False)
    for j, n in enumerate(names):
        m, v = sol.mean(n), sol.var(n)
        for k, (curve_m, curve_v) in enumerate(zip(m.reshape(-1, m.shape[-1]), v.reshape(-1, v.shape[-1]))):
            axes[0, j].plot(sol.times, curve_m, *(("k--",) if width else ()), lw=1)
            axes[1, j].plot(sol.times, curve_v)
            if width:
                mw = sol.mean_at_width(n, width).reshape(-1, m.shape[-1])[k]
                spread = 2 * np.sqrt(np.clip(curve_v, 0, None) / width)
                axes[0, j].plot(sol.times, mw, lw=1.5)
                axes[0, j].fill_between(sol.times, mw - spread, mw + spread, alpha=0.2)
        axes[0, j].set_title(f"{n}: mean (N = inf)" if not width else f"{n}: N = {width:g} (dashed: inf)")
        axes[1, j].set_title(f"N Var({n})")
        axes[1, j].set_xlabel("t")
    fig.suptitle(f"{sol.model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return np.asarray(path)
