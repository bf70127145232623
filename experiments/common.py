"""Shared helpers for the figure scripts: arguments, statistics, agreement checks, output.

Agreement is measured as in ``tests/test_validation.py``: pointwise in time,

    z = |theory - ensemble| / sqrt(se_ensemble^2 + se_theory^2),

with the ensemble Richardson-extrapolated in 1/N from widths N and 2N
(``finite_width_truth(..., extrapolate=True)`` for order parameters; the same
formula, :func:`richardson`, for derived observables such as eigenmode
projections or the total variance).  Points where theory and ensemble agree
exactly (Delta(0) = y, zero variance at t = 0) count as z = 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
Z_MAX = 4.0


def parse_args(name: str, doc: str, extra=None) -> argparse.Namespace:
    """--quick and --out, plus the script's own options added by ``extra(parser)``."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small T, P, E and samples (about 1-3 minutes)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "out" / name, help="output directory")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def ensemble_options(ap: argparse.ArgumentParser) -> None:
    """--E (networks per width) and --samples (Monte Carlo paths of the solve), each defaulting by mode."""
    ap.add_argument("--E", type=int, default=None, help="networks per width (default: by mode)")
    ap.add_argument("--samples", type=int, default=None, help="Monte Carlo paths of the solve (default: by mode)")


# ----------------------------------------------------------------------------- statistics
def sample_stats(x: np.ndarray, N: int):
    """mean, N*var (ddof=1) and their standard errors over axis 0 (formulas of dmftc.validation.ensemble)."""
    E = x.shape[0]
    m = x.mean(axis=0)
    d2 = (x - m) ** 2
    s2 = d2.sum(axis=0) / (E - 1)
    m4 = (d2 * d2).mean(axis=0)
    var_s2 = np.clip((m4 - (E - 3) / (E - 1) * s2 * s2) / E, 0.0, None)
    return m, N * s2, np.sqrt(s2 / E), N * np.sqrt(var_s2)


def total_nvar_stats(x: np.ndarray, N: int, axis: int = 1):
    """N * sum over `axis` of the per-component variances, with its standard error.

    sum_k var_k = <|x - <x>|^2> (ddof=1), the mean of the per-member squared
    deviations d_i, so its standard error is std(d_i) / sqrt(E); this accounts
    for correlations between components.
    """
    E = x.shape[0]
    d = ((x - x.mean(axis=0)) ** 2).sum(axis=axis) * (E / (E - 1))
    return N * d.mean(axis=0), N * d.std(axis=0, ddof=1) / np.sqrt(E)


def richardson(x_n, se_n, x_2n, se_2n):
    """Remove O(1/N) corrections from widths N and 2N: 2 x(2N) - x(N) (as dmftc.validation.truth)."""
    return 2 * x_2n - x_n, np.sqrt(4 * se_2n ** 2 + se_n ** 2)


def richardson3(x_n, se_n, x_2n, se_2n, x_4n, se_4n):
    """Remove O(1/N) and O(1/N^2) corrections from widths N, 2N and 4N: (x(N) - 6 x(2N) + 8 x(4N)) / 3."""
    return ((x_n - 6 * x_2n + 8 * x_4n) / 3,
            np.sqrt(se_n ** 2 + 36 * se_2n ** 2 + 64 * se_4n ** 2) / 3)


