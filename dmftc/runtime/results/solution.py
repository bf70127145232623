"""Results of a solve: one :class:`Solution` class for every spec, two-layer or deep.

A solution holds the saddle point (``mean``, its Monte Carlo error ``mean_stderr``), the propagator
(``sigma``, ``var``, ``var_stderr``; blocks from :mod:`dmftc.runtime.results.blocks`: dense for two-layer solves and
results files, computed on first use for deep solves), the O(1/N) mean correction when it was asked for
(``mean_correction``, and from it ``mean_at_width`` and ``expected_loss``), and ``info`` (backend, seeds,
timings, diagnostics, approximations).  ``save`` writes one results-file format for both kinds and
``Solution.load`` reads it back.

Shapes: ``mean(name)`` is ``(*index dims, T)`` for one-time order parameters and ``(T, T)`` for the two-time
kernels and responses of deep specs; ``sigma(a, b)`` is ``(*dims_a, T, *dims_b, T)`` (deep kernels on their
time diagonal, dims ``()``), ``var(name)`` its equal-time diagonal ``(*dims, T)``.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dmftc.errors import DmftcError, ParameterError
from dmftc.runtime.results.atomic import atomic_output
from dmftc.runtime.results.blocks import DenseBlocks
from dmftc.runtime.results.jsonable import jsonable

_FORMAT = 2                  # results-file format (1: two-layer only, before deep solutions shared the class)



def two_time_names(means: dict) -> tuple[str, ...]:
    """The two-time quantities of a deep solution on one point: the names whose means are (T, T) (its kernels and
    responses; Delta, K and the other scalars are (T,)).  On several points the engine records its own."""
    return tuple(k for k, v in means.items() if np.ndim(v) == 2)

@dataclass(frozen=True)
class Solution:
    """Infinite-width saddle point and leading finite-width propagator of a spec (see the module doc).

    ``model``: the spec's model name; ``kind``: 'two_layer' or 'deep'; ``params``: every parameter value used;
    ``times``: eta * arange(T); ``means``: name -> array; ``blocks``: the propagator's blocks (None when the
    solve has none, ``blocks_error`` then says why); ``mean_se``: name -> standard error of the mean (None: the
    two-layer rule sqrt(var / samples), zero on the exact backend); ``m1`` / ``m1_se``: name -> O(1/N) mean
    correction and its error (None without ``correction=True``); ``depth``: L of a deep solution.
    """

    model: str
    params: dict
    times: np.ndarray
    means: dict
    blocks: object = None
    info: dict = field(default_factory=dict)
    kind: str = "two_layer"
    mean_se: dict | None = None
    m1: dict | None = None
    m1_se: dict | None = None
    error_signal: str = "Delta"
    blocks_error: Exception | None = None
    depth: int | None = None

    # ------------------------------------------------------------ names
    @property
    def names(self) -> tuple[str, ...]:
        """Every name with a mean (order parameters; deep specs also their responses)."""
        return tuple(self.means)

    @property
    def observables(self) -> tuple[str, ...]:
        """The names with propagator blocks (the order parameters; not the response functions)."""
        return tuple(self.blocks.names) if self.blocks is not None else ()

    @property
    def T(self) -> int:
        return len(self.times)

    @property
    def L(self) -> int | None:
        return self.depth

    def time_axes(self, name: str) -> int:
        """2 for a two-time quantity (a deep kernel or response, q(t, s): its means carry two trailing time axes),
        else 1 (``info['two_time']``, which every solve with two-time quantities records)."""
        self._check(name)
        return 2 if name in self.info.get("two_time", ()) else 1

    def _check(self, name):
        if name not in self.means:
            close = difflib.get_close_matches(str(name), list(self.names), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ParameterError(f"unknown name {name!r} for model {self.model}{hint} "
                                 f"(known: {', '.join(self.names)})")

    def _blocks(self, *names):
        for n in names:
            self._check(n)
        if self.blocks_error is not None:
            raise self.blocks_error
        if self.blocks is None:
            raise ParameterError(f"no finite-width propagator in this solution of {self.model}; only means")
        for n in names:
            if n not in self.blocks.names:
                raise ParameterError(f"no propagator block for the response function {n!r}; blocks exist for "
                                     f"the order parameters ({', '.join(self.blocks.names)})")
        return self.blocks

    # ------------------------------------------------------------ saddle point
    def mean(self, name: str) -> np.ndarray:
        self._check(name)
        return self.means[name]

    def mean_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``mean(name)``.  Given by the solver where it measured it (deep solves,
        randomised QMC: the spread of independent groups); otherwise a two-layer saddle point averages
        ``samples`` single-site draws, so its own Monte Carlo covariance is Sigma / samples (the solver is a
        width-``samples`` network in disguise): sqrt(var(name) / samples); zero on the exact backend."""
        self._check(name)
        if self.mean_se is not None and name in self.mean_se:
            return self.mean_se[name]
        if self.info.get("samples") is None:       # exact backend: no sampling error
            return np.zeros_like(self.means[name])
        return np.sqrt(np.clip(self.var(name), 0, None) / self.info["samples"])

    # ------------------------------------------------------------ propagator
    def sigma(self, a: str, b: str | None = None) -> np.ndarray:
        """Propagator block: N Cov(q_a(t), q_b(s)) -> sigma, shape (*dims_a, T, *dims_b, T)."""
        b = a if b is None else b
        return self._blocks(a, b).sigma(a, b)

    def var(self, name: str) -> np.ndarray:
        """Equal-time variance N Var(q(t)), shape (*dims, T)."""
        return self._blocks(name).var(name)

    def var_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``var(name)`` (the spread of independent sample groups; zeros when
        exact)."""
        return self._blocks(name).var_se(name)

    def stderr(self, name: str, what: str = "var") -> np.ndarray:
        """The Monte Carlo standard error of ``var(name)`` (``what='var'``, the default, for every solution) or of
        ``mean(name)`` (``'mean'``)."""
        if what == "mean":
            return self.mean_stderr(name)
        if what == "var":
            return self.var_stderr(name)
        raise ParameterError(f"stderr(name, what): what is 'mean' or 'var', got {what!r}")

    def kappa(self, a: str, b: str | None = None) -> np.ndarray:
        """Uncoupled covariance of the single-site observables (zero for constraint-only variables)."""
        b = a if b is None else b
        return self._blocks(a, b).kappa(a, b)

    def U(self, a: str, b: str | None = None) -> np.ndarray:
        """Block of U = dC/dq - D (the linear operator with Sigma = U^-1 kappa U^-T), (*dims_a, T, *dims_b, T)."""
        b = a if b is None else b
        return self._blocks(a, b).U(a, b)

    def two_time(self, a: str, b: str | None = None) -> np.ndarray:
        """(T, T, T, T) block lim N Cov(a(t, s), b(t', s')) of two-time kernels (deep linear specs)."""
        b = a if b is None else b
        return self._blocks(a, b).two_time(a, b)

    # ------------------------------------------------------------ finite width N
    def mean_correction(self, name: str, stderr: bool = False) -> np.ndarray:
        """m1 with E[q]_N = q_inf + m1 / N + O(N^-2), shape of ``mean(name)``; ``stderr=True``: its Monte Carlo
        standard error (spread of the independent sample groups; zero when exact)."""
        self._check(name)
        if self.blocks_error is not None:
            raise self.blocks_error
        if self.m1 is None:
            raise ParameterError("no mean correction in this solution: solve with correction=True "
                                 "(dmftc run SPEC --width N)")
        if name not in self.m1:
            raise ParameterError(f"no mean correction for the response function {name!r}; it exists for the "
                                 f"order parameters ({', '.join(self.m1)})")
        if not stderr:
            return self.m1[name]
        if self.m1_se is None:
            raise ParameterError("no standard errors: solve with groups >= 2")
        return self.m1_se[name]

    def mean_at_width(self, name: str, N: float, stderr: bool = False) -> np.ndarray:
        """The ensemble mean at width N to O(1/N): mean + m1 / N (``stderr=True``: its standard error,
        combining the saddle point's and m1's Monte Carlo errors; zero where both are exact)."""
        if not N > 0:
            raise ParameterError(f"width N must be positive, got {N!r}")
        if not stderr:
            return self.mean(name) + self.mean_correction(name) / N
        return np.sqrt(self.mean_stderr(name) ** 2 + (self.mean_correction(name, stderr=True) / N) ** 2)

    def expected_loss(self, N: float, name: str | None = None, stderr: bool = False) -> np.ndarray:
        """E[sum_mu Delta_mu(t)^2] at width N to O(1/N): |Delta_inf|^2 + (2 Delta_inf . m1 + tr Sigma(t, t)) / N,
        shape (T,).  ``name``: the error-signal order parameter (one training point or a P-vector; default the
        model's error signal)."""
        name = self.error_signal if name is None else name
        T = self.T
        d, m1, v = (self.mean(name).reshape(-1, T), self.mean_correction(name).reshape(-1, T),
                    self.var(name).reshape(-1, T))
        loss = (d ** 2).sum(axis=0) + (2 * d * m1 + v).sum(axis=0) / N
        if not stderr:
            return loss
        sd = self.mean_stderr(name).reshape(-1, T)
        sm = self.mean_correction(name, stderr=True).reshape(-1, T)
        try:
            sv = self.var_stderr(name).reshape(-1, T)
        except ParameterError:
            sv = np.zeros_like(v)
        terms = (2 * d * sd) ** 2 + ((2 * d * sm) ** 2 + (2 * m1 * sd) ** 2 + sv ** 2) / N ** 2
        return np.sqrt(terms.sum(axis=0))

    # ------------------------------------------------------------ persistence
    def save(self, path) -> Path:
        """Write the solution, atomically: a netCDF file (``.nc``: the labelled Dataset of :meth:`to_xarray` and
        every array the .npz keeps, :mod:`dmftc.runtime.results.labelled`) or a self-describing .npz (any other suffix):
        means and their errors, the propagator's blocks, kappa and U when kept, the mean correction, parameters,
        info, versions.  A deep solution's propagator is computed first if it has not been (its equal-time blocks
        are saved; two-time blocks are not)."""
        path = Path(path)
        if path.suffix.lower() == ".nc":
            from dmftc.runtime.results.labelled import write_netcdf

            return write_netcdf(self, path)
        arrays, meta, _ = self.record()
        arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
        return atomic_savez(path, arrays)

    def record(self) -> tuple[dict, dict, "Solution"]:
        """What a results file holds: (arrays by key 'times', 'mean:NAME', 'mean_se:NAME', 'm1:NAME',
        'm1_se:NAME', 'blocks:sigma' ...; the JSON-able meta; this solution with its blocks dense, as saved)."""
        import jax
        import lark
        import numba
        import scipy
        import sympy

        from dmftc.version import __version__

        blocks, error = self.blocks, self.blocks_error
        if error is None and blocks is not None and not isinstance(blocks, DenseBlocks):
            try:                           # first: computing the propagator adds its diagnostics to info
                blocks = blocks.dense()
            except DmftcError as err:      # e.g. a propagator too large for memory_limit: save the means
                error = err
        arrays = {"times": self.times}
        meta = {"format": _FORMAT, "model": self.model, "kind": self.kind, "depth": self.depth,
                "error_signal": self.error_signal, "order": list(self.means),
                "params": {k: jsonable(v) for k, v in self.params.items()}, "info": jsonable(self.info),
                "versions": {"dmftc": __version__, "numpy": np.__version__, "jax": jax.__version__,
                             "scipy": scipy.__version__, "sympy": sympy.__version__, "numba": numba.__version__,
                             "lark": lark.__version__}}
        for prefix, table in (("mean", self.means), ("mean_se", self.mean_se), ("m1", self.m1),
                              ("m1_se", self.m1_se)):
            for k, v in (table or {}).items():
                arrays[f"{prefix}:{k}"] = v
        if error is not None:
            meta["blocks_error"] = {"type": type(error).__name__, "message": str(error)}
            blocks = None
        elif blocks is not None:
            b_arrays, meta["blocks"] = blocks.arrays()
            arrays.update({f"blocks:{k}": v for k, v in b_arrays.items()})
        return arrays, meta, replace(self, blocks=blocks, blocks_error=error)

    @classmethod
    def load(cls, path) -> "Solution":
        """Read a file written by :meth:`save` (two-layer or deep; netCDF or .npz, told apart by content)."""
        try:
            with open(path, "rb") as f:
                netcdf = f.read(3) == b"CDF"
        except OSError as err:
            raise DmftcError(f"{path}: not a dmftc results file ({err})") from None
        if netcdf:
            from dmftc.runtime.results.labelled import read_netcdf

            arrays, meta = read_netcdf(path)
        else:
            try:
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(str(z["meta"]))
                    arrays = {k: z[k] for k in z.files if k != "meta"}
            except (OSError, KeyError, ValueError) as err:
                raise DmftcError(f"{path}: not a dmftc results file ({err})") from None
        return cls.from_record(arrays, meta, path)

    @classmethod
    def from_record(cls, arrays: dict, meta: dict, path="<record>") -> "Solution":
        """The solution of a results file's (arrays, meta) (see :meth:`record`)."""
        if meta.get("format") != _FORMAT:
            raise DmftcError(f"{path}: results file format {meta.get('format', 1)} is not {_FORMAT}; re-run the "
                             "solve with this dmftc to write it again")
        tables = {}
        for k, v in arrays.items():
            if ":" in k:
                prefix, name = k.split(":", 1)
                tables.setdefault(prefix, {})[name] = v
        times = arrays["times"]
        params = {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in meta["params"].items()}
        info = dict(meta["info"], versions=meta["versions"])
        blocks, error = None, None
        if "blocks" in meta:
            blocks = DenseBlocks.from_arrays(len(times), tables.get("blocks", {}), meta["blocks"])
        if "blocks_error" in meta:
            error = ParameterError(f"(saved) {meta['blocks_error']['type']}: {meta['blocks_error']['message']}")
        means = {k: tables["mean"][k] for k in meta["order"]}
        if meta["depth"] is not None and "two_time" not in info:      # written before solves recorded it
            info["two_time"] = two_time_names(means)
        return cls(meta["model"], params, times, means, blocks, info, meta["kind"], tables.get("mean_se"),
                   tables.get("m1"), tables.get("m1_se"), meta["error_signal"], error, meta["depth"])

    def to_xarray(self, sigma=None, var: bool = True):
        """The solution as a labelled ``xarray.Dataset`` (``mean_X``, ``mean_se_X``, ``var_X``, ``var_se_X``,
        ``m1_X``, ``sigma_A_B`` over dims t, s, mu, nu, layer; see :func:`dmftc.runtime.results.labelled.solution_dataset`
        and docs/results.md).  ``sigma``: the propagator blocks to include, pairs of names (default: every
        same-name block of a two-layer solution, none of a deep one); ``var``: include N Var (computes a deep
        solution's propagator)."""
        from dmftc.runtime.results.labelled import solution_dataset

        return solution_dataset(self, sigma=sigma, var=var)

    def renamed(self, names: dict, **changes) -> "Solution":
        """The same solution with ``names`` (new name -> current name) instead of the current names, in the
        order of ``names``; ``changes``: other fields to replace (e.g. model, params)."""
        from dmftc.runtime.results.blocks import LazyBlocks

        table = lambda t: None if t is None else {k: t[v] for k, v in names.items() if v in t}  # noqa: E731
        blocks = self.blocks
        if isinstance(blocks, LazyBlocks):
            blocks = LazyBlocks(blocks.T, blocks.get, {k: blocks._names[v] for k, v in names.items()
                                                       if v in blocks._names}, self.info)
        elif blocks is not None:
            raise ParameterError("renamed() is for deep solutions with lazily computed blocks")
        info = changes.pop("info", self.info)   # the same dict: the lazy blocks record their diagnostics in it
        if "two_time" in info:
            info["two_time"] = tuple(k for k, v in names.items() if v in info["two_time"])
        return replace(self, means=table(self.means), mean_se=table(self.mean_se), m1=table(self.m1),
                       m1_se=table(self.m1_se), blocks=blocks, info=info, **changes)

    # ------------------------------------------------------------ text and figures
    def summary(self) -> str:
        """Final means with their standard errors and the peak of N Var of every observable, then timings,
        the condition of U and every approximation the solve made."""
        d = self.info.get("diagnostics", self.info)
        backend = d.get("backend", "mc")
        if backend == "exact" or self.info.get("samples") is None:
            how = "exact"
        elif backend == "cubature":
            c = d.get("cubature", {})
            how = f"cubature: {c.get('rule', 'Gauss-Hermite')}; se = difference to the coarser rule"
            if d.get("auto"):
                how += ", chosen by backend 'auto'"
        else:
            how = f"samples = {self.info.get('samples')}"
            if d.get("sampler") == "sobol":
                how += " (randomised QMC)"
        shown = ", ".join(f"{k} = {float(v):g}" for k, v in self.params.items()
                          if np.ndim(v) == 0 and not isinstance(v, str) and k != "dirac width")
        head = f"model {self.model} (" + (f"deep, L = {self.depth} hidden layers" if self.depth is not None
                                          else "two-layer")
        lines = [f"{head}, T = {self.T}, t_max = {self.times[-1]:.3g}; {how}): {shown}"]
        if self.info.get("test_points"):
            lines.append(f"  test points (not trained on; 0-based along the point axes): "
                         f"{', '.join(map(str, self.info['test_points']))}")
        lines.append(f"  {'name':<14}{'shape':>8}{'final mean':>13}{'mean se':>11}{'peak N Var':>13}{'at t':>8}"
                     f"{'its se':>10}")
        missing = None
        for n in self.names:
            if self.blocks is not None and n not in self.blocks.names:
                continue                          # a response function: mean only
            m, se = self.mean(n), self.mean_stderr(n)
            two = self.time_axes(n) == 2
            final, fse = (m[..., -1, -1], se[..., -1, -1]) if two else (m[..., -1], se[..., -1])
            if np.ndim(final) == 0:
                fm, fs = f"{float(final):13.5g}", f"{float(fse):11.2g}"
            else:
                fm, fs = f"{'|.|=' + format(np.linalg.norm(final), '.4g'):>13}", f"{float(np.max(fse)):11.2g}"
            shape = "x".join(map(str, m.shape[:-2] if two else m.shape[:-1])) or "()"
            try:
                v = self.var(n)
                flat = v.reshape(-1, v.shape[-1])
                i, t = np.unravel_index(int(np.argmax(flat)), flat.shape)
                vse = np.asarray(self.var_stderr(n)).reshape(flat.shape)
                peak = f"{flat[i, t]:13.5g}{self.times[t]:8.3g}{vse[i, t]:10.2g}"
            except DmftcError as err:
                peak, missing = f"{'-':>13}{'':>8}", err
            lines.append(f"  {n:<14}{shape:>8}{fm}{fs}{peak}")
        if missing is not None:
            lines.append(f"  N Var: {missing}")
        tm = self.info.get("timings", {})
        if tm:
            lines.append("  time: " + ", ".join(f"{k} {v:.2f}s" for k, v in tm.items()))
        cond = d.get("u_condition")
        if cond is not None:
            lines.append(f"  U condition number (1-norm): {cond:.3g}")
        mc = self.info.get("mean_correction")
        if mc and mc.get("paths"):
            lines.append(f"  O(1/N) mean correction: Monte Carlo over {mc['paths']} sampled paths in {mc['groups']} "
                         "groups (its standard errors: mean_correction(name, stderr=True))"
                         + (", also on the exact backend" if backend == "exact" else ""))
        kink = d.get("kink")
        if kink and kink.get("exceeds_error_bar"):
            lines.append("  warning: " + kink["approximation"])
        elif self.info.get("singular"):
            w = self.info.get("dirac_width", 0.0)
            lines.append(f"  note: DiracDelta terms ({', '.join(self.info['singular'])}) of a non-smooth activation "
                         + (f"mollified with a Gaussian of width {w:g}" if w > 0 else "DROPPED (dirac_width=0)"))
        if self.info.get("approximation"):
            lines.append("  note: " + self.info["approximation"])
        warning = solve_bias_warning(self.info)
        if warning:
            lines.append("  warning: " + warning)
        return "\n".join(lines)

    def plot(self, path, width=None, ensemble=None, return_fig: bool = False):
        """Means (top) and N Var (bottom) with their Monte Carlo error bands; with ``width`` the predicted ensemble
        of width-N networks, with ``ensemble`` measured networks overlaid; see
        :func:`dmftc.runtime.results.plot.plot_solution`."""
        from dmftc.runtime.results.plot import plot_solution
        return plot_solution(self, path, width=width, ensemble=ensemble, return_fig=return_fig)

    def __repr__(self) -> str:
        deep = f", L={self.depth}" if self.depth is not None else ""
        return f"Solution({self.model!r}, kind={self.kind!r}{deep}, T={self.T})"


def solve_bias_warning(info: dict) -> str | None:
    """The deep propagator's warning when its estimated solve bias (:mod:`dmftc.runtime.solvers.solve_bias`) exceeds its
    standard error for some observable (``info['propagator_solve_bias_vs_se']``); None otherwise.  It names, among
    the observables whose bias exceeds its error bar, the one with the largest bias relative to its peak (the one
    most off), and lists the others."""
    vs, rel = info.get("propagator_solve_bias_vs_se"), info.get("propagator_solve_bias", {})
    if not vs or max(vs.values()) <= 1.0:
        return None
    over = [n for n in vs if vs[n] > 1.0]
    name = max(over, key=lambda n: (rel.get(n, 0.0), vs[n]))
    others = ", ".join(f"{n} {rel.get(n, float('nan')):.0%}" for n in sorted(over, key=lambda n: -rel.get(n, 0.0))
                       if n != name)
    return (f"the Monte Carlo propagator is not resolved: solving with the groups' noisy Hessians biases N Var "
            f"{name} by about {rel.get(name, float('nan')):.0%} of its peak, {vs[name]:.1f} times its standard error"
            + (f" (also beyond their error bars: {others})" if others else "")
            + " (info 'propagator_solve_bias'), so the error bars understate the error; increase the propagator's "
            "samples (the bias falls like 1 / samples per group)")


def atomic_savez(path: Path, arrays: dict) -> Path:
    """Write ``arrays`` to the .npz ``path`` atomically (temporary file in the same directory + rename)."""
    return atomic_output(path, ".npz", lambda tmp: np.savez_compressed(tmp, **arrays))
