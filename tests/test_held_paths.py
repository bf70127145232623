"""The features' covariance of the deep propagator from more paths at each group's saddle
(dmftc.runtime.sensitivities.held_paths, deep_propagator's ``feature_samples``).

(1) The held march is the group's own process: fed the group's own normals, it gives the group's fields to
round-off, for every layer kind (first, middle, last), on several training points (same-time couplings between
points) and with one-time coefficients (momentum and weight decay).  (2) The extra paths change the hat-hat block
of each ln Z_l and nothing else, and that block is then the plain estimator's on all the paths together.  (3) The
Sobol' paths of a group are the first points of its larger set.  (4) The estimate agrees with the plain estimator
within their combined standard errors, with standard errors several times smaller.  The agreement with
finite-width networks is checked by the propagator's network tests, which run it by default.
"""
from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.runtime.engines.deep_propagator import deep_propagator, mc_saddle
from dmftc.runtime.numerics.sampling import source_normals
from dmftc.runtime.problem.deep_action import Layout, gather_local, saddle_point_vector
from dmftc.runtime.sensitivities.local_estimator import estimator, local_couplings

SPECS = Path(__file__).resolve().parent.parent / "specs"


def _spec_case(name, **given):
    """(activation, model, L, steps, points) of a shipped deep spec at the given parameters."""
    from dmftc.runtime.march.deep_dmft import SpecKernels
    from dmftc.runtime.problem.deep_model import from_spec

    mod = dmftc.load(str(SPECS / f"{name}.dmft")).module
    if getattr(mod, "POINTS", None):
        from dmftc.runtime.engines.deep_points import resolve_point_params

        p, L, T, P = resolve_point_params(mod, given)
    else:
        from dmftc.runtime.problem.params import resolve_deep_params

        (p, L, T), P = resolve_deep_params(mod, given), 1
    return SpecKernels(mod).site_activation(p, 0.1), from_spec(mod, p), L, T * P, P


def _standard(L, T):
    from dmftc.runtime.problem.standard_spec import model_and_activation

    model, act = model_and_activation(None, "tanh", 0.7, -0.6, 0.1, L=L)
    return act, model, L, T, 1


