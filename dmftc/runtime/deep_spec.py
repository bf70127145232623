"""Runtime of compiled deep specs: solve a generated deep module (``KIND = 'deep'``).

The generated module supplies the numerics the spec determines (activation and derivatives, coupling
kernels, boundaries, readout, scalar order parameters); :func:`dmftc.runtime.deep_dmft.solve_deep` marches them
(``spec=SpecKernels(module)``).  The propagator differentiates the spec's own action: its couplings, readout,
boundary kernels and K read by :func:`dmftc.runtime.deep_model.from_spec` (coupling derivatives by JAX from the
generated functions; no comparison with a built-in network).  For a linear activation every single-site
integral is Gaussian: the propagator (and the O(1/N) mean correction) is the autodiff Hessian of the exact
log-det action (:mod:`dmftc.runtime.deep_linear`), after checking that the action so read reproduces the
spec's own march (so the two readings of the spec cannot drift apart).  For any other activation the means
come from the spec-driven march and the propagator from :mod:`dmftc.runtime.deep_propagator` (computed on first
use of ``var``/``sigma``), with the generated activation and its four derivatives.

    m = dmftc.load("specs/deep_tanh.dmft")
    sol = m.solve(L=3, T=20, samples=20000)
    sol.mean("Phi[2]"), sol.mean_stderr("Delta"), sol.var("K"), sol.var_stderr("K"), sol.names
"""
from __future__ import annotations

import difflib
import json
import math
import numbers
from pathlib import Path

import numpy as np

from dmftc.errors import ParameterError, PropagatorTooLarge, StructureSpecError
from dmftc.runtime.solution import SolutionAPI, atomic_savez

# Agreement required between the spec's exact march and the exact-Gaussian march of the action read from the
# spec before the latter's propagator is attached (both are exact; they differ by round-off, ~1e-12 at T = 20).
_LINEAR_MATCH = 1e-8


