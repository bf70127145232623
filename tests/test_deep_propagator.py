"""Finite-width propagator of deep nonlinear networks from the Monte Carlo Hessian of the discrete-time MSR
action (dmftc.runtime.engines.deep_propagator).

Chain of checks: (1) the single-site integrand's derivatives from two Newton steps equal finite differences of
a converged solver, through third order (and one step does not); (2) the structured estimator equals the
brute-force autodiff Hessian on the same samples (round-off), and the sums of dmftc.runtime.sensitivities.site_moments (the
default path: the program's local derivatives, implicit-function calculus) equal the structured estimator on the
same samples (round-off; the closed forms of dmftc.reference.site_moments_closed in tests/test_site_local.py); (3) phi = identity: the Monte Carlo ln Z_l, its
gradient and Hessian agree with deep_linear's closed form within Monte Carlo error, and the propagator with
deep_linear_propagator; (4) tanh: exact initial covariances by quadrature; (5) tanh vs Richardson-extrapolated
finite-width networks.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmftc.runtime.problem.deep_action import Layout, gather_local, observable_names, saddle_point_vector
from dmftc.runtime.problem.deep_action import log_z_local
from dmftc.runtime.engines.deep_linear import local_hessian, deep_linear_propagator
from dmftc.reference.standard_model import standard
from dmftc.runtime.engines.deep_propagator import deep_propagator, mc_saddle
from dmftc.reference.deep_autodiff import autodiff_estimator
from dmftc.runtime.sensitivities.local_estimator import LocalEstimator
from dmftc.reference.deep_autodiff import local_logf
from dmftc.errors import NumericalError, ParameterError
from models import assert_site_moments_equal_autodiff, odd_model  # noqa: E402  (tests/models.py)


# ------------------------------------------------------------------ 1. Newton steps vs a converged solver
def _site_problem(T, seed=3):
    """A causal base point of one layer (random PSD kernels, causal couplings, NONZERO hats so that every
    block of the Hessian is exercised), one source sample w0 and its exact causal solution x0."""
    rng = np.random.default_rng(seed)
    nt = T * (T + 1) // 2
    tril = np.tril_indices(T)

    def psd():
        A = rng.standard_normal((T, T))
        return (A @ A.T / T + 0.3 * np.eye(T))[tril]

    a = np.tril(rng.standard_normal((T, T)), -1) * 0.4
    b = np.tril(rng.standard_normal((T, T))) * 0.4
    v0 = np.concatenate([psd(), psd(), a.ravel(), b.ravel(), 0.1 * rng.standard_normal(2 * nt),
                         rng.standard_normal(T), 0.2 * rng.standard_normal(T)])
    return v0, rng.standard_normal(2 * T)


class _Converged:
    """Independent numpy implementation, batched over rows of v (B, nv) and w (B, 2T): Newton iterated to
    machine precision, ln F = -Q + src - ln|det(I - J)|."""

    def __init__(self, T, gamma, eta):
        self.T, self.gamma, self.eta = T, gamma, eta
        self.tril = np.tril_indices(T)
        self.strict = np.tril(np.ones((T, T)), -1)

    def parts(self, v):
        T, nt = self.T, self.T * (self.T + 1) // 2
        return np.split(v, np.cumsum([nt, nt, T * T, T * T, nt, nt, T, T])[:-1], axis=-1)

    def low(self, q):
        M = np.zeros(q.shape[:-1] + (self.T, self.T))
        M[..., self.tril[0], self.tril[1]] = q
        return M

    def couplings(self, v):
        T = self.T
        pp, gn, a, b, *_, D, _ = self.parts(v)
        sym = lambda M: M + np.swapaxes(M, -1, -2) - M * np.eye(T)  # noqa: E731
        eg = self.eta * self.gamma
        C = self.strict * eg * sym(self.low(pp)) * D[..., None, :] + a.reshape(a.shape[:-1] + (T, T))
        E = self.strict * eg * sym(self.low(gn)) * D[..., None, :] + b.reshape(b.shape[:-1] + (T, T))
        return C, E

    def causal_solution(self, v, w):
        T = self.T
        C, E = self.couplings(v)
        h, z = np.zeros(T), np.zeros(T)
        for t in range(T):
            d1 = 1 - np.tanh(h) ** 2
            h[t] = w[t] + C[t, :t] @ (d1[:t] * z[:t])
            z[t] = w[T + t] + E[t, : t + 1] @ np.tanh(h[: t + 1])
        return np.concatenate([h, z])

    def logf(self, v, w):
        T = self.T
        v, w = np.atleast_2d(v), np.atleast_2d(w)
        B = max(len(v), len(w))
        v, w = np.broadcast_to(v, (B, v.shape[1])), np.broadcast_to(w, (B, 2 * T))
        C, E = self.couplings(v)
        x = w.copy()
        zero = np.zeros(C.shape)
        for it in range(60):
            h, z = x[:, :T], x[:, T:]
            p = np.tanh(h)
            d1 = 1 - p * p
            d2 = -2 * p * d1
            R = x - w - np.concatenate([np.einsum("bts,bs->bt", C, d1 * z), np.einsum("bts,bs->bt", E, p)], axis=1)
            A = np.eye(2 * T) - np.block([[C * (d2 * z)[:, None], C * d1[:, None]], [E * d1[:, None], zero]])
            if np.abs(R).max() < 1e-15 and it > 2:
                break
            x = x - np.linalg.solve(A, R[..., None])[..., 0]
        *_, ph, gh, _, dh = self.parts(v)
        h, z = x[:, :T], x[:, T:]
        p = np.tanh(h)
        g = (1 - p * p) * z
        Q = np.einsum("bt,bts,bs->b", p, self.low(ph), p) + np.einsum("bt,bts,bs->b", g, self.low(gh), g)
        src = np.sum(dh * (z * p - z[:, :1] * p[:, :1]), axis=1) / self.gamma
        return -Q + src - np.linalg.slogdet(A)[1]


def _fd_hessian(fn, v0, h):
    """Central second differences of fn (batched over rows) at v0, all entries."""
    n = len(v0)
    I = np.eye(n) * h
    i, j = np.triu_indices(n)
    val = (fn(v0 + I[i] + I[j]) - fn(v0 + I[i] - I[j]) - fn(v0 - I[i] + I[j]) + fn(v0 - I[i] - I[j])) / (4 * h * h)
    H = np.zeros((n, n))
    H[i, j] = val
    H[j, i] = val
    return H


@pytest.mark.slow
def test_two_newton_steps_give_exact_derivatives_through_third_order():
    """x2 = N(N(x0)) with x0 = the exact solution at the base point: N(x*) = x*, N'(x*) = 0 give
    x1 - x* = O(eps^2), x2 - x* = O(eps^4), so the Hessian in v and the third derivatives d_v d_w d_w F (the
    Price block) of the 2-step integrand equal those of the implicit solution; one step gets only first order.
    Reference: central finite differences of an independent, fully converged numpy solver (tanh, T = 3)."""
    T, gamma, eta = 3, 1.3, 0.4
    v0, w0 = _site_problem(T)
    ref = _Converged(T, gamma, eta)
    x0 = ref.causal_solution(v0, w0)
    nv = len(v0)
    model = standard(gamma=gamma, eta=eta, y=1.0)
    kw = dict(T=T, activation="tanh", model=model, feature=model.features())     # the top layer
    assert abs(float(local_logf(jnp.asarray(v0), jnp.asarray(w0), jnp.asarray(x0), **kw)) - ref.logf(v0, w0)[0]) < 1e-13

    fn = lambda v: ref.logf(v, w0[None])  # noqa: E731
    H1, H2 = _fd_hessian(fn, v0, 4e-4), _fd_hessian(fn, v0, 2e-4)
    Hfd = H2 + (H2 - H1) / 3                                     # Richardson: O(h^4)
    scale = np.abs(Hfd).max()
    err = {}
    for k in (1, 2):
        H = np.asarray(jax.jit(jax.hessian(lambda v: local_logf(v, jnp.asarray(w0), jnp.asarray(x0), newton=k,
                                                                  **kw)))(jnp.asarray(v0)))
        err[k] = np.abs(H - Hfd).max() / scale
    assert err[2] < 1e-8, err
    assert err[1] > 1e-3, err            # the check can fail: one Newton step is visibly wrong

    # third order, d_v d_wa d_wb F, against Richardson-extrapolated finite differences (steps 2h, h)
    F = lambda v, w: np.exp(ref.logf(v, w))  # noqa: E731
    pa, pb = np.tril_indices(2 * T)

    def fd3(h):
        Iv, Iw = np.eye(nv) * h, np.eye(2 * T) * h
        q, i = np.meshgrid(np.arange(len(pa)), np.arange(nv), indexing="ij")
        q, i = q.ravel(), i.ravel()
        tot = 0.0
        for si in (1, -1):
            for sa in (1, -1):
                for sb in (1, -1):
                    tot = tot + si * sa * sb * F(v0 + si * Iv[i], w0 + sa * Iw[pa[q]] + sb * Iw[pb[q]])
        return (tot / (8 * h ** 3)).reshape(len(pa), nv)

    D1, D2 = fd3(4e-3), fd3(2e-3)
    D3 = D2 + (D2 - D1) / 3
    scale3 = np.abs(D3).max()
    Fj = lambda v, w: jnp.exp(local_logf(v, w, jnp.asarray(x0), **kw))  # noqa: E731
    Hw = lambda v: jax.hessian(Fj, argnums=1)(v, jnp.asarray(w0))[pa, pb]  # noqa: E731
    J3 = np.asarray(jax.jit(jax.jacfwd(Hw))(jnp.asarray(v0)))
    assert np.abs(J3 - D3).max() / scale3 < 1e-5        # (one Newton step: ~0.1)


# ------------------------------------------------------------------ 1b. the one march = the numpy oracle
@pytest.mark.parametrize("activation,odd,weighted", [("tanh", False, False), ("sin(h)", True, True),
                                                     ("relu", False, True)])
def test_group_saddle_is_the_one_march_and_equals_the_numpy_oracle(activation, odd, weighted):
    """mc_saddle (the deep march of dmftc.runtime.march.deep_dmft with the direct readout and the paths kept) equals
    the path-by-path numpy march of dmftc.reference.deep_marches on the same paths and weights: saddle, K and
    every per-path source and field.  Standard network and the odd model; a kink in phi' too, where the march's
    tangents are pathwise (the delta of phi'' dropped: the oracle's phi'' at width 0)."""
    from dmftc.runtime.problem.activation import as_activation
    from dmftc.reference.deep_marches import numpy_mc_saddle

    L, T, S = 2, 5, 200
    rng = np.random.default_rng(11)
    xi = rng.standard_normal((2, L, S, T))
    w = rng.uniform(0.3, 1.7, S) if weighted else None
    kw = dict(activation=activation, L=L, T=T, xiu=xi[0], xir=xi[1], weights=w)
    kw.update(model=odd_model()) if odd else kw.update(gamma=0.8, y=-0.6, eta=0.2)
    oracle = dict(kw, activation=as_activation(activation, 0.0)) if activation == "relu" else kw
    (a, fa), (b, fb) = mc_saddle(**kw), numpy_mc_saddle(**oracle)
    for k in ("Delta", "f", "K", "Phi", "G", "Rphi", "Rg"):
        x, y = np.asarray(getattr(a, k)), np.asarray(getattr(b, k))
        assert np.abs(y).max() > 1e-3, k                 # every quantity is exercised
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-9 * np.abs(y).max(), err_msg=k)
    for x, y in zip(fa.w + fa.x, fb.w + fb.x):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-8 * np.abs(y).max())
    if weighted:                                         # the weights matter
        c, _ = mc_saddle(**(kw | {"weights": None}))
        assert np.abs(c.Delta - a.Delta).max() > 1e-4


