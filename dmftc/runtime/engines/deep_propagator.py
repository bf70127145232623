"""Finite-width propagator of DEEP NONLINEAR networks: Hessian of the discrete-time MSR action with each
layer's single-site log-partition function ln Z_l estimated by Monte Carlo and differentiated by JAX.

Same route as :mod:`dmftc.runtime.engines.deep_linear` (the engine of :mod:`dmftc.runtime.problem.deep_action`: order parameters,
bilinear part S_0 = sum_{t>=s}(Phi_hat Phi + G_hat G) + sum_t Delta_hat (Delta - y) - sum_l Tr(A^l B^l), assembly,
inversion and mapping to Delta, K, Phi[l](t,t), G[l](t,t)); only ln Z_l changes.

Single-site problem of layer l
------------------------------
Fields x = (h(0..T-1), z(0..T-1)), sources w = (u, r) ~ N(0, Sw), Sw = diag(Phi[l-1], G[l+1]), and

    x = w + F(x),   F_h(t) = sum_s C(t,s) g(s),  F_z(t) = sum_s E(t,s) phi(h(s)),  g = a(h) z + b(h),
    C = A^{l-1} + [s<t] k_h(Phi[l-1](t,s), Delta(s)),   E = B^l + [s<t] k_z(G[l+1](t,s), Delta(s))

with the coupling coefficients k_h, k_z, the readout, the boundary kernels and K of a
:class:`dmftc.runtime.problem.deep_model.DeepModel` (a compiled spec's, or the standard network's k = eta gamma Delta q,
Delta = y - (E_t - E_0) / gamma, which the formulas below write out)

(C, E general T x T: their anti-causal entries are variables of the action).  The MSR integral is
Z_l = int dx dx_hat Dw exp(i x_hat.(x - w - F(x)) - Q(x)); integrating x_hat gives the delta function
delta(x - w - F(x)), and integrating it over x (change of variables w = x - F(x), dw = |det(I - J)| dx,
J = dF/dx) leaves

    Z_l = E_w[ exp(-Q(x*)) / |det(I - J(x*))| ],     x* = w + F(x*),
    Q(x) = sum_{t>=s} [Phi_hat(t,s) phi(h(t)) phi(h(s)) + G_hat(t,s) g(t) g(s)]
           - [l = L] sum_t Delta_hat(t) (z(t) phi(h(t)) - z(0) phi(h(0))) / gamma.

The 1/det is the Jacobian of the constraint: it equals 1 whenever C, E are causal (J is strictly lower
triangular in the order h(0), z(0), h(1), z(1), ...: h(t) reads z(s<t), z(t) reads h(s<=t)), but its
derivatives in the anti-causal directions are not zero: d(-ln det(I-J))/dC(t,s) = <dg(s)/du(t)>, the response
that pairs A with B in -Tr(A B).  Signs as in deep_linear: Q enters as exp(-Q) (the hats are conjugate to the
kernels with +Phi_hat Phi in S), and the Delta_hat source carries +z phi / gamma, so dS/dDelta_hat = 0 gives
Delta = y - (<z phi>(t) - <z phi>(0)) / gamma.  For phi = identity the integral is Gaussian and equals
deep_linear's closed form -1/2 ln det [[-Q, M^T], [M, Sw]] (checked in the tests, value, gradient, Hessian).

Estimator
---------
ln Z_l of each layer kind and its derivatives: :mod:`dmftc.runtime.sensitivities.local_estimator` (derivatives in the
couplings pathwise, in the source covariances by Price's theorem, per-path sums from the JAX derivatives of the
spec's single-site program at each time step, :mod:`dmftc.runtime.sensitivities.site_local` and :mod:`dmftc.runtime.sensitivities.site_moments`).

Saddle point
------------
Each group marches the exact discrete-time DMFT with its own samples (the one march of
:mod:`dmftc.runtime.march.deep_dmft`, ``march_paths``: sources from causally extended Cholesky factors of its own
kernels, responses from forward tangents, the readout average as a plain mean over the paths), and uses the
SAME samples (kept by the march) for ln Z_l.  With f(t) = (<z phi>(t) - <z phi>(0)) / gamma estimated by the same
samples, every first derivative of the Monte Carlo action vanishes at that saddle to round-off (checked:
``diagnostics['stationarity']``).  Each group is a complete estimate (saddle, Hessian, propagator by the
causal solve of :mod:`dmftc.runtime.solvers.causal_solve`); the result is the mean over groups and ``se`` their standard
error std / sqrt(groups).  The groups' standard normals are by default randomised quasi-Monte Carlo (an
independent scrambled Sobol' set per group and layer, :mod:`dmftc.runtime.numerics.sampling`), several times more
accurate than pseudo-random paths at the same count; ``sampler='random'`` gives the latter.
"""
from __future__ import annotations