class DeepSpecSolution(SolutionAPI):
    """Solution of a deep spec in the spec's names: ``Delta``, ``K``, ``Phi[l]``, ``G[l]``, ``A[l]``, ``B[l]``.

    ``mean(name)``: (T,) for scalars, (T, T) for kernels and responses; ``mean_stderr(name)``: its Monte Carlo
    standard error (zeros when exact); ``var(name)``: lim N Var(name(t)) (kernels on the time diagonal),
    ``var_stderr(name)`` its error; ``sigma(a, b)``: the (T, T) block lim N Cov(a(t), b(s));
    ``two_time(a, b)``: (T, T, T, T).  The rest of the contract (``stderr(name, what)``, ``mean_at_width``,
    ``expected_loss``) is :class:`dmftc.runtime.solution.SolutionAPI`'s.
    """

    kind = "deep"
    _stderr_default = None          # stderr(name) without 'what': the mean's error, with a FutureWarning

    def __init__(self, module, inner, params: dict, names: dict, sigma_error: Exception | None = None):
        self.module = module
        self.inner = inner                    # dmftc.deep.DeepSolution (internal names)
        self.params = dict(params)
        self._map = dict(names)               # spec name -> internal name
        self._sigma_error = sigma_error
        self.L = inner.L
        self.T = inner.T

    @property
    def model(self) -> str:
        return self.module.MODEL

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._map)

    @property
    def times(self) -> np.ndarray:
        return float(self.params[self.module.TIME["step"]]) * np.arange(self.T)

    @property
    def info(self) -> dict:
        return dict(self.inner.diagnostics)

    @property
    def error_signal(self) -> str:
        return self.module.ERROR_SIGNAL

    def _name(self, name: str) -> str:
        if name not in self._map:
            raise self._unknown(name, self._map)
        return self._map[name]

    def mean(self, name: str) -> np.ndarray:
        return self.inner.mean(self._name(name))

    def mean_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``mean(name)`` (zeros when exact)."""
        return self.inner.mean_stderr(self._name(name))

    def sigma(self, a: str, b: str | None = None) -> np.ndarray:
        ia, ib = self._name(a), self._name(a if b is None else b)
        if self._sigma_error is not None:
            raise self._sigma_error
        for n, i in ((a, ia), (b or a, ib)):
            if i.startswith(("Rphi[", "Rg[")):
                raise ParameterError(f"no propagator block for the response function {n!r}; blocks exist for "
                                     "the order parameters")
        return self.inner.sigma(ia, ib)

    def var(self, name: str) -> np.ndarray:
        return np.diag(self.sigma(name, name)).copy()

    def var_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``var(name)`` (zeros when exact)."""
        if self._sigma_error is not None:
            raise self._sigma_error
        return self.inner.var_stderr(self._name(name))

    @property
    def observables(self) -> tuple[str, ...]:
        """The names with a propagator block (the order parameters; not the response functions)."""
        return tuple(n for n in self.names if not self._map[n].startswith(("Rphi[", "Rg[")))

    def mean_correction(self, name: str, stderr: bool = False) -> np.ndarray:
        """m1 with E[q]_N = q_inf + m1 / N + O(N^-2), shape of ``mean(name)`` (deep linear specs, exact: its
        standard error is zero)."""
        i = self._name(name)
        if self._sigma_error is not None:
            raise self._sigma_error
        if i.startswith(("Rphi[", "Rg[")):
            raise ParameterError(f"no mean correction for the response function {name!r}; it exists for the "
                                 "order parameters")
        return self.inner.mean_correction(i, stderr=stderr)

    def two_time(self, a: str, b: str | None = None) -> np.ndarray:
        ia, ib = self._name(a), self._name(a if b is None else b)
        if self._sigma_error is not None:
            raise self._sigma_error
        return self.inner.two_time(ia, ib)

    def summary(self) -> str:
        d = self.inner.diagnostics
        how = "exact" if d.get("backend") == "exact" or self.inner.activation == "linear" else \
            f"samples = {d.get('samples')}"
        order = [n for n, _, _ in self.module.PARAMS] + [self.module.TIME["steps"], self.module.TIME["step"]]
        shown = {k: self.params[k] for k in order if k in self.params}
        rows = [f"model {self.model} (deep, {self.module.DEPTH} = {self.L} hidden layers, T = {self.T}; {how}): "
                + ", ".join(f"{k} = {float(v):g}" for k, v in shown.items())]
        rows.append(f"  {'name':<10}{'final mean':>12}{'mean se':>12}{'peak N Var':>12}")
        missing = None
        for n in self.names:
            if self._map[n].startswith(("Rphi[", "Rg[")):
                continue
            m, se = self.mean(n), self.mean_stderr(n)
            final, fse = (m[-1], se[-1]) if m.ndim == 1 else (m[-1, -1], se[-1, -1])
            try:
                peak = f"{self.var(n).max():12.4g}"
            except (ParameterError, PropagatorTooLarge, StructureSpecError) as err:
                peak, missing = f"{'-':>12}", err
            rows.append(f"  {n:<10}{final:12.4g}{fse:12.2g}{peak}")
        if missing is not None:
            rows.append(f"  N Var: {missing}")
        return "\n".join(rows)

    def save(self, path) -> Path:
        """Write means, standard errors, equal-time variances (when available) and metadata to an .npz."""
        from dmftc import __version__

        path = Path(path)
        arrays = {"times": self.times}
        for n in self.names:
            arrays[f"mean:{n}"] = self.mean(n)
            arrays[f"stderr:{n}"] = self.mean_stderr(n)
            try:
                arrays[f"var:{n}"] = self.var(n)
            except (ParameterError, PropagatorTooLarge, StructureSpecError):
                pass
        meta = {"model": self.model, "kind": "deep", "params": {k: float(v) for k, v in self.params.items()},
                "spec": self.module.SPEC_PATH, "spec_sha256": self.module.SPEC_SHA256, "dmftc": __version__,
                "names": list(self.names)}
        arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
        return atomic_savez(path, arrays)

    def plot(self, path, width=None):
        """Equal-time means (kernels on the diagonal) and, when available, N Var, one column per quantity; with
        ``width`` N also the mean at width N and its spread mean +- 2 sqrt(Sigma / N) (needs correction=True)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups = {}
        for n in self.names:
            if not self._map[n].startswith(("Rphi[", "Rg[")):
                groups.setdefault(n.split("[")[0], []).append(n)
        fig, axes = plt.subplots(2, len(groups), figsize=(3.2 * len(groups), 5.5), squeeze=False)
        for j, (g, members) in enumerate(groups.items()):
            missing = False
            for n in members:
                m = self.mean(n)
                line = axes[0, j].plot(self.times, m if m.ndim == 1 else np.diagonal(m), "--" if width else "-",
                                       lw=1, label=n)[0]
                if width:
                    mw = self.mean_at_width(n, width)
                    mw = mw if mw.ndim == 1 else np.diagonal(mw)
                    spread = 2 * np.sqrt(np.clip(self.var(n), 0, None) / width)
                    axes[0, j].plot(self.times, mw, color=line.get_color(), lw=1.5)
                    axes[0, j].fill_between(self.times, mw - spread, mw + spread, color=line.get_color(), alpha=0.2)
                try:
                    axes[1, j].plot(self.times, self.var(n), label=n)
                except (ParameterError, PropagatorTooLarge, StructureSpecError):
                    missing = True
            if missing:
                axes[1, j].text(0.5, 0.5, "not available", ha="center", transform=axes[1, j].transAxes)
            axes[0, j].set_title(f"{g}: mean (N = inf)" if not width else f"{g}: N = {width:g} (dashed: inf)")
            axes[1, j].set_title(f"N Var({g})")
            axes[1, j].set_xlabel("t")
            if len(members) > 1:
                axes[0, j].legend(fontsize=7)
        fig.suptitle(f"{self.model}, {self.module.DEPTH} = {self.L}")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def __repr__(self) -> str:
        return f"DeepSpecSolution({self.model!r}, L={self.L}, T={self.T})"


def _suggest(name, known):
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def resolve_deep_params(mod, given: dict) -> tuple[dict, int, int]:
    """The spec's defaults overridden by ``given``, validated: (params, L, T)."""
    steps, step, depth = mod.TIME["steps"], mod.TIME["step"], mod.DEPTH
    declared = [n for n, _, _ in mod.PARAMS] + [steps, step]
    for name in given:
        if name not in declared:
            raise ParameterError(f"unknown parameter '{name}' for model {mod.MODEL}{_suggest(name, declared)}"
                                 f" (parameters: {', '.join(declared)})")
    p = {}
    for k, v in given.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise ParameterError(f"parameter '{k}' must be a finite real number, got {v!r}")
        p[k] = float(v)
    for name, what in ((depth, "the number of hidden layers"), (steps, "the number of steps")):
        if name in p and (p[name] != int(p[name]) or p[name] < 1):
            raise ParameterError(f"parameter '{name}' ({what}) must be an integer >= 1, got {given[name]!r}")
    p = mod.defaults(p)
    p = {k: float(v) for k, v in p.items()}
    if p[step] <= 0:
        raise ParameterError(f"parameter '{step}' (time step) must be positive, got {p[step]!r}")
    return p, int(p[depth]), int(p[steps])