def richardson_residual(x_n, x_2n):
    """Estimated error of `richardson` when the width dependence is a rate, x_N = x_inf exp(c / N).

    Where a finite-width effect accumulates in time (a convergence rate shifted by O(1/N), paper App.
    "Perturbation Theory in Rates"), the relative O(1/N) term e = 2 ln(x_N / x_2N) grows with t and the
    O(1/N^2) term the extrapolation leaves, x_inf (2 exp(e/2) - exp(e) - 1) ~ -x_inf e^2 / 4, can exceed the
    ensembles' standard error at late times.  Returns its magnitude (quadratic form where the signs differ)."""
    x_n, x_2n = np.asarray(x_n, float), np.asarray(x_2n, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        same = (x_n * x_2n) > 0
        e = np.where(same, 2 * np.log(np.abs(x_n) / np.where(same, np.abs(x_2n), 1.0)), 0.0)
        exact = np.abs(x_n * np.exp(-e) * (2 * np.exp(e / 2) - np.exp(e) - 1))
        ext = 2 * x_2n - x_n
        quad = np.where(np.abs(ext) > 0, (2 * (x_n - x_2n)) ** 2 / (4 * np.abs(ext)), 0.0)
    return np.where(same, exact, quad)


# ----------------------------------------------------------------------------- agreement
class Agreement:
    """Collects theory-vs-ensemble comparisons and writes summary.json."""

    def __init__(self, name: str, quick: bool):
        self.name, self.quick, self.rows, self.t0 = name, quick, {}, time.time()
        self.meta: dict = {}

    def add(self, label, theory, theory_se, ens, ens_se, *, raw=None, check=True, note=None, local=False,
            window=None):
        """Compare arrays (time last); `raw` is the plotted (unextrapolated) ensemble, reported only.

        With `local`, also report max_t |theory - ensemble| / |ensemble| (for curves on a log scale).
        `window` (boolean over the last axis): the times where the comparison is asserted, e.g. where the
        extrapolation's estimated bias is below its error bar; z outside it is reported as z_outside."""
        theory, ens = np.asarray(theory, float), np.asarray(ens, float)
        se = np.sqrt(np.asarray(ens_se, float) ** 2 + np.asarray(theory_se, float) ** 2)
        d = np.abs(theory - ens)
        peak = max(np.abs(ens).max(), 1e-300)
        # a difference at round-off level (1e-9 of the peak) where both sides are exact (se = 0) is not a miss
        z = np.where(d > max(1e-12, 1e-9 * peak), d / np.maximum(se, 1e-300), 0.0)
        inside = np.ones(z.shape[-1], bool) if window is None else np.asarray(window, bool)
        row = {"z_max": float(z[..., inside].max(initial=0.0)),
               "rel_max": float(d[..., inside].max(initial=0.0) / peak), "checked": bool(check)}
        if window is not None:
            row["window_fraction"] = float(inside.mean())
            row["z_outside"] = float(z[..., ~inside].max(initial=0.0))
        if raw is not None:
            row["raw_rel_max"] = float(np.abs(theory - raw).max() / max(np.abs(raw).max(), 1e-300))
        if local:
            row["local_rel_max"] = float(np.max(d / np.maximum(np.abs(ens), 1e-300)))
        if note:
            row["note"] = note
        self.rows[label] = row
        return row

    def failures(self):
        return {k: r for k, r in self.rows.items() if r["checked"] and not r["z_max"] <= Z_MAX}

    def finish(self, out: Path, **extra) -> None:
        """Write summary.json, print the table, exit 1 if any checked comparison has z > Z_MAX."""
        checked = [r for r in self.rows.values() if r["checked"]]
        summary = {"figure": self.name, "mode": "quick" if self.quick else "full",
                   "runtime_s": round(time.time() - self.t0, 1), "z_threshold": Z_MAX,
                   "max_z_checked": max((r["z_max"] for r in checked), default=0.0),
                   "max_rel_checked": max((r["rel_max"] for r in checked), default=0.0),
                   "passed": not self.failures(), **self.meta, **extra, "comparisons": self.rows}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
        print(f"\n{self.name} ({summary['mode']}, {summary['runtime_s']} s): theory vs Richardson-extrapolated ensembles")
        print(f"  {'comparison':<44}{'max z':>8}{'max rel':>9}{'raw rel':>9}  checked")
        for k, r in self.rows.items():
            raw = f"{r['raw_rel_max']:9.3f}" if "raw_rel_max" in r else " " * 9
            loc = f" (local rel {r['local_rel_max']:.3f})" if "local_rel_max" in r else ""
            if "window_fraction" in r:
                loc += f" (on {100 * r['window_fraction']:.0f}% of times; z outside {r['z_outside']:.2f})"
            print(f"  {k:<44}{r['z_max']:8.2f}{r['rel_max']:9.3f}{raw}  {'yes' if r['checked'] else 'no'}{loc}")
        print(f"  wrote {out / 'summary.json'}")
        bad = self.failures()
        if bad:
            lines = "\n".join(f"  {k}: z = {r['z_max']:.2f} > {Z_MAX}" for k, r in bad.items())
            sys.exit(f"FAILED: {self.name}: theory and finite-width ensembles disagree\n{lines}")


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v)}")


