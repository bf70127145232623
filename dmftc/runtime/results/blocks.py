"""Propagator blocks behind a :class:`dmftc.runtime.results.solution.Solution`: where ``sigma``, ``var``, ``var_stderr``,
``kappa``, ``U`` and ``two_time`` come from.

* :class:`DenseBlocks`: every block in memory, time-major over the per-time components (a two-layer solve's
  propagator, kappa and U; any solution read back from a results file).
* :class:`LazyBlocks`: a deep solve's propagator, computed on first use (the Monte Carlo Hessian of the action
  costs far more than the means) or already exact (linear specs), read in the spec's names.
* :class:`LazyDense`: the same for a deep spec on several training points, whose observables carry point
  indices: computed on first use as a :class:`DenseBlocks`.

Both answer in the shapes of the solution contract: ``sigma(a, b)`` is ``(*dims_a, T, *dims_b, T)``, ``var`` and
``var_se`` are ``(*dims, T)``; a deep kernel's blocks are on its time diagonal, ``Phi[l](t, t)`` (dims ``()``).
"""
from __future__ import annotations

import numpy as np

from dmftc.errors import ParameterError

_NO_TWO_TIME = ("two_time(a, b) is computed for linear deep specs on one training point, in the solve itself (results "
                "files do not keep it); this solution has equal-time blocks only: sigma(a, b)")


class DenseBlocks:
    """Blocks stored densely: ``sigma`` (T m, T m), time-major with ``m`` components per time; a name's
    components sit at ``offsets[name]`` and have index dims ``shapes[name]``.  ``var_se`` (T m,): standard
    error of the diagonal; ``kappa``, ``U`` (T m, T m) when the solver kept them."""

    def __init__(self, T: int, shapes: dict, offsets: dict, block: int, sigma: np.ndarray, var_se=None, kappa=None,
                 U=None):
        self.T, self.shapes, self.offsets, self.block = int(T), dict(shapes), dict(offsets), int(block)
        self.sigma_full, self.var_se_flat, self.kappa_full, self.U_full = sigma, var_se, kappa, U

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.offsets)

    def _size(self, name):
        return int(np.prod(self.shapes[name], dtype=int))

    def _block(self, full, a, b):
        T = self.T
        M = np.asarray(full).reshape(T, self.block, T, self.block)
        oa, ob = self.offsets[a], self.offsets[b]
        blk = M[:, oa:oa + self._size(a), :, ob:ob + self._size(b)]      # (T, na, T, nb)
        blk = np.transpose(blk, (1, 0, 3, 2))                            # (na, T, nb, T)
        return blk.reshape(self.shapes[a] + (T,) + self.shapes[b] + (T,))

    def flat(self, flat, name):
        """The components of ``name`` in a (T m,) time-major vector, shape (*dims, T)."""
        o, n = self.offsets[name], self._size(name)
        return np.asarray(flat).reshape(self.T, self.block)[:, o:o + n].T.reshape(self.shapes[name] + (self.T,))

    def sigma(self, a, b):
        return self._block(self.sigma_full, a, b)

    def var(self, name):
        return self.flat(np.diag(self.sigma_full), name)

    def var_se(self, name):
        if self.var_se_flat is None:
            raise ParameterError("no standard errors: solve with groups >= 2")
        return self.flat(self.var_se_flat, name)

    def kappa(self, a, b):
        if self.kappa_full is None:
            raise ParameterError("kappa blocks are kept by two-layer solves (deep solves keep the propagator only)")
        return self._block(self.kappa_full, a, b)

    def U(self, a, b):
        if self.U_full is None:
            raise ParameterError("U blocks are kept by two-layer solves (deep solves keep the propagator only)")
        return self._block(self.U_full, a, b)

    def two_time(self, a, b):
        raise ParameterError(_NO_TWO_TIME)

    def arrays(self) -> tuple[dict, dict]:
        """(arrays, meta) for a results file."""
        arrays = {"sigma": self.sigma_full}
        for k, v in (("var_se", self.var_se_flat), ("kappa", self.kappa_full), ("U", self.U_full)):
            if v is not None:
                arrays[k] = v
        meta = {"shapes": {k: list(v) for k, v in self.shapes.items()}, "offsets": self.offsets,
                "block": self.block, "order": list(self.offsets)}      # (the file's JSON sorts its keys)
        return arrays, meta

    @classmethod
    def from_arrays(cls, T, arrays: dict, meta: dict) -> "DenseBlocks":
        order = meta["order"]
        return cls(T, {k: tuple(meta["shapes"][k]) for k in order}, {k: meta["offsets"][k] for k in order},
                   meta["block"], arrays["sigma"], arrays.get("var_se"), arrays.get("kappa"), arrays.get("U"))