# ------------------------------------------------------------------ 2. structured estimator = brute force
@pytest.mark.slow
def test_structured_estimator_equals_brute_force_autodiff():
    """At the saddle (causal couplings, zero hats) the reduced-variable estimator (only T^2 anti-causal
    Hessian-vector products, closed-form dx/dc, chain rule to v) gives the same ln Z_l, gradient and Hessian
    as jax.hessian of sum_n F_n over all local variables, on the same samples, for every layer kind.
    (slow: ~40 s, almost all of it compiling the brute-force estimator.)"""
    L, T, S = 2, 3, 160
    kw = dict(L=L, gamma=1.0, y=1.0, eta=0.3, T=T)
    xi = np.random.default_rng(0).standard_normal((2, L, S, T))
    sad, fields = mc_saddle(activation="tanh", xiu=xi[0], xir=xi[1], **kw)
    lay = Layout(L, T)
    x0 = saddle_point_vector(sad)
    for l in range(1, L + 1):
        v, idx = gather_local(jnp.asarray(x0), lay, l)
        res = [autodiff_estimator(T, "tanh", l > 1, l < L, method=m).log_z(
            np.asarray(v), fields.w[l - 1], fields.x[l - 1], top=float(l == L),
            model=standard(gamma=1.0, eta=0.3, y=1.0))
            for m in ("struct", "full")]
        (z1, g1, h1), (z2, g2, h2) = res
        assert abs(z1) < 1e-14 and abs(z2) < 1e-14
        np.testing.assert_allclose(g1, g2, rtol=0, atol=1e-13)
        np.testing.assert_allclose(h1, h2, rtol=0, atol=1e-12 * np.abs(h2).max())
        assert np.abs(h2).max() > 0.1