import dataclasses
import math
import time as _time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla

from dmftc.runtime.problem.deep_action import Layout, gather_local, saddle_of_march, saddle_point_vector
from dmftc.runtime.march.deep_dmft import march_kernels, march_paths, runs_site
from dmftc.runtime.problem.options import check_integer
from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.solvers.causal_solve import assemble_blocks, causal_propagator
from dmftc.progress import Progress
from dmftc.runtime.sensitivities.local_estimator import estimator
from dmftc.runtime.solvers.solve_bias import Pool, bias_report
from dmftc.jax_setup import make_room
from dmftc.runtime.problem.deep_model import DeepModel
from dmftc.runtime.problem.standard_spec import model_and_activation
from dmftc.runtime.numerics.sampling import check_sampler, source_normals


__all__ = ["deep_propagator", "DeepPropagator", "mc_saddle", "group_propagator", "FEATURE_FACTOR", "feature_paths"]

# Default feature paths per derivative path (deep_propagator's feature_samples): the features' covariance carries
# most of the noise and costs a march per path, the derivatives about a hundred (tanh, L = 2, T = 30: 16 times
# the paths cut the worst standard error of N Var from 7.8% to 1.9% of its peak for 4% more time; 64 times gave
# 1.9% as well, the derivatives' own noise then dominating; docs/how-it-works.md)
FEATURE_FACTOR = 16


def feature_paths(feature_samples: int | None, samples: int, name: str = "feature_samples",
                  of: str = "samples") -> int:
    """The paths whose features give the hat-hat block of each ln Z_l: ``feature_samples``, at least ``samples``
    (``name`` and ``of``: the two options' names in the error), or by default ``FEATURE_FACTOR`` times ``samples``."""
    if feature_samples is None:
        return FEATURE_FACTOR * samples
    return check_integer(f"{name} (at least {of})", feature_samples, samples)

# ----------------------------------------------------------------------------------------------
# Monte Carlo saddle point: the one deep march (dmftc.runtime.march.deep_dmft) with the direct readout, paths kept
# ----------------------------------------------------------------------------------------------
@dataclass
class MarchFields:
    """Per-layer samples of one group: sources w = (u, r) and fields x = (h, z), each (S, 2T); ``factors``: per
    layer the sources' causal Cholesky factors (Cu, Cr), each (T, T), with which w = (Cu xi_u, Cr xi_r)."""
    w: list
    x: list
    march: str = "structured"             # which march made them: 'site program' or 'structured'
    factors: list | None = None