_DIAGNOSTICS = ("dirac_shift", "dirac_shift_vs_se", "dirac_extrapolated", "stationarity", "psd_within_mc",
                "solve_bias", "solve_bias_vs_se")


def record_diagnostics(info: dict, diagnostics: dict):
    """The Monte Carlo propagator's diagnostics a solution reports (its error bars' caveats) into ``info``."""
    for k in _DIAGNOSTICS:
        if k in diagnostics:
            info[f"propagator_{k}" if not k.startswith("dirac") else k] = diagnostics[k]


class LazyBlocks:
    """A deep solve's propagator in the spec's names: ``source()`` returns the propagator object
    (:class:`dmftc.runtime.problem.deep_action.Propagator` or :class:`dmftc.runtime.engines.deep_propagator.DeepPropagator`,
    with ``sigma[a][b]`` (T, T) and, for Monte Carlo, ``se[a][b]``) in the internal names, computed on the first
    call; ``names``: spec name -> internal name of the observables; ``info``: the solution's info, which receives
    the propagator's diagnostics once computed."""

    def __init__(self, T: int, source, names: dict, info: dict):
        self.T, self._source, self._names, self._info = int(T), source, dict(names), info
        self._value = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._names)

    @property
    def computed(self) -> bool:
        return self._value is not None

    def get(self):
        if self._value is None:
            prop = self._source()
            record_diagnostics(self._info, getattr(prop, "diagnostics", {}))
            self._value = prop
        return self._value

    def sigma(self, a, b):
        return np.asarray(self.get().sigma[self._names[a]][self._names[b]])

    def var(self, name):
        return np.diag(self.sigma(name, name)).copy()

    def var_se(self, name):
        se = getattr(self.get(), "se", None)
        if se is None:                                     # exact (linear) propagator
            return np.zeros(self.T)
        return np.diag(se[self._names[name]][self._names[name]]).copy()

    def kappa(self, a, b):
        raise ParameterError("kappa blocks are kept by two-layer solves (deep solves keep the propagator only)")

    def U(self, a, b):
        raise ParameterError("U blocks are kept by two-layer solves (deep solves keep the propagator only)")

    def two_time(self, a, b):
        prop = self.get()
        if not hasattr(prop, "two_time"):
            raise ParameterError("two-time blocks are available for linear deep specs only; nonlinear ones give "
                                 "sigma(a, b) on the time diagonal")
        ia, ib = self._names[a], self._names[b]
        for n, i in ((a, ia), (b, ib)):
            if i not in prop.layout.blocks or not i.startswith(("Phi[", "G[")):
                raise ParameterError(f"two_time needs two-time kernels, got {n!r}")
        return prop.two_time(ia, ib)

    def dense(self) -> DenseBlocks:
        """Every equal-time block in memory (computes the propagator if it has not been)."""
        names, T = self.names, self.T
        m = len(names)
        sigma = np.zeros((T, m, T, m))
        se = np.zeros((T, m))
        for i, a in enumerate(names):
            se[:, i] = self.var_se(a)
            for j, b in enumerate(names):
                sigma[:, i, :, j] = self.sigma(a, b)
        return DenseBlocks(T, {n: () for n in names}, {n: i for i, n in enumerate(names)}, m,
                           sigma.reshape(T * m, T * m), se.ravel())


class LazyDense:
    """Blocks computed on first use as a :class:`DenseBlocks` (the Monte Carlo propagator of a deep spec on several
    training points, whose observables carry point indices): ``source()`` returns (DenseBlocks, diagnostics);
    ``names``: the observables, known before computing; ``info``: the solution's info, which receives the
    diagnostics once computed."""

    def __init__(self, T: int, names, source, info: dict):
        self.T, self._names, self._source, self._info = int(T), tuple(names), source, info
        self._value = None

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def computed(self) -> bool:
        return self._value is not None

    def get(self) -> DenseBlocks:
        if self._value is None:
            dense, diagnostics = self._source()
            record_diagnostics(self._info, diagnostics)
            self._value = dense
        return self._value

    def sigma(self, a, b):
        return self.get().sigma(a, b)

    def var(self, name):
        return self.get().var(name)

    def var_se(self, name):
        return self.get().var_se(name)

    def kappa(self, a, b):
        return self.get().kappa(a, b)

    def U(self, a, b):
        return self.get().U(a, b)

    def two_time(self, a, b):
        raise ParameterError(_NO_TWO_TIME)

    def dense(self) -> DenseBlocks:
        return self.get()
