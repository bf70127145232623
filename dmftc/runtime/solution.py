"""Results of a solve: saddle-point means and the propagator, with named accessors."""
from __future__ import annotations

import difflib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dmftc.errors import DmftcError, ParameterError

_DEEP_STDERR_DEPRECATED = (
    "sol.stderr({name!r}) of a deep solution returns the standard error of the MEAN; for every other solution "
    "stderr(name) is the standard error of var(name), and deep solutions will follow in a future release. "
    "Say which you mean: sol.mean_stderr(name) or sol.stderr(name, 'mean'); sol.var_stderr(name) or "
    "sol.stderr(name, 'var')")


class SolutionAPI:
    """The one contract of every solution, two-layer or deep (a mixin: subclasses hold the data).

    Subclasses provide ``model``, ``names``, ``times``, ``error_signal``, ``mean``, ``var``, ``sigma``,
    ``mean_stderr``, ``var_stderr`` and ``mean_correction(name, stderr=False)``; this class derives from them
    the width-N results (``mean_at_width``, ``expected_loss``) and ``stderr(name, what)``, and words unknown
    names one way.

    ``stderr(name, what)``: the Monte Carlo standard error of ``mean(name)`` (``what='mean'``) or of
    ``var(name)`` (``what='var'``, the default).  Deep solutions used to answer ``stderr(name)`` with the
    mean's error; called without ``what`` they still do, with a FutureWarning (``_stderr_default = None``).
    """

    _stderr_default: str | None = "var"
    kind = "two_layer"

    def stderr(self, name: str, what: str | None = None) -> np.ndarray:
        if what is None:
            what = self._stderr_default
            if what is None:
                warnings.warn(_DEEP_STDERR_DEPRECATED.format(name=name), FutureWarning, stacklevel=2)
                what = "mean"
        if what == "mean":
            return self.mean_stderr(name)
        if what == "var":
            return self.var_stderr(name)
        raise ParameterError(f"stderr(name, what): what is 'mean' or 'var', got {what!r}")

    def _unknown(self, name, known) -> ParameterError:
        close = difflib.get_close_matches(str(name), list(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return ParameterError(f"unknown name {name!r} for model {self.model}{hint} (known: {', '.join(known)})")

    # ------------------------------------------------------------ finite width N
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
        T = len(self.times)
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
        # first-order error propagation, the components' errors treated as independent
        return np.sqrt((((2 * d + 2 * m1 / N) * sd) ** 2).sum(axis=0) + ((2 * d * sm / N) ** 2).sum(axis=0)
                       + ((sv / N) ** 2).sum(axis=0))


@dataclass(frozen=True)
class Solution(SolutionAPI):
    """Infinite-width saddle point and leading finite-width propagator.

    ``mean(name)`` has shape ``(*index dims, T)``; ``sigma(a, b)`` has shape
    ``(*dims_a, T, *dims_b, T)`` and approximates ``N Cov(q_a, q_b)``;
    ``var(name)`` is its equal-time diagonal, ``N Var(q(t))``.
    """

    model: str
    params: dict
    times: np.ndarray
    means: dict
    shapes: dict                 # name -> index dims
    offsets: dict                # name -> offset in the per-time block
    block: int                   # components per time step
    sigma_full: np.ndarray       # (T*block, T*block), time-major
    info: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_arrays(cls, mod, geo, p, T, means, sigma, U, kappa, var_se, run):
        eta = float(p[mod.TIME["step"]])
        info = {"samples": run.samples, "seed": run.seed, "batch": run.batch, "timings": dict(run.timings),
                "diagnostics": dict(run.diagnostics),
                "spec_sha256": mod.SPEC_SHA256, "dmftc_version": mod.DMFTC_VERSION, "singular": mod.SINGULAR,
                "dirac_width": float(p.get("dirac width", 0.0))}
        return cls(mod.MODEL, dict(p), eta * np.arange(T), means, dict(geo.comp_shape), dict(geo.offset), geo.m,
                   sigma, info, {"U": U, "kappa": kappa, "var_se": var_se})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.means)

    error_signal = "Delta"

    def _check(self, name):
        if name not in self.means:
            raise self._unknown(name, self.names)

    def mean(self, name: str) -> np.ndarray:
        self._check(name)
        return self.means[name]

    def _block(self, full, a, b):
        self._check(a)
        self._check(b)
        T = len(self.times)
        M = full.reshape(T, self.block, T, self.block)
        oa, ob = self.offsets[a], self.offsets[b]
        na, nb = int(np.prod(self.shapes[a], dtype=int)), int(np.prod(self.shapes[b], dtype=int))
        blk = M[:, oa:oa + na, :, ob:ob + nb]                  # (T, na, T, nb)
        blk = np.transpose(blk, (1, 0, 3, 2))                  # (na, T, nb, T)
        return blk.reshape(self.shapes[a] + (T,) + self.shapes[b] + (T,))

    def sigma(self, a: str, b: str | None = None) -> np.ndarray:
        """Propagator block: N Cov(q_a(t), q_b(s)) -> sigma, shape (*dims_a, T, *dims_b, T)."""
        return self._block(self.sigma_full, a, a if b is None else b)

    def kappa(self, a: str, b: str | None = None) -> np.ndarray:
        """Uncoupled covariance of the single-site observables (zero for constraint-only variables)."""
        return self._block(self.extras["kappa"], a, a if b is None else b)

    def var(self, name: str) -> np.ndarray:
        """Equal-time variance N Var(q(t)), shape (*dims, T)."""
        self._check(name)
        T = len(self.times)
        o, n = self.offsets[name], int(np.prod(self.shapes[name], dtype=int))
        d = np.diag(self.sigma_full).reshape(T, self.block)[:, o:o + n]
        return d.T.reshape(self.shapes[name] + (T,))

    def mean_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``mean(name)``.  The saddle point is an average over ``samples``
        single-site draws, so its own Monte Carlo covariance is Sigma / samples (the solver is a
        width-``samples`` network in disguise): sqrt(var(name) / samples); zero on the exact backend.  With
        randomised QMC draws (sampler 'sobol') that formula does not hold: the spread of the sample groups'
        saddle points is used instead."""
        self._check(name)
        if self.info["samples"] is None:       # exact backend: no sampling error
            return np.zeros_like(self.var(name))
        if self.extras.get("mean_se") is not None:
            return self._flat_block(self.extras["mean_se"], name)
        return np.sqrt(np.clip(self.var(name), 0, None) / self.info["samples"])

    def var_stderr(self, name: str) -> np.ndarray:
        """Monte Carlo standard error of ``var(name)`` (the spread of independent sample groups)."""
        self._check(name)
        se = self.extras.get("var_se")
        if se is None:
            raise ParameterError("no standard errors: solve with groups >= 2")
        return self._flat_block(se, name)

    # ------------------------------------------------------------ finite width N
    def _flat_block(self, flat, name):
        T = len(self.times)
        o, n = self.offsets[name], int(np.prod(self.shapes[name], dtype=int))
        return np.asarray(flat).reshape(T, self.block)[:, o:o + n].T.reshape(self.shapes[name] + (T,))

    def _m1(self):
        if self.extras.get("m1") is None:
            raise ParameterError("no mean correction in this solution: solve with correction=True "
                                 "(dmftc run SPEC --width N)")
        return self.extras["m1"]

    def mean_correction(self, name: str, stderr: bool = False) -> np.ndarray:
        """m1 with E[q]_N = q_inf + m1 / N + O(N^-2), shape of ``mean(name)``; ``stderr=True``: its Monte Carlo
        standard error (spread of the independent sample groups)."""
        self._check(name)
        m1 = self._m1()
        if not stderr:
            return self._flat_block(m1, name)
        se = self.extras.get("m1_se")
        if se is None:
            raise ParameterError("no standard errors: solve with groups >= 2")
        return self._flat_block(se, name)

    # ------------------------------------------------------------ persistence
    def save(self, path) -> Path:
        """Write a self-describing .npz (means, propagator, kappa, U, standard errors, metadata), atomically."""
        import jax
        import lark
        import numba
        import scipy
        import sympy

        from dmftc import __version__

        path = Path(path)
        meta = {
            "model": self.model, "params": {k: _jsonable(v) for k, v in self.params.items()},
            "shapes": {k: list(v) for k, v in self.shapes.items()}, "offsets": self.offsets, "block": self.block,
            "order": list(self.means), "info": _jsonable(self.info),
            "versions": {"dmftc": __version__, "numpy": np.__version__, "jax": jax.__version__,
                         "scipy": scipy.__version__, "sympy": sympy.__version__, "numba": numba.__version__,
                         "lark": lark.__version__},
        }
        arrays = {"times": self.times, "sigma": self.sigma_full, "meta": np.array(json.dumps(meta, sort_keys=True))}
        arrays.update({f"mean:{k}": v for k, v in self.means.items()})
        for k in ("U", "kappa", "var_se", "m1", "m1_se", "mean_se"):
            if self.extras.get(k) is not None:
                arrays[f"extra:{k}"] = self.extras[k]
        return atomic_savez(path, arrays)

    @classmethod
    def load(cls, path) -> "Solution":
        """Read a file written by :meth:`save`."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                means = {k: z[f"mean:{k}"] for k in meta["order"]}
                extras = {k[6:]: z[k] for k in z.files if k.startswith("extra:")}
                times, sigma = z["times"], z["sigma"]
        except (OSError, KeyError, ValueError) as err:
            raise DmftcError(f"{path}: not a dmftc results file ({err})") from None
        params = {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in meta["params"].items()}
        info = dict(meta["info"], versions=meta["versions"])
        return cls(meta["model"], params, times, means, {k: tuple(v) for k, v in meta["shapes"].items()},
                   meta["offsets"], meta["block"], sigma, info, extras)

    def summary(self) -> str:
        backend = self.info.get("diagnostics", {}).get("backend", "mc")
        how = "exact Gaussian moments" if backend == "exact" else f"samples = {self.info.get('samples')}"
        if self.info.get("diagnostics", {}).get("sampler") == "sobol":
            how += " (randomised QMC)"
        lines = [f"model {self.model}: T = {len(self.times)} steps, t_max = {self.times[-1]:.3g}, {how}"]
        lines.append(f"  {'order parameter':<16}{'shape':>10}{'final mean':>14}{'peak N Var':>14}{'at t':>8}")
        for n in self.names:
            m = self.mean(n)
            v = self.var(n)
            flat = v.reshape(-1, v.shape[-1])
            i, t = np.unravel_index(int(np.argmax(flat)), flat.shape)
            final = m[..., -1]
            fm = f"{float(final):.5g}" if np.ndim(final) == 0 else f"|.|={np.linalg.norm(final):.4g}"
            lines.append(f"  {n:<16}{str(self.shapes[n] or '()'):>10}{fm:>14}{flat[i, t]:>14.5g}"
                         f"{self.times[t]:>8.3g}")
        tm = self.info.get("timings", {})
        cond = self.info.get("diagnostics", {}).get("u_condition")
        if tm:
            lines.append("  time: " + ", ".join(f"{k} {v:.2f}s" for k, v in tm.items()))
        if cond is not None:
            lines.append(f"  U condition estimate: {cond:.3g}")
        kink = self.info.get("diagnostics", {}).get("kink")
        if kink and kink.get("exceeds_error_bar"):
            lines.append("  warning: " + kink["approximation"])
        elif self.info.get("singular"):
            w = self.info.get("dirac_width", 0.0)
            lines.append(f"  note: DiracDelta terms ({', '.join(self.info['singular'])}) of a non-smooth activation "
                         + (f"mollified with a Gaussian of width {w:g}" if w > 0 else "DROPPED (dirac_width=0)"))
        return "\n".join(lines)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def atomic_savez(path: Path, arrays: dict) -> Path:
    """Write ``arrays`` to the .npz ``path`` atomically (temporary file in the same directory + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent)
    os.close(fd)
    try:
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
