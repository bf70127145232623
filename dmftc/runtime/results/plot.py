"""Figures of a Solution: saddle-point means (top row) and equal-time variances N Var(q(t)) (bottom row), one
column per family of order parameters (``Phi[1]``, ``Phi[2]`` share a column; two-time kernels on their time
diagonal), each curve with its Monte Carlo error band (+-2 standard errors).

With ``width`` N the top row also shows the predicted ensemble of width-N networks: its mean to O(1/N) (dashed)
and its spread over initialisations, mean +- 2 sqrt(Sigma / N) (a light band beneath), with the infinite-width
curve drawn on top.  ``ensemble``: measured networks (:func:`plot_solution`) as markers with error bars.
"""
from __future__ import annotations

import numpy as np

from dmftc.errors import DmftcError, ParameterError

__all__ = ["plot_solution", "symbol", "MC_BAND", "CUBATURE_BAND", "width_band_label", "ensemble_label"]

MC_BAND = "±2 s.e. (Monte Carlo)"
CUBATURE_BAND = "±2 x estimated cubature error"
_WIDTH_GREY, _WIDTH_DARK = "0.45", "0.2"      # the predicted width-N ensemble: grey beneath the coloured N = inf
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
          "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "Gamma", "Delta",
          "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"}
_SUBSCRIPT = {"star": r"\star", "hat": r"\wedge"}


def width_band_label(width) -> str:
    return f"width N = {width:g}: ±2 sd over initialisations"


def _tex_word(w: str) -> str:
    if w in _GREEK:
        return "\\" + w
    if w in _SUBSCRIPT:
        return _SUBSCRIPT[w]
    return w if len(w) == 1 else r"\mathrm{" + w + "}"


def symbol(name: str, args: str | None = "t", index: str | None = None, component: str = "") -> str:
    """Mathtext of an order parameter's name: ``Delta`` -> $\\Delta(t)$, ``Phi[1]`` -> $\\Phi^{1}(t)$ (``args``
    't,t' for a two-time kernel on its diagonal, None for none), ``h_star`` -> $h_{\\star}(t)$; ``index``
    replaces the layer superscript (e.g. r'\\ell' for a family), ``component`` is appended to the subscript (a
    point index).  A name it cannot read is set upright, $\\mathrm{name}$."""
    base, _, layer = str(name).partition("[")
    layer = layer.rstrip("]") if index is None else index
    head, *subs = base.split("_")
    if not head.isidentifier() or not all(s.isidentifier() for s in subs) or not (layer == "" or
                                                                                 layer.replace("\\", "").isalnum()):
        tex = r"\mathrm{" + "".join(c if c.isalnum() else " " for c in str(name)).strip().replace(" ", r"\_") + "}"
        return f"${tex}$"
    tex = _tex_word(head)
    sub = ",".join(_tex_word(s) for s in subs) + ("," if subs and component else "") + component
    if sub:
        tex += "_{" + sub + "}"
    if layer:
        tex += "^{" + layer + "}"
    return f"${tex}({args})$" if args else f"${tex}$"


def _equal_time(sol, m, name):
    """A deep two-time kernel on its time diagonal ((T, T), or (P, P, T, T) on several points -> (P, P, T))."""
    m = np.asarray(m)
    return np.diagonal(m, axis1=-2, axis2=-1) if sol.time_axes(name) == 2 else m


def _title(sol, width) -> str:
    """The model and the parameters of the solve, compact: gamma, the other scalar parameters, eta, T, samples
    (and L for deep specs)."""
    params = dict(sol.params)
    parts = [f"L = {sol.depth}"] if sol.depth is not None else []
    skip = {"T", "L", "eta", "dirac width"}
    scalar = [k for k, v in params.items() if k not in skip and not isinstance(v, str) and np.ndim(v) == 0]
    for k in sorted(scalar, key=lambda k: (k != "gamma", list(params).index(k))):     # gamma first
        parts.append(f"{symbol(k, args=None) if k in _GREEK else k} = {float(params[k]):.4g}")
    if len(sol.times) > 1:
        parts.append(rf"$\eta$ = {float(sol.times[1] - sol.times[0]):.4g}")
    parts.append(f"T = {sol.T}")
    samples = sol.info.get("samples")
    cub = sol.info.get("diagnostics", {}).get("cubature")
    how = ("exact" if samples is None else f"cubature, {samples} nodes" if cub else f"{samples} samples")
    if sol.info.get("propagator_samples"):
        how += f" (propagator {sol.info['propagator_samples']})"
    if sol.info.get("singular") and sol.info.get("dirac_width"):
        how += f", dirac width {sol.info['dirac_width']:g}"
    return f"{sol.model}: " + ", ".join(parts) + f"; {how}" + (f"; width N = {width:g}" if width else "")