def mc_saddle(*, activation, L, T, xiu, xir, weights=None, model=None, gamma=None, y=None, eta=None, points=1):
    """Discrete-time DMFT march of the model's single-site processes on given standard normals xiu, xir
    (L, S, T) (sources u^l = chol(Phi[l-1]) xi, r^l = chol(G[l+1]) xi, extended causally): the march of
    :func:`dmftc.runtime.march.deep_dmft.march_paths`.  Returns (deep_action.Saddle, MarchFields).  ``points``: P of a
    spec on several training points (T its (time, point) steps; the spec's own program only).
    All averages are (weighted) means over these S paths, the readout's included:
    Delta(t) = y0 + c_t <z^L phi(h^L)>(t) + c_0 <z^L phi(h^L)>(0) (module deep_model), f = y0 - Delta.
    A compiled spec's model (``model.module``) marches the spec's own single-site program
    (:mod:`dmftc.runtime.march.site_march`) when ``activation`` is that spec's; otherwise the model's structured kernels."""
    model, activation = model_and_activation(model, activation, gamma, y, eta, L=L)
    kern, prm = march_kernels(activation, model, L)
    if points > 1 and not runs_site(kern):
        raise ParameterError("several training points need a compiled spec's own single-site program")
    out = march_paths(kern, prm, xiu, xir, weights, points=points)
    sad = saddle_of_march(model, out, L, T)
    fields = MarchFields([np.concatenate([out["u"][l], out["r"][l]], axis=1) for l in range(L)],
                     [np.concatenate([out["h"][l], out["z"][l]], axis=1) for l in range(L)],
                     "site program" if runs_site(kern) else "structured",
                     [(out["Cu"][l], out["Cr"][l]) for l in range(L)])
    return sad, fields


# ----------------------------------------------------------------------------------------------
# propagator
# ----------------------------------------------------------------------------------------------
@dataclass
class DeepPropagator:
    """Group-mean propagator.  ``P[a][b]`` (T,T) = lim N Cov(a(t), b(s)) for a, b in Delta, K, Phi[l], G[l]
    (time-diagonal kernels); ``se[a][b]`` its Monte Carlo standard error (std over groups / sqrt(groups));
    ``saddle``: group-mean saddle (deep_action.Saddle fields, dict); ``groups``: per-group Propagators."""
    L: int
    T: int
    params: dict
    sigma: dict
    se: dict
    saddle: dict
    saddle_se: dict
    groups: list = field(repr=False)
    diagnostics: dict = field(default_factory=dict)

    def __getitem__(self, a):
        return self.sigma[a]

    def names(self):
        return list(self.sigma)

    def var(self, name):
        """lim N Var(name(t)), (T,)."""
        self._known(name)
        return np.diag(self.sigma[name][name]).copy()

    def se_var(self, name):
        """Monte Carlo standard error of var(name), (T,)."""
        self._known(name)
        return np.diag(self.se[name][name]).copy()

    def _known(self, name):
        if name not in self.sigma:
            raise ParameterError(f"unknown observable {name!r}; known: {', '.join(self.sigma)}")