# The odd model's couplings, readout and boundaries run in the default suite through the spec-built nonstandard
# gradient field (tests/test_deep_gradient_field.py) and test_deep_linear_correction; its own L = 3 case is slow.
@pytest.mark.parametrize("activation,odd", [("tanh", False), pytest.param("tanh", True, marks=pytest.mark.slow),
                                            pytest.param("erf", False, marks=pytest.mark.slow)])
def test_closed_form_site_moments_equal_autodiff_estimator(activation, odd):
    """Every sum of dmftc.runtime.sensitivities.site_moments (first, second and third source derivatives from the program, Price block
    summed over paths and times in one matrix product) equals the autodiff structured estimator on the same
    paths, for the three layer kinds of L = 3 (r-block varying, both blocks, u-block varying); for the standard
    network and for a model with other couplings, readout and boundaries."""
    assert_site_moments_equal_autodiff(activation, odd_model() if odd else standard(gamma=1.3, y=1.0, eta=0.4))


def test_causal_blocking_of_the_price_products_is_exact():
    """The Price-block products are split by output time (o < hi needs only s, j, a, b < hi); on arbitrary
    paths (T = 9, both source blocks varying) the blocked sums equal the single dense product to round-off."""
    from dmftc.runtime.problem.activation import as_activation
    from dmftc.runtime.sensitivities.site_local import local_map
    from dmftc.runtime.sensitivities.site_moments import SiteMoments

    T, S = 9, 40
    rng = np.random.default_rng(1)
    C, E = np.tril(rng.standard_normal((T, T)), -1) * 0.3, np.tril(rng.standard_normal((T, T))) * 0.3
    W, X = rng.standard_normal((S, 2 * T)), rng.standard_normal((S, 2 * T))
    tt, ss = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    anti = np.concatenate([(tt * T + ss)[ss >= tt], T * T + (tt * T + ss)[ss > tt]])
    t0, t1 = np.tril_indices(T)
    kw = dict(T=T, local=local_map(as_activation("tanh")), pa=np.concatenate([t0, T + t0]), pb=np.concatenate([t1, T + t1]), anti=anti)
    blocked, dense = SiteMoments(**kw), SiteMoments(**kw)
    assert len(blocked.s_blocks) > 1
    dense.s_blocks = [(0, T)]
    a, b = (sm.moments(C, E, W, X, feature=(1.0, -1.0)) for sm in (blocked, dense))
    assert np.abs(b[7]).max() > 1.0
    for x, y in zip(a, b):
        assert np.abs(x - y).max() <= 1e-13 * max(np.abs(y).max(), 1.0)