def _ensemble_array(ensemble, key: str, name: str):
    """``ensemble[key_name]`` as a numpy array, for ``name`` 'X' or a layer's 'X[l]' (a variable 'key_X[l]', or
    'key_X' with a 'layer' dimension); None when the ensemble does not have it."""
    fam, _, layer = name.partition("[")
    for var in (f"{key}_{name}", f"{key}_{fam}"):
        try:
            da = ensemble[var]
        except (KeyError, IndexError, TypeError):
            continue
        if var.endswith(name) or not layer:
            return np.asarray(da.values, dtype=float)
        l = int(layer.rstrip("]"))
        dims = tuple(getattr(da, "dims", ()))
        if "layer" not in dims:
            return None
        if hasattr(da, "sel"):
            try:
                return np.asarray(da.sel(layer=l).values, dtype=float)
            except (KeyError, ValueError, IndexError):
                pass
        return np.take(np.asarray(da.values, dtype=float), l - 1, axis=dims.index("layer"))
    return None


def ensemble_label(ensemble) -> str:
    """The overlay's legend entry, with the networks' width when the ensemble's ``attrs`` give it ('width' or
    'N')."""
    attrs = getattr(ensemble, "attrs", None) or {}
    w = attrs.get("width", attrs.get("N"))
    try:
        return f"networks, N = {float(w):g}: ±2 s.e." if w is not None else "networks ±2 s.e."
    except (TypeError, ValueError):
        return "networks ±2 s.e."


def _ensemble_times(sol, ensemble, n: int) -> np.ndarray:
    """The ensemble's times: its 't' coordinate (integers: steps, mapped to eta * step), else the solution's."""
    try:
        t = np.asarray(ensemble["t"].values)
    except (KeyError, IndexError, TypeError, AttributeError):
        return sol.times[:n]
    if np.issubdtype(t.dtype, np.integer) and len(sol.times) > 1:
        return t * float(sol.times[1] - sol.times[0])
    return t.astype(float)