def group_propagator(*, activation, L, T, xiu, xir, gamma=None, y=None, eta=None, model=None, chunk=None,
                     weights=None, full=False, keep_blocks=False, keep_local=False, points=1,
                     observables=None, extra=None):
    """One complete estimate from one group of standard normals xiu, xir (L, S, T): the group's own saddle
    (march), the Monte Carlo Hessian of its action with the same samples, and the deep_action.Propagator
    (its diagnostics add 'stationarity', the largest |dS/dq| at the saddle relative to max(1, |q|)).

    The Hessian's blocks U and Kd are assembled layer by layer and solved causally
    (:mod:`dmftc.runtime.solvers.causal_solve`); sigma_phys only with ``full``.  ``keep_blocks``: the Propagator keeps
    its Hessian blocks as ``blocks`` (for :mod:`dmftc.runtime.solvers.solve_bias`); ``keep_local``: it keeps the local
    Hessians of ln Z_l as ``local_hessians`` and the saddle-point vector as ``x0`` (the tests' dense oracle,
    :mod:`dmftc.reference.dense_hessian`).

    ``points``: P of a spec on several training points: T counts its (time, point) steps, causality goes by
    time (:func:`dmftc.runtime.solvers.causal_solve.causal_order`), and ``observables`` (saddle, layout) -> (names, rows,
    J) maps the physical block to the observables of every point and pair.

    ``extra``: standard normals (xiu, xir) (L, S_e, T) of more paths, marched at the group's saddle with its
    order parameters held; their features join the hat-hat block of each ln Z_l (the features' covariance) and
    nothing else (:mod:`dmftc.runtime.sensitivities.held_paths`)."""
    model, activation = model_and_activation(model, activation, gamma, y, eta, L=L)
    t0 = _time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore"):
        if weights is not None:                       # normalised to sum to the number of paths (as plain means)
            weights = np.asarray(weights, float) * (xiu.shape[1] / np.sum(weights))
        sad, fields = mc_saddle(activation=activation, L=L, T=T, xiu=xiu, xir=xir, weights=weights, model=model,
                                points=points)
    model = sad.model                  # (a nonlinear error signal: linearised at this group's saddle)
    if not all(np.all(np.isfinite(a)) for a in (sad.Delta, *([] if sad.K is None else [sad.K]), *sad.Phi, *sad.G,
                                                  *sad.Rphi, *sad.Rg, *fields.w, *fields.x)):
        raise NumericalError("the Monte Carlo DMFT march produced non-finite order parameters: the dynamics "
                             "diverge; reduce the learning rate or the feature strength")
    t1 = _time.perf_counter()
    lay = Layout(L, T)
    x0 = saddle_point_vector(sad)
    grads, tl, kept = np.zeros(lay.n), [], []

    def local_hessians():
        for l in range(1, L + 1):
            v, idx = gather_local(np.asarray(x0), lay, l, phi0=model.phi0, g_top=model.g_top)
            est = estimator(T, activation, l > 1, l < L, chunk, points)
            ta = _time.perf_counter()
            more = None
            if extra is not None:                      # their sources from the saddle's own Cholesky factors
                Cu, Cr = fields.factors[l - 1]
                more = np.concatenate([np.asarray(extra[0][l - 1]) @ Cu.T, np.asarray(extra[1][l - 1]) @ Cr.T],
                                      axis=1)
            _, gr, h = est.log_z(np.asarray(v), fields.w[l - 1], fields.x[l - 1], top=float(l == L),
                                 model=model, weights=weights, extra=more, dense=False)
            tl.append(_time.perf_counter() - ta)
            if not h.finite():
                raise NumericalError(f"non-finite Monte Carlo Hessian of ln Z_{l} (overflowing integrand weights)")
            keep = idx >= 0
            np.add.at(grads, idx[keep], gr[keep])
            if keep_local:
                kept.append(h.dense())
            yield l, h
            del h                                      # (freed before the next layer's is built)

    blocks = assemble_blocks(x0, lay, local_hessians(), points)
    # stationarity of the Monte Carlo action at the group's saddle: bilinear gradient + sum_l d ln Z_l
    q = lay.unpack(np.asarray(x0, np.float64))
    g0 = np.zeros(lay.n)
    for l in range(1, L + 1):
        g0[lay.slice(f"Phi_hat[{l}]")] = q[f"Phi[{l}]"][lay.tril]
        g0[lay.slice(f"G_hat[{l}]")] = q[f"G[{l}]"][lay.tril]
    g0[lay.slice("Delta_hat")] = q["Delta"] - np.asarray(model.y_steps(T))
    for l in range(1, L):
        g0[lay.slice(f"A[{l}]")] = -q[f"B[{l}]"].T.reshape(-1)
        g0[lay.slice(f"B[{l}]")] = -q[f"A[{l}]"].T.reshape(-1)
    stat = float(np.abs(g0 + grads).max() / max(1.0, np.abs(x0).max()))
    t2 = _time.perf_counter()
    P = causal_propagator(sad, blocks, full=full, model=model, observables=observables)
    P.blocks = blocks if keep_blocks else None
    del blocks
    if keep_local:
        P.local_hessians, P.x0 = kept, x0
    diag = dict(P.diagnostics, stationarity=stat, march=fields.march, time_saddle=t1 - t0, time_hessian=t2 - t1,
                time_hessian_layers=tl, time_total=_time.perf_counter() - t0)
    P.diagnostics = diag
    if not all(np.all(np.isfinite(P.sigma[a][b])) for a in P.sigma for b in P.sigma[a]):
        raise NumericalError("non-finite propagator: the Monte Carlo Hessian of the action is singular")
    return P


