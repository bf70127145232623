"""The structured deep march: the reference the spec's own single-site program is checked against.

Before deep specs carried their single-site program (:mod:`dmftc.derive.site`, marched by
:mod:`dmftc.runtime.march.site_march`), every deep network was marched by this one: a fixed template of two gp sources
and three fields per layer (h, z, g = phi'(h) z; equations in :mod:`dmftc.runtime.march.deep_dmft`), whose couplings,
boundary rows and readout come from a kernels object: :class:`TemplateKernels` (a compiled deep spec's structured
functions ``h_coupling``, ``z_coupling``, ``readout_average``, ``readout``) or :class:`ModelKernels` (a
:class:`dmftc.runtime.problem.deep_model.DeepModel` with any activation).

It stays as an independent oracle: on the same source paths it equals the site march to round-off
(``tests/test_site_march.py``), for the means, each propagator group's saddle and the exact basis.  The runtime
runs it only for a model given as a DeepModel without a compiled spec (the tests' odd models, and the closed-form
linear propagator of :mod:`dmftc.runtime.engines.deep_linear`); compiled specs and the standard network of the Python API
(:mod:`dmftc.runtime.problem.standard_spec`) march their own program.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dmftc.runtime.numerics.march_numerics import PIVOT_TOL, PIVOT_TOL_EXACT, extend_cholesky, set_col, traced
from dmftc.runtime.problem.spec_kernels import SpecKernels


__all__ = ["TemplateKernels", "ModelKernels", "structured_march", "structured_paths"]


class TemplateKernels(SpecKernels):
    """A compiled deep spec in the structured march's terms: its generated ``h_coupling``, ``z_coupling``,
    ``readout_average`` and ``readout`` and the rows of the adjacent layers (boundaries from the spec)."""

    def activation(self, p):
        mod = self.module
        if not mod.STANDARD_GRADIENT:
            raise ValueError(f"the structured march has the gradient field phi'(h) z only, not that of {mod.SPEC_PATH}")
        return lambda h, w: (mod.phi(h, p, w), mod.dphi(h, p, w), mod.ddphi(h, p, w))

    def forward_rows(self, c, l, t, T, p):
        """Rows t of the layer below hidden layer l+1 (0-based l): {'Phi', 'A'} keyed by spec names too."""
        if l == 0:
            L = len(c["Phi"])
            rows = {"Phi": self._boundary("Phi", 0, T, p, L), "A": self._boundary("A", 0, T, p, L)}
        else:
            rows = {"Phi": c["Phi"][l - 1][t], "A": c["Rphi"][l - 1][t]}
        return rows | {self.names[k]: v for k, v in rows.items()}

    def backward_rows(self, c, l, t, T, p):
        """Rows t of the layer above hidden layer l+1: {'G', 'B'} (boundary layer L+1 for the last one)."""
        L = len(c["G"])
        if l == L - 1:
            rows = {"G": self._boundary("G", L + 1, T, p, L), "B": self._boundary("B", L + 1, T, p, L)}
        else:
            rows = {"G": c["G"][l + 1][t], "B": c["Rg"][l + 1][t]}
        return rows | {self.names[k]: v for k, v in rows.items()}

    def h_coupling(self, rows, Delta, p):
        return self.module.h_coupling(rows, Delta, p)

    def z_coupling(self, rows, Delta, p):
        return self.module.z_coupling(rows, Delta, p)

    def readout_average(self, last, nxt, Delta, past, upto, p):
        last = last | {self.names[k]: v for k, v in last.items()}
        return self.module.readout_average(last, nxt, Delta, past, upto, p)

    def readout(self, e_t, e_0, p):
        return self.module.readout(e_t, e_0, p)


class ModelKernels(TemplateKernels):
    """A :class:`dmftc.runtime.problem.deep_model.DeepModel`'s action with an activation, in the march's terms: couplings
    A + k_h(Phi, Delta) and (B, k_z(G, Delta)), boundary kernels phi0 and g_top (responses 0), the readout
    Delta = y0 + c_t E_t + c_0 E_0 with E by Stein's lemma, and the model's K.  Marched for a model given as
    a DeepModel without a compiled spec (e.g. :func:`dmftc.reference.standard_model.standard`, or the tests' odd model).  The
    model's numeric values are the march's traced parameters: one compilation serves its whole family."""

    def __init__(self, activation, model):
        self.module = None
        self.site, self.model = activation, model
        if not activation.standard_gradient:
            raise ValueError(f"the structured march has the gradient field phi'(h) z only, not that of "
                             f"{activation.label}")
        self.key = ("model", activation, model.family if model.bind is not None else model.key)
        self.names = {"Phi": "Phi", "A": "A", "G": "G", "B": "B"}
        self.scalars = ("K",)

    def params(self, L: int) -> dict:
        """The march's parameter values for depth L: the model's values (traced), L and the activation's width."""
        return dict(self.model.values) | {"L": L, "dirac width": self.site.width}

    def march(self, xiu, xir, wts, prm, *, L, T, exact, direct=False, keep=False):
        """:func:`structured_march` of these kernels (what the runtime's march calls for a hand-built model)."""
        return structured_march(xiu, xir, wts, prm, L=L, T=T, exact=exact, spec=self, direct=direct, keep=keep)

    def _m(self, p):
        return self.model.bind(p) if self.model.bind is not None else self.model

    @property
    def linear(self) -> bool:
        return bool(self.site.linear)

    def activation(self, p):
        return lambda h, w: self.site.fn(h)[:3]           # the width is part of the SiteActivation

    def _boundary(self, role, layer, T, p, depth):
        m = self._m(p)
        value = {"Phi": m.phi0, "G": m.g_top, "A": 0.0, "B": 0.0}[role]
        return jnp.full((T,), value, dtype=jnp.float64)

    def h_coupling(self, rows, Delta, p):
        return self._m(p).k_h(rows["Phi"], Delta) + rows["A"]

    def z_coupling(self, rows, Delta, p):
        return rows["B"], self._m(p).k_z(rows["G"], Delta)

    def readout_average(self, last, nxt, Delta, past, upto, p):
        c0, c = self.z_coupling(nxt, Delta, p)                # Stein's lemma for r[L] ~ GP(0, G[L+1])
        return (jnp.sum(past * nxt["G"] * last["A"]) + jnp.sum(upto * c0 * last["Phi"])
                + jnp.sum(past * c * last["Phi"]))

    def readout(self, e_t, e_0, p):
        return self._m(p).error_signal(e_t, e_0)

    def scalar_values(self, diag, p):
        L = int(p["L"])
        return {"K": self._m(p).k_of([diag("Phi", l) for l in range(L + 1)], [diag("G", l) for l in range(1, L + 2)])}

    def report_f(self, e, p):
        """-c_t E_t: the output change f(t) - f(0) of the network (E_t / gamma for the standard network)."""
        return -self._m(p).readout[1] * e


def structured_march(xiu, xir, wts, prm, *, L, T, exact, spec, direct=False, keep=False):
    """One complete forward march.  xiu, xir: (L, S, T) standard normals (or basis coefficients).

    ``spec`` (a :class:`TemplateKernels` of a compiled deep spec, or a :class:`ModelKernels`, e.g. the network of
    :mod:`dmftc.runtime.march.deep_dmft`) supplies the activation, the coupling kernels of the h and z equations, the boundary layers and
    the readout of the error signal; ``prm`` is the dict of its parameter values (traced: one compilation
    serves every value).  ``wts`` (S,): the weight of each row in the averages (1/S for plain sample means,
    cubature weights summing to 1, or 1 per basis row on the exact backend).

    ``direct``: the error signal reads the readout average E[z[L] phi(h[L])](t) as the weighted mean over the
    rows themselves ('fdir') instead of its Stein's-lemma form: then every average of the march is a
    plain weighted mean over the same paths, and the result is the exact saddle of the Monte Carlo action
    built on those paths (what :mod:`dmftc.runtime.engines.deep_propagator` differentiates).  ``keep``: also return
    the per-path fields h, z and the causal Cholesky factors Cu, Cr of the sources (u = xiu Cu^T).

    Per-layer buffers, all with the sample axis leading (a pure batch axis: no loop over samples):
    fields h, phi(h), z, g (S, T); tangents Dgz, Pz, Dgh, Ph stored flat as (S*T_s, T_t'): entry
    (n*T + s, t') is the derivative of g(t') [Dg] or phi'(h(t')) h(t') [P] of sample n w.r.t. an
    additive perturbation of z(s) [..z] or h(s) [..h].  Contracting the last axis with a kernel row
    makes every tangent update one (S*T, T) @ (T,) product and one column write, in place.  (Written
    as batched 2-D products rather than a jax.vmap of per-sample (T, T) products: XLA duplicated the
    vmapped 3-D buffers every step, 5x slower.)  On the exact backend phi' = 1 and phi'' = 0, so the
    tangents are the same for every basis row and are carried for one row only.
    """
    act = spec.activation(prm)
    width = prm["dirac width"]
    S = xiu.shape[1]
    tol = PIVOT_TOL_EXACT if exact else PIVOT_TOL
    St = 1 if exact else S                  # linear fields: phi' = 1, phi'' = 0, tangents equal on all rows
    avg = (lambda X: X[0]) if exact else (lambda X: wts @ X)   # weighted mean of a tangent over the rows
    per_layer = ("h", "ph", "z", "g", "Dgz", "Pz", "Dgh", "Ph", "Cu", "Cr", "Phi", "G", "Rphi", "Rg")
    shapes = dict(h=(S, T), ph=(S, T), z=(S, T), g=(S, T), Dgz=(St * T, T), Pz=(St * T, T), Dgh=(St * T, T),
                  Ph=(St * T, T), Cu=(T, T), Cr=(T, T), Phi=(T, T), G=(T, T), Rphi=(T, T), Rg=(T, T))
    carry0 = {k: [jnp.zeros(shapes[k]) for _ in range(L)] for k in per_layer}
    carry0.update(Delta=jnp.zeros(T), f=jnp.zeros(T), fdir=jnp.zeros(T))
    idx = jnp.arange(T)

    def step(t, c):
        c = {k: (list(v) if k in per_layer else v) for k, v in c.items()}
        onehot = (idx == t).astype(jnp.float64)
        past, upto = idx < t, (idx <= t).astype(jnp.float64)
        Dm = jnp.where(past, c["Delta"], 0.0)
        local = []
        for l in range(L):                                          # forward sweep, layer l+1
            rows = spec.forward_rows(c, l, t, T, prm)                # the layer below (a boundary at l = 0)
            krow = rows["Phi"] * upto
            M = jnp.where(past, spec.h_coupling(rows, Dm, prm), 0.0)
            c["Cu"][l] = Cu = extend_cholesky(c["Cu"][l], krow, t, tol)
            h = xiu[l] @ Cu[t] + c["g"][l] @ M
            dhz = (c["Dgz"][l] @ M).reshape(St, T)                   # d h(t) / d z(s)
            dhh = (c["Dgh"][l] @ M).reshape(St, T) + onehot          # d h(t) / d h(s)
            p0, p1, p2 = act(h, width)
            if exact:
                p1, p2 = jnp.ones(1), jnp.zeros(1)
            Pzt, Pht = p1[:, None] * dhz, p1[:, None] * dhh
            c["h"][l], c["ph"][l] = set_col(c["h"][l], h, t), set_col(c["ph"][l], p0, t)
            c["Pz"][l], c["Ph"][l] = set_col(c["Pz"][l], Pzt, t), set_col(c["Ph"][l], Pht, t)
            c["Phi"][l] = c["Phi"][l].at[t].set(((wts * p0) @ c["ph"][l]) * upto)
            c["Rphi"][l] = c["Rphi"][l].at[t].set(jnp.where(past, avg(Pzt), 0.0))
            local.append((dhz, dhh, p1, p2))
        # the readout: its averages E[z[L] phi(h[L])] reduced by Stein's lemma (f: E at t)
        last = {"Phi": c["Phi"][L - 1][t], "A": c["Rphi"][L - 1][t]}
        e_t = spec.readout_average(last, spec.backward_rows(c, L - 1, t, T, prm), Dm, past, upto, prm)
        c["f"] = c["f"].at[t].set(e_t)
        if not direct:                                             # (Delta(t) is read at later steps only)
            c["Delta"] = c["Delta"].at[t].set(spec.readout(e_t, c["f"][0], prm))
        for l in reversed(range(L)):                                 # backward sweep, layer l+1
            rows = spec.backward_rows(c, l, t, T, prm)               # the layer above (a boundary at l = L-1)
            krow = rows["G"] * upto
            c0, c1 = spec.z_coupling(rows, Dm, prm)
            N = upto * c0 + jnp.where(past, c1, 0.0)
            c["Cr"][l] = Cr = extend_cholesky(c["Cr"][l], krow, t, tol)
            z = xir[l] @ Cr[t] + c["ph"][l] @ N                      # includes Rg[l+1](t,t) phi(h(t))
            dzz = (c["Pz"][l] @ N).reshape(St, T) + onehot
            dzh = (c["Ph"][l] @ N).reshape(St, T)
            dhz, dhh, p1, p2 = local[l]
            g = z if exact else p1 * z
            p2z = p2 if exact else p2 * z
            dgz = p2z[:, None] * dhz + p1[:, None] * dzz
            dgh = p2z[:, None] * dhh + p1[:, None] * dzh
            c["z"][l], c["g"][l] = set_col(c["z"][l], z, t), set_col(c["g"][l], g, t)
            c["Dgz"][l], c["Dgh"][l] = set_col(c["Dgz"][l], dgz, t), set_col(c["Dgh"][l], dgh, t)
            c["G"][l] = c["G"][l].at[t].set(((wts * g) @ c["g"][l]) * upto)
            c["Rg"][l] = c["Rg"][l].at[t].set(avg(dgh) * upto)
        zphi = (wts * c["z"][L - 1][:, t]) @ c["ph"][L - 1][:, t]
        c["fdir"] = c["fdir"].at[t].set(zphi)
        if direct:
            c["Delta"] = c["Delta"].at[t].set(spec.readout(zphi, c["fdir"][0], prm))
        return c

    c = jax.lax.fori_loop(0, T, step, carry0)
    names = ("Phi", "G", "Rphi", "Rg", "Delta", "f", "fdir") + (("h", "z", "Cu", "Cr") if keep else ())
    return {k: (jnp.stack(c[k]) if k in per_layer else c[k]) for k in names}


_JIT: dict = {}


def structured_paths(spec, prm: dict, xiu, xir, weights=None, *, direct=True):
    """The structured march on standard normals xiu, xir (L, S, T) with every path kept: numpy arrays
    {Phi, G, Rphi, Rg (L, T, T; causal rows), Delta, f, fdir (T,), h, z, Cu, Cr (L, ...)} (``direct``: the
    readout average as a plain mean over the paths, as :func:`dmftc.runtime.march.deep_dmft.march_paths`)."""
    import numpy as np

    L, S, T = xiu.shape
    wts = np.full(S, 1.0 / S) if weights is None else np.asarray(weights, float) / np.sum(weights)
    key = (spec.key, L, T, direct)
    if key not in _JIT:
        _JIT[key] = jax.jit(lambda a, b, w, p: structured_march(a, b, w, p, L=L, T=T, exact=False, spec=spec,
                                                                direct=direct, keep=True))
    out = _JIT[key](jnp.asarray(xiu), jnp.asarray(xir), jnp.asarray(wts), traced(prm))
    return {k: np.asarray(v) for k, v in out.items()}
