"""The standard deep network written out by hand as a :class:`dmftc.runtime.problem.deep_model.DeepModel`: an oracle for
the tests, independent of the spec compiler.  The runtime's standard network is the compiled spec
``specs/deep_tanh.dmft`` (:mod:`dmftc.runtime.problem.standard_spec`); tests compare the two (tests/test_deep_linear.py)
and use this one where a model must not depend on the compiler."""
from __future__ import annotations

from dataclasses import replace

from dmftc.runtime.problem.deep_model import DeepModel

__all__ = ["standard"]


def _std_k(dPhi, dG):
    return sum(dG[l] * dPhi[l] for l in range(len(dPhi)))


def _march(activation, model):
    from dmftc.reference.structured_march import ModelKernels      # (imports the runtime: not at module level)

    return ModelKernels(activation, model)


def _standard_bound(v) -> DeepModel:
    eg, g = v["eta"] * v["gamma"], v["gamma"]
    return DeepModel(key=("standard-bound",), label="standard deep network", k_h=lambda q, d: eg * d * q,
                     k_z=lambda q, d: eg * d * q, readout=(v["y"], -1.0 / g, 1.0 / g), phi0=1.0, g_top=1.0,
                     k_of=_std_k, march=_march)


def standard(*, gamma: float, eta: float, y: float) -> DeepModel:
    """The standard deep network of :mod:`dmftc.runtime.march.deep_dmft`'s doc (mean-field parameterisation, one
    training point, |x|^2 = D): k_h = eta gamma Delta Phi, k_z = eta gamma Delta G, Delta = y - (E_t - E_0) / gamma,
    Phi[0] = G[L+1] = 1, K = sum_l G[l+1] Phi[l]."""
    v = {"eta": float(eta), "gamma": float(gamma), "y": float(y)}
    return replace(_standard_bound(v), key=("standard", v["gamma"], v["eta"], v["y"]), family=("standard",),
                   values=tuple(sorted(v.items())), bind=_standard_bound)