class _Extrapolated:
    """A group's propagator extrapolated to delta width 0 from widths w and w/2 (same paths): 2 P(w/2) - P(w)."""

    def __init__(self, at_w, at_half):
        self.sigma = _extrapolate(at_w.sigma, at_half.sigma)
        self.saddle = at_half.saddle
        self.diagnostics = dict(at_half.diagnostics)
        self.diagnostics["min_eig"] = min(at_w.diagnostics["min_eig"], at_half.diagnostics["min_eig"])
        for k in ("time_saddle", "time_hessian", "time_solve"):
            self.diagnostics[k] = at_w.diagnostics[k] + at_half.diagnostics[k]


def _extrapolate(sigma_w, sigma_half):
    """2 Sigma(w/2) - Sigma(w), block by block."""
    return {a: {b: 2 * sigma_half[a][b] - sigma_w[a][b] for b in sigma_w[a]} for a in sigma_w}


_extrapolated = _Extrapolated


def _observable_matrix(P):
    names = list(P.sigma)
    return np.block([[P.sigma[a][b] for b in names] for a in names])


def deep_propagator(*, activation, L: int, T: int, gamma: float | None = None, y: float | None = None,
                    eta: float | None = None, model: DeepModel | None = None, samples: int = 8000, seed: int = 0,
                    groups: int = 4, chunk: int | None = None, progress: bool = False,
                    dirac_width: float = 0.1, dirac_extrapolate: bool = True, sampler: str = "sobol", points: int = 1,
                    observables=None, feature_samples: int | None = None) -> DeepPropagator:
    """Finite-width propagator lim N Cov of Delta(t), K(t), Phi[l](t,t), G[l](t,t) of an L-hidden-layer network
    (module doc).  ``samples`` source paths are split into ``groups`` independent groups; each group marches
    its own saddle and estimates its own Hessian and propagator; the result is the group mean and ``se`` the
    standard error over groups.  The action is ``model``'s (a
    :class:`dmftc.runtime.problem.deep_model.DeepModel`, e.g. read from a compiled deep spec), or without one the standard
    network's with (gamma, y, eta): for an ``activation`` string the compiled spec of
    :mod:`dmftc.runtime.problem.standard_spec`, whose own single-site program marches the groups' saddles.  ``activation``: an
    expression in h ('sin(h)'), a shorthand ('tanh'), or a :class:`dmftc.runtime.problem.activation.SiteActivation` (a
    compiled spec's); delta functions in its derivatives (kinks) are Gaussians of width ``dirac_width``.
    ``sampler``: the groups' standard normals, 'sobol' (randomised quasi-Monte Carlo, each group an independent
    scramble) or 'random' (:mod:`dmftc.runtime.numerics.sampling`).

    Kinks (``activation.kink_order`` not None): with ``dirac_extrapolate`` every group is also run with half the
    width on the same paths, and its propagator is extrapolated linearly to width 0, 2 Sigma(w/2) - Sigma(w)
    (the mollifier's bias is about linear in w when the delta function multiplies a function that is itself
    non-smooth at the kink, as for softsign; measured in experiments/deep_activations.py).  The standard errors
    come from the spread of the extrapolated groups, whose values are heavy-tailed (the mollified delta is large
    on the few paths near the kink): give a kinked activation more groups (softsign at L = 2, T = 30: 16 groups
    of 4096 paths sufficed; 8 of 2048 gave a late-time standard error a third of the one 8 of 8192 gave, not twice it);
    ``diagnostics['dirac_shift']`` reports, per observable, max_t |Sigma(w/2) - Sigma(w)| relative to the curve's
    peak, the size of the bias that was removed (the residual bias is not estimated), and ``'dirac_shift_vs_se'``
    the same shift over the standard error.

    ``diagnostics['solve_bias']`` / ``['solve_bias_vs_se']``: per observable, the estimated bias of the group mean
    from solving with noisy Hessians (the pooled Hessian's solve against the group mean,
    :mod:`dmftc.runtime.solvers.solve_bias`), relative to the curve's peak and to the standard error.

    ``points``, ``observables``: a spec on several training points (:func:`group_propagator`); ``T`` then
    counts its (time, point) steps and the observables are those ``observables`` names.

    ``feature_samples``: paths (at least ``samples``, split over the groups alike; default ``FEATURE_FACTOR``
    times ``samples``) whose features give the hat-hat block of each ln Z_l, the features' covariance, which
    carries most of the propagator's noise; each group's first samples / groups of them are its own paths (saddle
    and derivatives), the rest are marched at the group's saddle with its order parameters held
    (:mod:`dmftc.runtime.sensitivities.held_paths`).  ``feature_samples = samples`` is the plain estimator.  With
    the Sobol' sampler powers of two per group keep the point sets balanced."""
    make_room()                       # a long process: drop compiled programs before the mappings run out
    std = dict(gamma=gamma, eta=eta, y=y) if model is None and isinstance(activation, str) else None
    # (the standard network: its compiled spec's program and activation)
    model, activation = model_and_activation(model, activation, gamma, y, eta, L=L, width=dirac_width)
    if activation.kink_order is not None and activation.kink_order <= 2:
        raise ParameterError(
            f"no deep propagator for {activation.label}: its derivative of order {activation.kink_order} holds a "
            "delta function (a kink in phi or phi'), and the per-path estimator takes third source derivatives of "
            "g = phi'(h) z (of a and b in g = a(h) z + b(h)), which need phi''' and phi'''' (a'', a''', b'', b''') as "
            "functions; here they are derivatives of delta "
            "functions, whose mollified samples have no usable variance (sqrt(2) max(0, h) at L = 2, T = 6, "
            "400 paths: N Var K grew from 2e2 to 8e31; issue 13).  The means are available; activations with a "
            "kink in phi'' only (e.g. h / (1 + abs(h))) are extrapolated in the delta width")
    half = activation.at_width(activation.width / 2) if dirac_extrapolate and activation.kink_order is not None \
        else None
    L, T = check_integer("L (number of hidden layers)", L, 1), check_integer("T (number of steps)", T, 1)
    seed = check_integer("seed", seed, 0)
    check_sampler(sampler)
    groups = check_integer("groups", groups, 2)
    samples = check_integer("samples", samples, 2 * groups)
    if chunk is not None:
        chunk = check_integer("chunk", chunk, 1)
    per = samples // groups
    fper = feature_paths(feature_samples, samples, of=f"samples = {samples}") // groups
    t0 = _time.perf_counter()
    runs, runs_w = [], []
    pools = (Pool(), Pool())                          # Hessian blocks summed over groups: width w, w/2
    with Progress(f"deep propagator (L = {L}, T = {T // points}" + (f", P = {points})" if points > 1 else ")"),
                  groups, enabled=progress) as bar:
        for gi in range(groups):
            xi = source_normals(sampler, np.random.SeedSequence([seed, gi]), L, fper, T)
            kw = dict(L=L, model=model, T=T, xiu=xi[0][:, :per], xir=xi[1][:, :per], chunk=chunk, keep_blocks=True,
                      points=points, observables=observables,
                      extra=(xi[0][:, per:], xi[1][:, per:]) if fper > per else None)
            run = group_propagator(activation=activation, **kw)
            pools[0].add(run)
            if half is not None:
                runs_w.append(run)
                at_half = group_propagator(activation=half, **kw)
                pools[1].add(at_half)
                run = _extrapolated(run, at_half)
            runs.append(run)
            bar.advance(note=f"group {gi + 1}: {per} paths" + (f", features from {fper}" if fper > per else ""))
    names = list(runs[0].sigma)
    stack = lambda fn: np.array([fn(p) for p in runs])  # noqa: E731
    sigma, se = {}, {}
    for a in names:
        sigma[a], se[a] = {}, {}
        for b in names:
            arr = stack(lambda p: p.sigma[a][b])
            sigma[a][b] = arr.mean(axis=0)
            se[a][b] = arr.std(axis=0, ddof=1) / math.sqrt(groups)
    sad_keys = {"Delta": lambda s: s.Delta, "f": lambda s: s.f}
    if runs[0].saddle.K is not None:          # (on several points K is one of the observables only)
        sad_keys["K"] = lambda s: s.K
    for l in range(1, L + 1):
        for kind in ("Phi", "G", "Rphi", "Rg"):
            sad_keys[f"{kind}[{l}]"] = (lambda s, k=kind, i=l - 1: getattr(s, k)[i])
    saddle = {k: stack(lambda p, fn=fn: fn(p.saddle)).mean(axis=0) for k, fn in sad_keys.items()}
    saddle_se = {k: stack(lambda p, fn=fn: fn(p.saddle)).std(axis=0, ddof=1) / math.sqrt(groups)
                 for k, fn in sad_keys.items()}
    allS = np.array([_observable_matrix(p) for p in runs])      # covariance of all time-diagonal observables
    Sp = allS.mean(axis=0)
    ev = sla.eigh(0.5 * (Sp + Sp.T), eigvals_only=True, driver="evr")
    # eigenvalue noise scale: spectral norm of the matrix of entrywise standard errors (a bound on |d lambda|
    # for perturbations of that size); exact zero modes (e.g. Delta(0) = y) show up as O(noise) eigenvalues
    noise = float(np.linalg.norm(allS.std(axis=0, ddof=1) / math.sqrt(groups), 2))
    d = [p.diagnostics for p in runs]
    diag = {"samples_per_group": per, "feature_samples_per_group": fper, "groups": groups, "sampler": sampler,
            "stationarity": max(x["stationarity"] for x in d),
            "asymmetry": max(x["asymmetry"] for x in d),
            "min_eig": float(ev.min()), "max_eig": float(ev.max()),
            "psd": bool(ev.min() >= -1e-8 * max(ev.max(), 1e-300)),
            "eig_noise": noise, "psd_within_mc": bool(ev.min() >= -4 * noise),
            "group_min_eig": [x["min_eig"] for x in d],
            "time_saddle": sum(x["time_saddle"] for x in d), "time_hessian": sum(x["time_hessian"] for x in d),
            "time_solve": sum(x["time_solve"] for x in d), "time_total": _time.perf_counter() - t0,
            "march": d[0]["march"]}
    diag.update(activation=activation.label, kink_order=activation.kink_order,
                dirac_width=activation.width if activation.kink_order is not None else None,
                dirac_extrapolated=half is not None)
    if half is not None:
        shift, ratio = {}, {}
        for a in names:
            d_a = np.array([np.diag(pe.sigma[a][a] - pw.sigma[a][a]) for pe, pw in zip(runs, runs_w)]) / 2
            mean = d_a.mean(axis=0)             # Sigma(w/2) - Sigma(w) on the time diagonal
            peak = max(float(np.max(np.abs(np.diag(sigma[a][a])))), 1e-300)
            shift[a] = float(np.max(np.abs(mean)) / peak)
            ratio[a] = float(np.max(np.abs(mean) / np.maximum(np.diag(se[a][a]), 1e-300)))
        diag.update(dirac_shift=shift, dirac_shift_vs_se=ratio)
    # the bias of solving with a noisy Hessian (module solve_bias): group mean against the pooled Hessian's solve
    ts = _time.perf_counter()
    mean_saddle = dataclasses.replace(runs[0].saddle, maps=None, **{k: saddle[k] for k in ("Delta", "f", "K")
                                                                     if k in saddle},
                                      **{k: [saddle[f"{k}[{l}]"] for l in range(1, L + 1)]
                                         for k in ("Phi", "G", "Rphi", "Rg")})
    pooled = [pool.propagator(mean_saddle, model, observables).sigma for pool in pools if pool.n]
    pooled = _extrapolate(*pooled) if half is not None else pooled[0]
    diag["solve_bias"], diag["solve_bias_vs_se"] = bias_report(names, sigma, se, pooled, groups)
    diag["time_pooled_solve"] = _time.perf_counter() - ts
    diag["time_total"] = _time.perf_counter() - t0
    params = dict(activation=activation.label, model=model.label, L=L, T=T, samples=per * groups,
                  seed=seed, groups=groups, sampler=sampler, feature_samples=fper * groups)
    params.update(model.standard_params or std or {})
    return DeepPropagator(L, T, params, sigma, se, saddle, saddle_se, runs, diag)