def solve_deep_module(mod, *, samples: int = 20000, seed: int = 0, groups: int = 8, dirac_width: float = 0.1,
                      backend: str = "auto", memory_limit: float = 8e9, propagator_samples: int = 4000,
                      propagator_groups: int = 8, progress: bool = False, correction: bool = False,
                      sampler: str = "sobol", **given) -> DeepSpecSolution:
    """Solve a compiled deep spec (see the module doc); parameters not given take the spec's defaults.
    ``correction``: also the exact O(1/N) mean correction (linear specs only)."""
    from dmftc import deep
    from dmftc.runtime.deep_dmft import SpecKernels
    from dmftc.runtime.deep_dmft import solve_deep as march

    p, L, T = resolve_deep_params(mod, given)
    spec = SpecKernels(mod)
    steps, step = mod.TIME["steps"], mod.TIME["step"]
    r = mod.ROLES
    names = {n: n for n, k in mod.ORDERS if k == 1}
    for l in range(1, L + 1):
        names[f"{r['Phi']}[{l}]"] = f"Phi[{l}]"
        names[f"{r['G']}[{l}]"] = f"G[{l}]"
    for l in range(1, L + 1):
        names[f"{r['A']}[{l}]"] = f"Rphi[{l}]"
        names[f"{r['B']}[{l}]"] = f"Rg[{l}]"
    std = dict(gamma=p.get("gamma", 1.0), y=p.get("y", 0.0), eta=p[step])      # recorded only (the spec's own
    # parameters drive the march and, through deep_model.from_spec, the propagator)
    from dmftc.runtime.deep_model import from_spec

    try:                              # the propagator differentiates the spec's own action (module deep_model)
        model, err = from_spec(mod, p), None
    except StructureSpecError as exc:
        model, err = None, exc
    if mod.LINEAR:
        if backend == "mc":
            raise ParameterError("deep linear specs are solved exactly (backend 'auto' or 'exact')")
        own = march(activation="linear", L=L, T=T, backend="exact", spec=spec, spec_params=p,
                    dirac_width=dirac_width, **std)
        need = deep.propagator_bytes(L, T, correction)
        if need > memory_limit:
            if correction:
                raise ParameterError(
                    f"the deep-linear propagator with the mean correction at {mod.DEPTH} = {L}, {steps} = {T} needs "
                    f"about {need / 1e9:.1f} GB (memory_limit = {memory_limit / 1e9:.1f} GB); lower {steps} or "
                    f"{mod.DEPTH}, or raise memory_limit")
            err = PropagatorTooLarge(
                f"the dense deep-linear propagator at {mod.DEPTH} = {L}, {steps} = {T} needs about {need / 1e9:.1f} GB "
                f"(memory_limit = {memory_limit / 1e9:.1f} GB); means are available, for variances lower {steps} "
                f"or {mod.DEPTH}, or raise memory_limit")
        if err is None:
            inner = deep.solve_deep(activation="linear", L=L, T=T, memory_limit=memory_limit,
                                    correction=correction, model=model, **std)
            err = _saddle_mismatch(mod, own, inner, L)
            if err is None:
                return DeepSpecSolution(mod, inner, p, names)
        inner = _from_saddle(deep, own, "linear", L, T, std, {"backend": "exact"})
        return DeepSpecSolution(mod, inner, p, names, err)
    if correction:
        raise ParameterError(deep._NO_NONLINEAR_CORRECTION)
    inner = deep.solve_deep(activation=spec.site_activation(p, dirac_width), L=L, T=T, samples=samples, seed=seed,
                            spec=spec, spec_params=p, groups=groups, dirac_width=dirac_width, backend=backend,
                            memory_limit=memory_limit, propagator_samples=propagator_samples,
                            propagator_groups=propagator_groups, progress=progress, model=model,
                            propagator_sampler=sampler, **std)
    return DeepSpecSolution(mod, inner, p, names, err)