def test_price_blocks_by_parts_are_unbiased_and_less_noisy():
    """The Price blocks (derivatives in the source covariances) of a steep activation, tanh(2 h), L = 2, T = 4,
    eta = 0.1: with Gaussian integration by parts on the sources' leading eigen-directions (the default) and
    all pathwise (price_tol None), on the same 8000 paths in 40 independent batches.  Equal in expectation
    (paired t <= 5 on every entry that changes, Student t39), only the Price entries change, and their batch
    spread is smaller by parts (the reason for it: the third and fourth derivatives of phi drop out)."""
    from dmftc.runtime.problem.activation import as_activation
    from dmftc.runtime.numerics.sampling import source_normals

    L, T, batches, per = 2, 4, 40, 200
    model = standard(gamma=1.0, eta=0.1, y=1.0)
    act = as_activation("tanh(2 * h)")
    xi = source_normals("random", np.random.SeedSequence(7), L, batches * per, T)
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0], xir=xi[1], model=model)
    x0, lay = saddle_point_vector(sad), Layout(L, T)
    for l in range(2, L + 1):        # layer 1 has no varying forward source: nothing by parts there
        v, _ = gather_local(jnp.asarray(x0), lay, l, phi0=model.phi0, g_top=model.g_top)
        by_parts = LocalEstimator(T=T, activation=act, vary_u=l > 1, vary_r=l < L)
        pathwise = LocalEstimator(T=T, activation=act, vary_u=l > 1, vary_r=l < L)
        pathwise.price_tol = None
        assert by_parts.price_tol is not None
        H = {}
        for name, est in (("parts", by_parts), ("path", pathwise)):
            H[name] = np.array([est.log_z(np.asarray(v), fields.w[l - 1][b * per:(b + 1) * per],
                                          fields.x[l - 1][b * per:(b + 1) * per], top=float(l == L), model=model)[2]
                                for b in range(batches)])
        D = H["parts"] - H["path"]
        scale = np.abs(H["path"].mean(0)).max()
        changed = np.abs(D).max(axis=0) > 1e-12 * scale
        price = np.zeros_like(changed)
        price[by_parts.pos, :] = True
        price[:, by_parts.pos] = True
        assert changed.sum() > 20 and not (changed & ~price).any(), l
        t = D.mean(0)[changed] / (D.std(0, ddof=1)[changed] / math.sqrt(batches))
        assert np.abs(t).max() <= 5, (l, np.sort(np.abs(t))[-5:])
        spread = {k: float(np.sum(h.var(axis=0, ddof=1)[changed])) for k, h in H.items()}
        assert spread["parts"] < 0.5 * spread["path"], (l, spread)


# ------------------------------------------------------------------ 3. phi = identity
LIN = dict(L=2, gamma=1.0, y=1.0, eta=0.2, T=4)