def add_truth(agree: Agreement, label: str, sol, truth, names, raw=None, check=True, note=None):
    """Compare sol.mean / sol.var with a (extrapolated) Truth for each order parameter in `names`."""
    for n in names:
        agree.add(f"{label} <{n}>", sol.mean(n), sol.stderr(n, "mean"), truth.mean[n], truth.mean_se[n],
                  raw=None if raw is None else raw.mean[n], check=check, note=note)
        agree.add(f"{label} N Var({n})", sol.var(n), sol.stderr(n), truth.nvar[n], truth.nvar_se[n],
                  raw=None if raw is None else raw.nvar[n], check=check, note=note)


def add_mean_nvar(agree: Agreement, label: str, name: str, theory: dict, networks: dict, curves: dict,
                  arrays: dict) -> None:
    """Compare the mean and N Var of one quantity (``theory`` / ``networks``: 'mean' and 'nvar' -> (value, se));
    keep the curves for the figure (``curves[(label, name, what)]``) and the arrays for the script's .npz."""
    for what, tag in (("mean", f"<{name}>"), ("nvar", f"N Var({name})")):
        agree.add(f"{label}: {tag}", *theory[what], *networks[what])
        curves[(label, name, what)] = theory[what] + networks[what]
        for side, (x, se) in (("theory", theory[what]), ("networks", networks[what])):
            arrays[f"{label}_{side}_{what}_{name}"], arrays[f"{label}_{side}_{what}_se_{name}"] = x, se


# ----------------------------------------------------------------------------- plotting
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 7.5,
                         "axes.grid": True, "grid.alpha": 0.3})
    return plt


THEORY = dict(color="k", ls="--", lw=1.3)


def theory_handle(plt, label="DMFT theory"):
    from matplotlib.lines import Line2D

    return Line2D([], [], **THEORY, label=label)


def finish_row_figure(plt, fig, legend_ax, title: str, out: Path, name: str) -> Path:
    """Title, tight layout, one shared legend (legend_ax's curves + the theory line) below, save."""
    h, lab = legend_ax.get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(h + [theory_handle(plt)], lab + ["DMFT theory"], loc="lower center", ncol=len(h) + 1)
    return save_figure(fig, out, name)


_DEEP_SYMBOLS = (r"\Delta(t)", r"K(t)", r"\Phi^\ell(t,t)", r"G^\ell(t,t)")


def deep_panels(plt, L: int):
    """Row of four panels for a deep network: (fig, axes, groups, colors); groups = the observables per panel
    (Delta; K; Phi[1..L]; G[1..L]), colors one per layer."""
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    groups = [("Delta",), ("K",), tuple(f"Phi[{l}]" for l in range(1, L + 1)),
              tuple(f"G[{l}]" for l in range(1, L + 1))]
    return fig, axes, groups, plt.cm.plasma(np.linspace(0.1, 0.7, L))


def label_deep_panels(axes, kind: str) -> None:
    """Legends, time axes, titles and y labels of deep_panels for kind 'var' (N Var) or 'mean' (< >)."""
    titles = ("(a) error", "(b) NTK", "(c) feature kernels", "(d) gradient kernels")
    for k, (ax, sym) in enumerate(zip(axes, _DEEP_SYMBOLS)):
        ax.legend(loc="best")
        ax.set_xlabel(r"$t = \eta\,\times$ step")
        label = rf"$N\,\mathrm{{Var}}\,{sym}$" if kind == "var" else rf"$\langle {sym}\rangle$"
        ax.set(title=titles[k] + (" variance" if kind == "var" and k < 2 else ""), ylabel=label)


