"""Figures of a Solution: saddle-point means and equal-time variances N Var(q(t)), one column per family of
order parameters (``Phi[1]``, ``Phi[2]`` share a column; two-time kernels on their time diagonal)."""
from __future__ import annotations

import numpy as np

from dmftc.errors import DmftcError


def _equal_time(sol, m, name=None):
    """A deep two-time kernel on its time diagonal ((T, T), or (P, P, T, T) on several points -> (P, P, T))."""
    two = name in sol.info["two_time"] if "two_time" in sol.info else m.ndim == 2
    return np.diagonal(m, axis1=-2, axis2=-1) if sol.kind == "deep" and two else m


def plot_solution(sol, path, width=None):
    """Means (top) and N Var (bottom) per family of observables; with ``width`` N also the mean at width N with
    its spread mean +- 2 sqrt(Sigma / N) (needs a solution with the mean correction).  A solution without a
    propagator shows its means and says so in the bottom row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = {}
    for n in sol.observables or sol.names:
        families.setdefault(n.split("[")[0], []).append(n)
    fig, axes = plt.subplots(2, len(families), figsize=(3.2 * len(families), 5.5), squeeze=False)
    for j, (fam, members) in enumerate(families.items()):
        missing = None
        for n in members:
            m = _equal_time(sol, sol.mean(n), n)
            try:
                v = sol.var(n)
            except DmftcError as err:
                v, missing = None, err
            curves_m = m.reshape(-1, m.shape[-1])
            curves_v = v.reshape(-1, v.shape[-1]) if v is not None else [None] * len(curves_m)
            for k, (cm, cv) in enumerate(zip(curves_m, curves_v)):
                label = n if len(members) > 1 and k == 0 else None
                line = axes[0, j].plot(sol.times, cm, "--" if width else "-", lw=1, label=label)[0]
                if cv is not None:
                    axes[1, j].plot(sol.times, cv, color=line.get_color(), label=label)
                if width and cv is not None:
                    mw = _equal_time(sol, sol.mean_at_width(n, width), n).reshape(-1, m.shape[-1])[k]
                    spread = 2 * np.sqrt(np.clip(cv, 0, None) / width)
                    axes[0, j].plot(sol.times, mw, color=line.get_color(), lw=1.5)
                    axes[0, j].fill_between(sol.times, mw - spread, mw + spread, color=line.get_color(), alpha=0.2)
        if missing is not None:
            axes[1, j].text(0.5, 0.5, "not available", ha="center", transform=axes[1, j].transAxes)
        axes[0, j].set_title(f"{fam}: mean (N = inf)" if not width else f"{fam}: N = {width:g} (dashed: inf)")
        axes[1, j].set_title(f"N Var({fam})")
        axes[1, j].set_xlabel("t")
        if len(members) > 1:
            axes[0, j].legend(fontsize=7)
    fig.suptitle(sol.model + (f", L = {sol.depth}" if sol.kind == "deep" else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