@pytest.mark.slow          # covered exactly (no sampling error) by the cubature test below
def test_linear_monte_carlo_log_z_matches_closed_form():
    """phi = identity at the exact linear saddle, sources drawn from N(0, Sw): value and gradient of ln Z_l and
    every Hessian entry agree with -1/2 ln det [[-Q, M^T], [M, Sw]].  Entries without sampling noise (e.g. the
    A-B and A-Delta blocks, the source-source block 0) agree to round-off; the rest within Monte Carlo error
    over 16 independent groups (|z| <= 4 for 99% of them, all <= 6: ~3000 correlated entries, Student t15)."""
    from dmftc.reference.deep_marches import numpy_linear_saddle

    L, T, gamma, eta = LIN["L"], LIN["T"], LIN["gamma"], LIN["eta"]
    ex = numpy_linear_saddle(**LIN)         # the oracle's saddle carries the fields' coefficient maps
    model = standard(gamma=gamma, eta=eta, y=LIN["y"])
    lay = Layout(L, T)
    x0 = saddle_point_vector(ex)
    rng = np.random.default_rng(5)
    groups, S = 16, 400
    for l in range(1, L + 1):
        v, idx = gather_local(jnp.asarray(x0), lay, l)
        zero = np.zeros((T, T))
        Sw = np.block([[ex.phi(l - 1), zero], [zero, ex.g(l + 1)]])
        ev, U = np.linalg.eigh(Sw)
        root = U * np.sqrt(np.clip(ev, 0, None))
        Hm, Zm = ex.maps[l - 1]                                  # exact fields as linear maps of the sources
        est = LocalEstimator(T=T, activation="linear", vary_u=l > 1, vary_r=l < L)
        runs = []
        for _ in range(groups):
            w = rng.standard_normal((S, 2 * T)) @ root.T
            runs.append(est.log_z(np.asarray(v), w, w @ np.vstack([Hm, Zm]).T, top=float(l == L),
                                  model=model))
        f = lambda q: log_z_local(q, model, float(l == L), T=T)  # noqa: E731
        value, grad = float(f(v)), np.asarray(jax.jit(jax.grad(f))(v))
        hess = np.asarray(local_hessian(T, model)(v, float(l == L)))
        assert all(abs(r[0]) < 1e-13 for r in runs) and abs(value) < 1e-13       # ln Z_l = 0 at the saddle
        keep = idx >= 0
        for k, ref in ((1, grad), (2, hess)):
            est_k = np.array([r[k] for r in runs])
            m, se = est_k.mean(0), est_k.std(0, ddof=1) / math.sqrt(groups)
            mask = np.outer(keep, keep) if k == 2 else keep
            scale = np.abs(ref).max()
            det = se < 1e-12 * scale
            assert np.abs(m - ref)[det & mask].max() < 1e-10 * scale, (l, k)
            z = (np.abs(m - ref) / np.where(det, 1.0, se))[mask & ~det]
            assert np.mean(z > 4) < 0.01 and z.max() < 6, (l, k, np.sort(z)[-5:])


@pytest.fixture(scope="module")
def linear_mc():
    return deep_propagator(activation="linear", samples=8000, groups=8, seed=1, **LIN)


@pytest.mark.slow          # covered exactly (no sampling error) by the cubature test below
def test_linear_propagator_matches_deep_linear(linear_mc):
    """The Monte Carlo propagator with phi = identity vs the closed-form deep_linear_propagator: N Var of Delta,
    K and every kernel diagonal within 4 standard errors (8 groups) at every time; stationarity to round-off."""
    P, R = linear_mc, deep_linear_propagator(**LIN)
    d = P.diagnostics
    assert d["stationarity"] < 1e-12 and d["asymmetry"] < 1e-10 and d["psd_within_mc"]
    for n in observable_names(LIN["L"]):
        se = P.se_var(n)
        exact = R.var(n) == 0                                  # Delta(0) = y
        assert np.all(np.abs(P.var(n)[exact]) < 1e-10), n
        z = np.abs(P.var(n) - R.var(n))[~exact] / se[~exact]
        assert z.max() <= 4, (n, z.round(2))
        assert se.max() < 0.1 * R.var(n).max(), n              # and the test has power


@pytest.mark.parametrize("L,T,odd", [(3, 6, False), (2, 5, True), pytest.param(2, 10, False, marks=pytest.mark.slow),
                                     pytest.param(3, 10, False, marks=pytest.mark.slow),
                                     pytest.param(3, 6, True, marks=pytest.mark.slow)])