CASES = {
    "tanh_L3": lambda: _standard(3, 6),
    "multi_P2": lambda: _spec_case("deep_multi", P=2, L=2, T=4, Kx=np.array([[1.0, 0.3], [0.3, 0.8]]),
                                   y=np.array([0.9, -0.5]), eta=0.2),
    "sgd_momentum_decay": lambda: _spec_case("deep_sgd", T=6, beta=0.8, lam=0.5, eta=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_held_march_reproduces_the_groups_own_fields(case):
    act, model, L, n, P = CASES[case]()
    xi = source_normals("sobol", np.random.SeedSequence([4, 0]), L, 64, n)
    sad, fields = mc_saddle(activation=act, L=L, T=n, xiu=xi[0], xir=xi[1], model=model, points=P)
    model = sad.model
    x0 = saddle_point_vector(sad)
    for l in range(1, L + 1):
        v, _ = gather_local(jnp.asarray(x0), Layout(L, n), l, phi0=model.phi0, g_top=model.g_top)
        C, E, _ = local_couplings(jnp.asarray(v), n, model)
        Cu, Cr = fields.factors[l - 1]
        w = np.concatenate([xi[0][l - 1] @ Cu.T, xi[1][l - 1] @ Cr.T], axis=1)
        assert np.abs(w - fields.w[l - 1]).max() <= 1e-13 * np.abs(fields.w[l - 1]).max()
        x = estimator(n, act, l > 1, l < L, points=P).held().fields(np.asarray(C), np.asarray(E), w,
                                                                    model.one_time_rows(n))
        scale = np.abs(fields.x[l - 1]).max()
        assert np.abs(x - fields.x[l - 1]).max() <= 1e-12 * scale, (case, l)
        # a path marched without the same-time settling would differ: the check can fail
        assert np.abs(x[:, :n] - fields.w[l - 1][:, :n]).max() > 1e-3 * scale


def _hat_slices(T):
    """Positions of the hats (Phi_hat, G_hat, Delta_hat) in a layer's local vector (deep_action.log_z_local)."""
    nt = T * (T + 1) // 2
    o_ph, o_dh = 2 * nt + 2 * T * T, 4 * nt + 2 * T * T + T
    return np.concatenate([o_ph + np.arange(2 * nt), o_dh + np.arange(T)])


def test_extra_paths_change_only_the_hat_hat_block_to_the_pooled_covariance():
    act, model, L, T, _ = _standard(2, 5)
    S, Se = 32, 96
    xi = source_normals("sobol", np.random.SeedSequence([9, 1]), L, S + Se, T)
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0][:, :S], xir=xi[1][:, :S], model=model)
    model = sad.model
    x0 = saddle_point_vector(sad)
    hats = _hat_slices(T)
    for l in range(1, L + 1):
        v, _ = gather_local(jnp.asarray(x0), Layout(L, T), l, phi0=model.phi0, g_top=model.g_top)
        est = estimator(T, act, l > 1, l < L, chunk=S)     # one chunk shape for S and for S + Se paths
        C, E, _ = local_couplings(jnp.asarray(v), T, model)
        Cu, Cr = fields.factors[l - 1]
        we = np.concatenate([xi[0][l - 1, S:] @ Cu.T, xi[1][l - 1, S:] @ Cr.T], axis=1)
        kw = dict(top=float(l == L), model=model)
        _, g0, h0 = est.log_z(np.asarray(v), fields.w[l - 1], fields.x[l - 1], **kw)
        _, g1, h1 = est.log_z(np.asarray(v), fields.w[l - 1], fields.x[l - 1], extra=we, **kw)
        assert np.array_equal(g0, g1)
        other = np.ones(h0.shape, bool)
        other[np.ix_(hats, hats)] = False
        assert np.array_equal(h0[other], h1[other])
        # all S + Se paths as plain paths of the estimator (the held march's fields for the extra ones)
        xe = est.held().fields(np.asarray(C), np.asarray(E), we, model.one_time_rows(T))
        _, _, hall = est.log_z(np.asarray(v), np.concatenate([fields.w[l - 1], we]),
                               np.concatenate([fields.x[l - 1], xe]), **kw)
        got, want = h1[np.ix_(hats, hats)], hall[np.ix_(hats, hats)]
        assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max(), l
        assert np.abs(h0[np.ix_(hats, hats)] - want).max() > 1e-3 * np.abs(want).max()


def test_sobol_group_paths_are_the_first_points_of_the_larger_set():
    small = source_normals("sobol", np.random.SeedSequence([3, 2]), 2, 64, 7)
    large = source_normals("sobol", np.random.SeedSequence([3, 2]), 2, 1024, 7)
    assert np.array_equal(small, large[:, :, :64])


def test_feature_paths_agree_with_the_plain_estimator_and_cut_its_noise():
    """tanh, L = 2, T = 8, 8 groups of 128 paths, the features from 16 times as many: every N Var within 4
    combined standard errors of the plain estimator on other seeds; the worst standard error relative to the
    curve's peak at most half the plain one's (measured: 9.8% against 2.0%; Delta, K, G[l] 5-10 times smaller,
    Phi[l], whose noise comes mostly from the derivatives, 2.5-3 times)."""
    kw = dict(activation="tanh", L=2, T=8, gamma=1.0, y=0.8, eta=0.1, samples=1024, groups=8)
    plain = deep_propagator(seed=1, feature_samples=1024, **kw)
    more = deep_propagator(seed=2, **kw)
    assert more.params["feature_samples"] == 16 * 1024
    worst = {}
    for n in plain.sigma:
        se = np.hypot(plain.se_var(n), more.se_var(n))
        ok = se > 1e-9 * np.abs(plain.var(n)).max()
        assert (np.abs(plain.var(n) - more.var(n))[ok] / se[ok]).max() <= 4.0, n
        peak = np.abs(plain.var(n)).max()
        worst[n] = (plain.se_var(n).max() / peak, more.se_var(n).max() / peak)
    assert max(w[1] for w in worst.values()) <= 0.5 * max(w[0] for w in worst.values()), worst
