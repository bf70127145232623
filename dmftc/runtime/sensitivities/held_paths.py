"""More paths of one deep layer's single-site process at a group's saddle, for the covariance of its features.

Why.  The deep propagator's Monte Carlo noise comes almost all from one block of the action's Hessian: the
hat-hat block of each ln Z_l, the covariance over the paths of the layer's features f (the kernels' factor
products and the readout; ``benchmarks/bench_propagator_noise.py``).  That block needs the paths' fields only,
while every other block needs per-path derivatives that cost about a hundred marches each (T = 30).  So each
group takes its derivatives, and its saddle, from its own S paths as before, and the features' covariance from
those S paths together with S_e more paths of the same single-site process.

Which process.  At the group's saddle the order parameters q are fixed numbers: the couplings C, E of
x = w + K y(x) (:mod:`dmftc.runtime.sensitivities.site_moments`) and the sources' causal Cholesky factors, with
which w = (Cu xi_u, Cr xi_r).  A path of standard normals xi determines its fields by that causal system, one time
after the other (outputs at time t read the fields at t; the fields at t read outputs up to t, the same time only
through the nilpotent same-time couplings, so nx P + 1 sweeps of one time settle it, P the training points per
time).  The group's own paths solve exactly this system (their march built q from themselves; the tests check
that the held march reproduces their fields to round-off), so all S + S_e paths are draws of the single-site
process at q, and

    hat-hat block = Cov_q(f) estimated from the S + S_e paths (plain means, the normalisation of the plain
                    estimator),

an estimate of the same quantity as the plain estimator's, with less noise.  Every group still gives a complete,
independent estimate (its own saddle, derivatives and extra paths), so the spread over groups stays an honest
standard error.  With the Sobol' sampler the S group paths are the first S points of the group's scrambled set of
S + S_e points (:func:`dmftc.runtime.numerics.sampling.source_normals` draws prefixes), so the covariance comes
from the whole, better balanced set.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.sensitivities.site_moments import SiteMoments, coupling_matrix, path_features

__all__ = ["HeldPaths"]

_CHUNK = 1024                 # paths per call (one compiled shape per layer kind)


class HeldPaths:
    """The held single-site process of one layer kind (the :class:`SiteMoments` of its estimator): fields and
    feature sums of paths at given couplings."""

    def __init__(self, moments: SiteMoments, chunk: int = _CHUNK):
        self.m, self.chunk = moments, int(chunk)
        self._fields = jax.jit(self._solve)
        self._sums = jax.jit(self._feature_sums)

    def _solve(self, C, E, W, CV):
        """The fields X (S, nx T) of the source paths W (S, nx T) at couplings C, E (module doc)."""
        lm, T, P = self.m.local, self.m.T, self.m.points
        nx, ny, S = lm.nx, lm.ny, W.shape[0]
        Kt = coupling_matrix(lm, C, E).reshape(nx, T, ny, T).transpose(1, 0, 3, 2)      # [t, i, s, o]
        Wt = W.reshape(S, nx, T).transpose(0, 2, 1)                                      # (S, T, nx)

        def outputs(x, cv):                                   # (S, P, nx) -> (S, P, ny)
            flat = x.reshape(-1, nx)
            if cv is None:
                y = jax.vmap(lambda v: lm.outputs_at(v))(flat)
            else:
                y = jax.vmap(lm.outputs_at)(flat, jnp.broadcast_to(cv, (S,) + cv.shape).reshape(flat.shape[0], -1))
            return y.reshape(S, P, ny)

        def time(tau, carry):
            X, Y = carry
            k = jax.lax.dynamic_slice_in_dim(Kt, tau * P, P, axis=0)                     # (P, nx, T, ny)
            w = jax.lax.dynamic_slice_in_dim(Wt, tau * P, P, axis=1)                     # (S, P, nx)
            cv = None if CV is None else jax.lax.dynamic_slice_in_dim(CV, tau * P, P, axis=0)
            def sweep(_, xy):
                x, Y = xy
                Y = jax.lax.dynamic_update_slice_in_dim(Y, outputs(x, cv), tau * P, axis=1)
                return w + jnp.einsum("pito,sto->spi", k, Y), Y

            # same-time couplings are nilpotent: settled after nx P sweeps
            x, Y = jax.lax.fori_loop(0, nx * P + 1, sweep, (w, Y))
            Y = jax.lax.dynamic_update_slice_in_dim(Y, outputs(x, cv), tau * P, axis=1)
            return jax.lax.dynamic_update_slice_in_dim(X, x, tau * P, axis=1), Y

        X, _ = jax.lax.fori_loop(0, T // P, time, (jnp.zeros((S, T, nx)), jnp.zeros((S, T, ny))))
        return X.transpose(0, 2, 1).reshape(S, nx * T)

    def _feature_sums(self, C, E, W, mask, fa, fb, CV):
        lm, T = self.m.local, self.m.T
        X = self._solve(C, E, W, CV)
        a, b, r = lm.feature_values(X.reshape(-1, lm.nx, T).transpose(0, 2, 1), CV)
        f = jax.vmap(lambda a1, b1, r1: path_features(a1, b1, r1, fa, fb, self.m.tril, self.m.first))(a, b, r)
        fm = f * mask[:, None]
        return jnp.sum(fm, axis=0), fm.T @ f

    def fields(self, C, E, W, CV=None) -> np.ndarray:
        """The fields (S, nx T) of the source paths W (S, nx T) at the couplings C, E (one call, no chunks)."""
        return np.asarray(self._fields(jnp.asarray(C), jnp.asarray(E), jnp.asarray(W),
                                       None if CV is None else jnp.asarray(CV, jnp.float64)))

    def feature_sums(self, C, E, W, *, feature, CV=None) -> tuple[np.ndarray, np.ndarray]:
        """(sum_n f_n (nf,), sum_n f_n f_n^T (nf, nf)) over the source paths W (S, nx T) at the couplings C, E;
        ``feature``: the readout's coefficients (fa, fb) as for :meth:`SiteMoments.moments`."""
        S, c = W.shape[0], self.chunk
        fa, fb = (np.broadcast_to(np.asarray(f, np.float64), (self.m.T,)) for f in feature)
        fixed = (jnp.asarray(C), jnp.asarray(E))
        cv = None if CV is None else jnp.asarray(CV, jnp.float64)
        sf = sff = None
        for i0 in range(0, S, c):
            Wc = np.asarray(W[i0:i0 + c])
            k = Wc.shape[0]
            mask = np.zeros(c)
            mask[:k] = 1.0
            if k < c:                                  # padded to the one compiled shape, with zero weight
                Wc = np.concatenate([Wc, np.zeros((c - k, Wc.shape[1]))])
            a, b = self._sums(*fixed, jnp.asarray(Wc), jnp.asarray(mask), fa, fb, cv)
            sf, sff = (np.array(a), np.array(b)) if sf is None else (sf + np.asarray(a), sff + np.asarray(b))
        return sf, sff