def test_linear_propagator_is_exact_with_a_degree_5_gaussian_cubature(L, T, odd):
    """For phi = identity every sum behind the Hessian (kernels, fourth moments, responses, Price terms) is a
    Gaussian moment of degree <= 4.  Running the SAME estimator (march, the program's site derivatives,
    assembly, inverse) on the points of a degree-5 cubature rule instead of random paths must therefore give
    the exact propagator: it equals the autodiff Hessian of the closed-form log-det action (dmftc.runtime.engines.deep_linear)
    to round-off, for every block of Delta, K, Phi[l], G[l] (the issue asks for 1e-6 relative); for the standard
    network and for a model with nonlinear couplings, another readout, boundaries and K (both codes read the
    DeepModel; they share only the Layout and the final solve)."""
    from dmftc.runtime.engines.deep_propagator import group_propagator
    from dmftc.reference.deep_autodiff import gaussian_cubature5

    kw = dict(L=L, T=T, model=odd_model() if odd else standard(gamma=1.2, y=1.0, eta=0.2))
    pts, w = gaussian_cubature5(2 * T)
    assert abs(w.sum() - 1) < 1e-14 and abs(w @ pts[:, 0] ** 4 - 3) < 1e-12
    xiu, xir = np.repeat(pts[None, :, :T], L, axis=0), np.repeat(pts[None, :, T:], L, axis=0)
    P = group_propagator(activation="linear", xiu=xiu, xir=xir, weights=w, **kw)
    R = deep_linear_propagator(**kw)
    assert P.diagnostics["stationarity"] < 1e-12
    np.testing.assert_allclose(P.saddle.Delta, R.saddle.Delta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(P.saddle.K, R.saddle.K, rtol=0, atol=1e-12)
    for a in observable_names(L):
        for b in observable_names(L):
            scale = np.abs(R.sigma[a][b]).max()
            assert np.abs(P.sigma[a][b] - R.sigma[a][b]).max() <= 1e-9 * max(scale, 1e-3), (a, b)


# ------------------------------------------------------------------ 4. tanh: exact initial covariances
TANH_SMALL = dict(L=2, gamma=1.0, y=1.0, eta=0.3, T=3)


@pytest.fixture(scope="module")
def tanh_small():
    return deep_propagator(activation="tanh", samples=16000, groups=16, seed=4, **TANH_SMALL)


def test_tanh_initial_covariances_match_quadrature(tanh_small):
    """At t = 0 (L = 2): h^1 = W^0 ~ N(0, 1) iid, h^2 | layer 1 ~ N(0, Phi1) iid with Phi1 = Phi[1](0,0), w iid,
    so by the law of total covariance (E_v: Gaussian average at variance v, P1 = E_1 tanh^2)
        N Var Phi[1] = V1 = Var_1(tanh^2),   N Var Phi[2] = Var_P1(tanh^2) + (dE_v tanh^2/dv)^2 V1,
        N Var G[2] = 3 E_P1 d^4 - (E_P1 d^2)^2 + (dE_v d^2/dv)^2 V1   (d = tanh'),  and the cross terms.
    The dE/dv terms enter only through the source covariance of layer 2 (Price block).  16 groups: the G[2]
    entries carry w^4 moments, and with 8 groups their group standard error was seen to be 3x too small."""
    P = tanh_small
    x, wq = np.polynomial.hermite_e.hermegauss(160)
    wq = wq / wq.sum()
    E = lambda fn, var: float(np.sum(wq * fn(math.sqrt(var) * x)))  # noqa: E731
    dE = lambda fn, var, e=1e-5: (E(fn, var + e) - E(fn, var - e)) / (2 * e)  # noqa: E731
    t2 = lambda h: np.tanh(h) ** 2  # noqa: E731
    d2 = lambda h: (1 - np.tanh(h) ** 2) ** 2  # noqa: E731
    P1 = E(t2, 1.0)
    V1 = E(lambda h: t2(h) ** 2, 1.0) - P1 ** 2
    exact = {("Phi[1]", "Phi[1]"): V1,
             ("Phi[2]", "Phi[2]"): E(lambda h: t2(h) ** 2, P1) - E(t2, P1) ** 2 + dE(t2, P1) ** 2 * V1,
             ("Phi[1]", "Phi[2]"): dE(t2, P1) * V1,
             ("G[2]", "G[2]"): 3 * E(lambda h: d2(h) ** 2, P1) - E(d2, P1) ** 2 + dE(d2, P1) ** 2 * V1,
             ("G[2]", "Phi[1]"): dE(d2, P1) * V1,
             ("G[2]", "Phi[2]"): E(lambda h: d2(h) * t2(h), P1) - E(d2, P1) * E(t2, P1)
             + dE(d2, P1) * dE(t2, P1) * V1}
    for (a, b), val in exact.items():
        m, se = P[a][b][0, 0], P.se[a][b][0, 0]
        assert abs(m - val) <= 4 * se and se < 0.1 * abs(val), (a, b, m, val, se)


# ------------------------------------------------------------------ 5. tanh vs finite-width networks
def _compare_with_networks(P, params, E):
    from dmftc.validation.deep_ensemble import deep_truth

    truth = deep_truth(activation="tanh", N=256, E=E, seed=11, extrapolate=True, **params)
    assert P.diagnostics["stationarity"] < 1e-12 and P.diagnostics["psd_within_mc"]
    # resolved: the estimated bias of solving with noisy Hessians is far below the error bar (module solve_bias)
    assert max(P.diagnostics["solve_bias_vs_se"].values()) < 0.5, P.diagnostics["solve_bias_vs_se"]
    worst = {}
    for n in observable_names(params["L"]):
        se = np.hypot(P.se_var(n), truth.se_nvar[n])
        # where the exact N Var is zero (Delta at t = 0) both sides are round-off, whose size depends on XLA's
        # fusion choices: no z there, both must be round-off
        tiny = 1e-9 * np.abs(truth.nvar[n]).max()
        ok = se > tiny
        assert np.all(np.abs(P.var(n)[~ok]) < tiny) and np.all(np.abs(truth.nvar[n][~ok]) < tiny), n
        z = np.abs(P.var(n) - truth.nvar[n])[ok] / se[ok]
        assert z.max() <= 4, (n, z.round(2))
        worst[n] = z.max()
    return worst


def test_tanh_propagator_matches_finite_width_networks_short(tanh_small):
    """tanh, L = 2, T = 3, eta = 0.3: N Var of Delta, K, Phi[l](t,t), G[l](t,t) vs Richardson-extrapolated
    (N = 256, 512) ensembles of real networks (4000 members each), within 4 combined standard errors."""
    _compare_with_networks(tanh_small, TANH_SMALL, 4000)


def test_unresolved_propagator_says_its_error_bars_understate_the_error():
    """A smooth activation with large higher derivatives, sqrt(2) h Phi(h / 0.4) (a smoothed relu), L = 2, T = 6,
    eta = 0.1: with 1000 paths per group the group-mean N Var is far from networks of that activation (measured:
    K(t = 5) 6.9e4 +- 4.1e4 against 167 +- 9), and the standard errors do not show it.  The pooled-Hessian bias
    estimate does (measured: up to 4.9 standard errors, 1.0 for K), and the solution's summary warns.  Whenever the networks
    disagree beyond 4 standard errors the flag must be up."""
    from dmftc.deep import solve_deep
    from dmftc.runtime.results.solution import solve_bias_warning
    from dmftc.validation.deep_ensemble import deep_truth

    act = "sqrt(2) * h * (1 + erf(h / (0.4 * sqrt(2)))) / 2"
    kw = dict(L=2, gamma=1.0, y=1.0, eta=0.1, T=6)
    sol = solve_deep(activation=act, samples=4000, propagator_samples=4000, propagator_groups=4, **kw)
    truth = deep_truth(activation=act, N=128, E=3000, seed=3, extrapolate=True, **kw)
    worst = 0.0
    for n in observable_names(2):
        se = np.hypot(sol.var_stderr(n), truth.se_nvar[n])
        ok = se > 0
        worst = max(worst, float((np.abs(sol.var(n) - truth.nvar[n])[ok] / se[ok]).max()))
    vs = sol.info["propagator_solve_bias_vs_se"]
    assert worst <= 4 or max(vs.values()) > 1, (worst, vs)
    assert max(vs.values()) > 1, vs
    assert "error bars understate the error" in sol.summary()
    assert solve_bias_warning({"propagator_solve_bias_vs_se": {n: 0.3 for n in vs}}) is None


def test_solve_bias_warning_names_the_observable_most_off():
    """Among the observables whose estimated solve bias exceeds its error bar, the warning names the one with the
    largest bias relative to its peak, not the largest ratio (measured, h + 0.5 sin(2 h), L = 2, T = 10, gamma =
    1.8, 32 groups of 512 paths: Delta 3.0 standard errors but 1% of its peak, K and G[2] 2.9-3.0 and 23%), and
    lists the rest."""
    from dmftc.runtime.results.solution import solve_bias_warning

    msg = solve_bias_warning({"propagator_solve_bias_vs_se": {"Delta": 3.0, "K": 2.9, "G[1]": 0.5},
                              "propagator_solve_bias": {"Delta": 0.01, "K": 0.23, "G[1]": 0.4}})
    assert "N Var K by about 23% of its peak, 2.9 times" in msg and "Delta 1%" in msg and "G[1]" not in msg


@pytest.mark.slow
@pytest.mark.parametrize("act, unresolved", [("tanh(2 * h)", False), ("tanh(3 * h)", True), ("sin(2 * h)", True),
                                             ("sqrt(2) * h * (1 + erf(h / (0.8 * sqrt(2)))) / 2", False),
                                             ("tanh(h)", False), ("sin(h)", False)])
def test_solve_bias_flag_on_activations_of_several_steepness(act, unresolved):
    """L = 2, T = 6, eta = 0.1, 4000 paths in 4 groups, against networks of the same activation (N = 128/256,
    E = 3000).  Measured with the Price blocks integrated by parts (largest error over the observables
    relative to the networks' peak, largest z, bias flag): tanh(3 h) 49%, 4.1, 2.1 and sin(2 h) 94%, 2.5, 10:
    the flag must be up.  tanh(2 h) 13%, 2.6, 0.83, sqrt(2) h Phi(h / 0.8) 12%, 2.2, 0.57, tanh(h) 10%, 1.7,
    0.02 and sin(h) 10%, 1.9, 0.05 (the networks' own error is about 10% of peak here): it must be down.
    (All pathwise, the first four were off by 1.3x, 630x, 270x and 22% and all flagged.)  And whenever theory
    and networks differ by more than 4 combined standard errors, it must be up."""
    from dmftc.validation.deep_ensemble import deep_truth

    kw = dict(L=2, gamma=1.0, y=1.0, eta=0.1, T=6)
    truth = deep_truth(activation=act, N=128, E=3000, seed=3, extrapolate=True, **kw)
    P = deep_propagator(activation=act, samples=4000, groups=4, **kw)
    off = max(float(np.abs(P.var(n) - truth.nvar[n]).max() / np.abs(truth.nvar[n]).max())
              for n in observable_names(2))
    z = 0.0
    for n in observable_names(2):
        se = np.hypot(P.se_var(n), truth.se_nvar[n])
        ok = se > 0
        z = max(z, float((np.abs(P.var(n) - truth.nvar[n])[ok] / se[ok]).max()))
    flag = max(P.diagnostics["solve_bias_vs_se"].values())
    assert (flag > 1) == unresolved, (off, z, flag)
    assert z <= 4 or flag > 1, (off, z, flag)
    if unresolved:
        assert off > 0.15, (off, z, flag)          # the flag marks results that are really off


TANH = dict(L=2, gamma=1.0, y=1.0, eta=0.1, T=6)


@pytest.mark.slow
def test_tanh_propagator_matches_finite_width_networks():
    """The same at T = 6, eta = 0.1 (16000 source paths in 8 groups, ensembles of 8000 members): ~4 minutes on
    2 cores, hence slow."""
    _compare_with_networks(deep_propagator(activation="tanh", samples=16000, groups=8, seed=2, **TANH), TANH, 8000)


# ------------------------------------------------------------------ errors
def test_bad_input_and_divergence_are_reported():
    kw = dict(L=2, gamma=1.0, y=1.0, eta=0.1, T=2, samples=64, groups=2)
    for bad in (dict(activation="undefined(h)"), dict(activation="tanh", L=0), dict(activation="tanh", eta=-1.0),
                dict(activation="tanh", groups=1), dict(activation="tanh", gamma=0.0),
                dict(activation="tanh", T=2.5), dict(activation="tanh", samples=3)):
        with pytest.raises(ParameterError):
            deep_propagator(**{**kw, **bad})
    with pytest.raises(NumericalError):
        deep_propagator(**{**kw, "activation": "linear", "eta": 1e50, "gamma": 10.0, "T": 8})
    v0, w0 = _site_problem(2)
    est = LocalEstimator(T=2, activation="tanh", vary_u=False, vary_r=True)
    with pytest.raises(ParameterError, match="causal"):                 # hats nonzero: not a saddle
        est.log_z(v0, w0[None], w0[None], top=1.0, model=standard(gamma=1.0, eta=0.1, y=1.0))


def test_kinked_activation_is_extrapolated_in_the_delta_width():
    """softsign (phi''' holds -4 delta(h)): each group runs at widths w and w/2 on the same paths and reports
    2 Sigma(w/2) - Sigma(w); without extrapolation the two widths give the two runs."""
    kw = dict(activation="h / (1 + abs(h))", L=2, gamma=1.0, y=1.0, eta=0.1, T=2, samples=64, groups=2, seed=4)
    ext = deep_propagator(**kw)
    at_w = deep_propagator(**kw, dirac_extrapolate=False)
    at_half = deep_propagator(**kw, dirac_width=0.05, dirac_extrapolate=False)
    for n in ("K", "G[1]", "Delta"):
        np.testing.assert_allclose(ext.var(n), 2 * at_half.var(n) - at_w.var(n), rtol=1e-10, atol=1e-14)
    assert ext.diagnostics["dirac_extrapolated"] and not at_w.diagnostics["dirac_extrapolated"]
    assert ext.diagnostics["dirac_shift"]["G[1]"] > 0
    smooth = deep_propagator(**{**kw, "activation": "sin(h)"})
    assert not smooth.diagnostics["dirac_extrapolated"] and "dirac_shift" not in smooth.diagnostics