class _Panel:
    """One family's two axes (mean above, N Var below) and the curves drawn into them."""

    def __init__(self, sol, ax_m, ax_v, width, ensemble):
        self.sol, self.ax_m, self.ax_v, self.width, self.ensemble = sol, ax_m, ax_v, width, ensemble
        self.t = sol.times
        self.missing = self.missing_width = None
        self.members = []            # (label, colour) of the curves, for a legend when there are several
        # the exact backend has no Monte Carlo error: its (zero-width) bands stay out of the legend
        cubature = sol.info.get("diagnostics", {}).get("cubature")
        self.band_label = ("_exact: no Monte Carlo error" if sol.info.get("samples") is None
                           else CUBATURE_BAND if cubature else MC_BAND)

    def draw(self, name, colour_of):
        sol, t = self.sol, self.t
        m = _equal_time(sol, sol.mean(name), name)
        try:
            se = _equal_time(sol, sol.mean_stderr(name), name)
        except DmftcError:                 # a two-layer mean's error comes from N Var: none without a propagator
            se = None
        T = m.shape[-1]
        try:
            v, vse = np.asarray(sol.var(name)), np.asarray(sol.var_stderr(name))
        except DmftcError as err:
            v = vse = None
            self.missing = err
        mw = None
        if self.width and v is not None:
            try:
                mw = _equal_time(sol, sol.mean_at_width(name, self.width), name).reshape(-1, T)
            except DmftcError as err:          # no mean correction in this solution: the width is not drawn
                self.missing_width = err
        ens = None
        if self.ensemble is not None:
            ens = {k: _ensemble_array(self.ensemble, k, name) for k in ("mean", "mean_se", "var", "var_se")}
        curves_m = m.reshape(-1, T)
        curves_se = None if se is None else np.broadcast_to(se, m.shape).reshape(-1, T)
        n = len(curves_m)
        for k in range(n):
            c = colour_of()
            comp = "".join(str(i) for i in np.unravel_index(k, m.shape[:-1])) if n > 1 else ""
            self.members.append((symbol(name, args=None, component=comp), c))
            cm = curves_m[k]
            if mw is not None:
                spread = 2 * np.sqrt(np.clip(v.reshape(-1, T)[k], 0, None) / self.width)
                # beneath, in grey: the spread (light, edged in the curve's colour) and the width-N mean (thick,
                # dashed: where it meets the N = inf curve, drawn thin in colour on top, it shows as a dark edge)
                self.ax_m.fill_between(t, mw[k] - spread, mw[k] + spread, facecolor=_WIDTH_GREY, alpha=0.16,
                                       zorder=1, label=width_band_label(self.width))
                for edge in (mw[k] - spread, mw[k] + spread):
                    self.ax_m.plot(t, edge, color=c, lw=0.7, alpha=0.7, zorder=1)
                self.ax_m.plot(t, mw[k], color=_WIDTH_DARK, ls=(0, (3, 1.5)), lw=2.4, zorder=2,
                               label=f"mean at N = {self.width:g} (to O(1/N))")
            if curves_se is not None:
                cs = curves_se[k]
                self.ax_m.fill_between(t, cm - 2 * cs, cm + 2 * cs, color=c, alpha=0.35, lw=0, zorder=3,
                                       label=self.band_label)
            self.ax_m.plot(t, cm, color=c, lw=1.2 if mw is not None else 1.6, zorder=4, label="N = ∞")
            if v is not None:
                cv, cvs = v.reshape(-1, T)[k], np.broadcast_to(vse, v.shape).reshape(-1, T)[k]
                self.ax_v.fill_between(t, cv - 2 * cvs, cv + 2 * cvs, color=c, alpha=0.35, lw=0, zorder=3,
                                       label=self.band_label)
                self.ax_v.plot(t, cv, color=c, lw=1.6, zorder=4, label="N = ∞")
            if ens is not None:
                self._overlay(self.ax_m, ens["mean"], ens["mean_se"], k, n, c)
                self._overlay(self.ax_v, ens["var"], ens["var_se"], k, n, c)

    def _overlay(self, ax, val, se, k, n, c):
        if val is None:
            return
        val = val.reshape(-1, val.shape[-1])
        if len(val) != n:
            return
        se = np.zeros_like(val) if se is None else np.broadcast_to(se.reshape(-1, se.shape[-1]), val.shape)
        te = _ensemble_times(self.sol, self.ensemble, val.shape[-1])
        every = max(1, len(te) // 25)
        ax.errorbar(te[::every], val[k][::every], yerr=2 * se[k][::every], fmt="o", ms=3.5, mfc="white", mec=c,
                    ecolor=c, elinewidth=0.9, capsize=1.5, zorder=5, label=ensemble_label(self.ensemble))

    def finish(self, fam_symbol):
        self.ax_m.set_ylabel(f"mean {fam_symbol}")
        self.ax_v.set_ylabel(f"N Var {fam_symbol}")
        self.ax_v.set_xlabel("t")
        if self.missing is not None:
            self.ax_v.text(0.5, 0.5, "N Var not available", ha="center", va="center", transform=self.ax_v.transAxes,
                           fontsize=8, color="0.4")
        if 1 < len(self.members) <= 8:
            from matplotlib.lines import Line2D

            handles = [Line2D([], [], color=c, lw=1.6) for _, c in self.members]
            leg = self.ax_m.legend(handles, [s for s, _ in self.members], fontsize=7, loc="best", framealpha=0.7)
            leg.set_zorder(10)
        for ax in (self.ax_m, self.ax_v):
            ax.grid(alpha=0.25, lw=0.5)
            ax.tick_params(labelsize=8)


def plot_solution(sol, path, width=None, ensemble=None, return_fig: bool = False):
    """Means (top) and N Var (bottom) per family of observables, with +-2 Monte Carlo standard errors as bands;
    with ``width`` N also the mean at width N and its spread over initialisations, mean +- 2 sqrt(Sigma / N)
    (needs a solution with the mean correction).  ``ensemble``: measured networks to overlay, duck-typed like an
    xarray.Dataset (``ensemble[var].values``) with variables ``mean_X``, ``mean_se_X``, ``var_X`` (N Var),
    ``var_se_X`` for an order parameter X (dims (..., t); a layer X[l] as ``mean_X[l]`` or ``mean_X`` with a
    ``layer`` dimension), optionally a ``t`` coordinate (integers: steps); names it lacks are skipped.  A solution
    without a propagator shows its means and says so in the bottom row.  Saves the figure to ``path`` (returned),
    or with ``return_fig`` returns the matplotlib Figure (saved too when ``path`` is not None)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ParameterError('--plot needs matplotlib: pip install "dmftc[plot]"') from None
    if width is not None and not width > 0:
        raise ParameterError(f"width N must be positive, got {width!r}")
    from matplotlib.figure import Figure         # no pyplot: no GUI backend, no global figure registry

    families = {}
    for n in sol.observables or sol.names:
        families.setdefault(n.split("[")[0], []).append(n)
    ncol = len(families)
    fig = Figure(figsize=(3.4 * ncol, 6.0), layout="constrained")
    axes = fig.subplots(2, ncol, squeeze=False, sharex=True)
    palette = [f"C{i}" for i in range(10)]
    for j, (fam, members) in enumerate(families.items()):
        panel = _Panel(sol, axes[0, j], axes[1, j], width, ensemble)
        counter = iter(range(10 ** 6))
        for n in members:
            panel.draw(n, lambda: palette[next(counter) % len(palette)])
        first = members[0]
        args = "t,t" if sol.time_axes(first) == 2 else "t"
        layered = len(members) > 1 and all("[" in n for n in members)
        panel.finish(symbol(first, args=args, index=r"\ell" if layered else None))
    handles = {}
    for ax in axes.ravel():
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    order = ["N = ∞", MC_BAND, CUBATURE_BAND] + ([f"mean at N = {width:g} (to O(1/N))", width_band_label(width)] if width else []) \
        + ([ensemble_label(ensemble)] if ensemble is not None else [])
    labels = [lab for lab in order if lab in handles]
    fig.legend([handles[lab] for lab in labels], labels, loc="outside lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle(_title(sol, width), fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig if return_fig else path