def _from_saddle(deep, sad, activation, L, T, params, diag):
    means = {k: np.asarray(sad[k]) for k in sad.keys()}
    se = {k: np.asarray(sad.stderr.get(k, np.zeros_like(v))) for k, v in means.items()}
    return deep.DeepSolution(activation, L, T, dict(params), means, se, None, dict(diag))


def _saddle_mismatch(mod, own, inner, L) -> StructureSpecError | None:
    """The spec's exact march (its generated equations) must reproduce the saddle point of the action read from
    the spec (module deep_model) before that action's propagator is used: None, or the error to attach."""
    worst, where = 0.0, None
    keys = [(mod.ERROR_SIGNAL, "Delta")] + [(f"{k}[{l}]",) * 2 for k in ("Phi", "G", "Rphi", "Rg")
                                             for l in range(1, L + 1)]
    keys += [(n, n) for n in mod.SCALARS if n in inner.means]
    for k, ref in keys:
        a, b = np.asarray(own[k]), np.asarray(inner.mean(ref))
        diff = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
        if diff > worst:
            worst, where = diff, k
    if worst <= _LINEAR_MATCH:
        return None
    return StructureSpecError(
        f"the spec's equations and its action as the propagator reads it (couplings, readout, boundaries, K) give "
        f"different saddle points: they differ in {where} by {worst:.3g} (relative); the means are the spec's, but "
        "no propagator is attached (please report this spec)", None, filename=mod.SPEC_PATH)