def add_deep_ensembles(agree: Agreement, label: str, sol, raw, big, names, curves: dict, arrays: dict) -> None:
    """Means and N Var of a deep solution against ensembles at widths N (``raw``) and 2N (``big``), Richardson-
    extrapolated: one comparison each in ``agree``; ``curves[(label, n)]`` = (theory N Var, its se, width-N N Var,
    extrapolated N Var, its se) for :func:`plot_deep_rows`; the arrays saved with the figure go to ``arrays``."""
    diag = lambda a: a if a.ndim == 1 else np.diag(a)  # noqa: E731
    for n in names:
        mu, mu_se = richardson(diag(raw.mean[n]), diag(raw.se_mean[n]), diag(big.mean[n]), diag(big.se_mean[n]))
        v, v_se = richardson(raw.nvar[n], raw.se_nvar[n], big.nvar[n], big.se_nvar[n])
        th_v, th_se = sol.var(n), sol.var_stderr(n)
        agree.add(f"{label}: <{n}>", diag(sol.mean(n)), diag(sol.mean_stderr(n)), mu, mu_se, raw=diag(raw.mean[n]))
        agree.add(f"{label}: N Var({n})", th_v, th_se, v, v_se, raw=raw.nvar[n])
        curves[(label, n)] = (th_v, th_se, raw.nvar[n], v, v_se)
        arrays.update({f"{label}_theory_nvar_{n}": th_v, f"{label}_theory_nvar_se_{n}": th_se,
                       f"{label}_extrap_nvar_{n}": v, f"{label}_extrap_nvar_se_{n}": v_se,
                       f"{label}_ens_nvar_{n}": raw.nvar[n], f"{label}_theory_mean_{n}": diag(sol.mean(n)),
                       f"{label}_extrap_mean_{n}": mu})


def plot_deep_rows(plt, rows: dict, curves: dict, times, *, L: int, N: int, E: int, what: str, out: Path,
                   name: str) -> Path:
    """One row of four N Var panels (Delta, K, Phi[l], G[l]) per entry of ``rows`` (label -> row title) from
    :func:`add_deep_ensembles`' curves: width-N ensembles solid, extrapolated dotted, theory dashed with a 2 se
    band; titled "Deep networks (L = ..) <what>: ..." and saved as out/<name>.png."""
    fig, axes = plt.subplots(len(rows), 4, figsize=(15, 3.4 * len(rows)), squeeze=False)
    panels = [["Delta"], ["K"], [f"Phi[{l}]" for l in range(1, L + 1)], [f"G[{l}]" for l in range(1, L + 1)]]
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for i, (label, title) in enumerate(rows.items()):
        for ax, group in zip(axes[i], panels):
            for c, n in zip(colors, group):
                th, se, rawv, v, _ = curves[(label, n)]
                ax.plot(times, rawv, color=c, lw=2.2, alpha=0.85, label=f"N = {N}" if len(group) == 1 else n)
                ax.plot(times, v, color=c, lw=1.0, ls=":")
                ax.fill_between(times, th - 2 * se, th + 2 * se, color="0.6", alpha=0.35, lw=0)
                ax.plot(times, th, **THEORY)
            ax.set_title(f"{title}: N Var {group[0].split('[')[0]}", fontsize=9 if len(title) < 30 else 8)
            ax.set_xlabel("t")
            if len(group) > 1:
                ax.legend(fontsize=7)
    fig.suptitle(f"Deep networks (L = {L}) {what}: width {N} ensembles (E = {E}; solid, dotted = extrapolated from "
                 f"{N}/{2 * N}) vs the propagator compiled from the spec (dashed, band 2 se)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, name)


def point_panels(axes, times, curves: dict, prefix: str = "") -> None:
    """One panel per name of ``curves`` (name -> (theory, theory_se, ensemble, ensemble_se), time last) for a deep
    spec on several points: one colour per point (P, T) or pair of points (P, P, T; mu <= nu), theory dashed with
    a 2 se band, networks as points with 2 se bars."""
    for ax, (n, (th, th_se, ens, ens_se)) in zip(axes, curves.items()):
        P = th.shape[0]
        pairs = [(m,) for m in range(P)] if th.ndim == 2 else [(m, k) for m in range(P) for k in range(m, P)]
        for i, ix in enumerate(pairs):
            c = f"C{i % 10}"
            ax.plot(times, th[ix], "--", color=c, lw=1)
            ax.fill_between(times, th[ix] - 2 * th_se[ix], th[ix] + 2 * th_se[ix], color=c, alpha=0.2)
            ax.errorbar(times, ens[ix], yerr=2 * ens_se[ix], fmt="o", ms=2.5, color=c, lw=0.8)
        ax.set_title(prefix + n + ("_mu(t)" if th.ndim == 2 else "_{mu nu}(t)" if n == "K" else "_{mu nu}(t, t)"))
        ax.set_xlabel("t")


def finish_deep(agree: Agreement, out: Path, rel_max: float, **extra) -> None:
    """:meth:`Agreement.finish` (z <= Z_MAX), and in full mode also every N Var within ``rel_max`` of its peak."""
    too_far = {k: r["rel_max"] for k, r in agree.rows.items()
               if not agree.quick and "N Var" in k and r["rel_max"] > rel_max}
    agree.finish(out, **extra, max_rel_nvar=max(r["rel_max"] for k, r in agree.rows.items() if "N Var" in k))
    if too_far:
        sys.exit(f"FAILED: {agree.name}: N Var differs by more than {100 * rel_max:g}% of its peak: "
                 + ", ".join(f"{k} {v:.3f}" for k, v in too_far.items()))


def finish_bounds(agree: Agreement, out: Path, rel_mean: float, rel_nvar: float) -> None:
    """:meth:`Agreement.finish` (z <= Z_MAX); in full mode also the means within ``rel_mean`` and N Var within
    ``rel_nvar`` of their peaks (max over time of the difference)."""
    rel = {k: (r["rel_max"], rel_nvar if "N Var" in k else rel_mean) for k, r in agree.rows.items()}
    agree.finish(out, max_rel_mean=max(v for k, (v, _) in rel.items() if "N Var" not in k),
                 max_rel_nvar=max(v for k, (v, _) in rel.items() if "N Var" in k))
    far = {k: v for k, (v, lim) in rel.items() if v > lim}
    if far and not agree.quick:
        sys.exit(f"FAILED: {agree.name}: differences beyond {100 * rel_mean:g}% (means) or {100 * rel_nvar:g}% "
                 "(N Var) of the peak: " + ", ".join(f"{k} {v:.3f}" for k, v in far.items()))


def schedule(kind: str, T: int) -> np.ndarray:
    """Per-step factors lr[0..T-1] of the step size: 'constant' (ones), 'linear' (from 1 down to 0.5) or
    'cosine' (optax.schedules.warmup_cosine_decay_schedule: a warm-up over T/6 steps to 1, then a cosine decay
    to 0.1 at T)."""
    if kind == "constant":
        return np.ones(T)
    if kind == "linear":
        return np.linspace(1.0, 0.5, T)
    import optax

    s = optax.schedules.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1.0, warmup_steps=max(1, T // 6),
                                                     decay_steps=T, end_value=0.1)
    return np.array([float(s(t)) for t in range(T)])


def save_figure(fig, out: Path, name: str) -> Path:
    path = out / f"{name}.png"
    fig.savefig(path, dpi=130, bbox_inches="tight")
    print(f"  wrote {path}")
    return path
