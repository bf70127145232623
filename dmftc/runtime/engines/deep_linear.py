"""Finite-width propagator of deep LINEAR networks from the autodiff Hessian of their Gaussian DMFT action.

The action is a :class:`dmftc.runtime.problem.deep_model.DeepModel`'s (a compiled deep spec's, read by
``deep_model.from_spec``, or the standard network): its coupling coefficients k_h(Phi(t,s), Delta(s)),
k_z(G(t,s), Delta(s)) enter C_l, E_l below in place of eta gamma Delta(s) Phi / G, its readout Delta = y0 +
c_t E[z h](t) + c_0 E[z h](0) gives the Delta_hat term of ln Z_L and the pairing Delta_hat (Delta - y0), its
boundaries Phi[0], G[L+1] replace the ones, and its K the sum below.  The derivation is written for the
standard network, the case k = eta gamma Delta q, (y0, c_t, c_0) = (y, -1/gamma, 1/gamma):

The network (:mod:`dmftc.validation.deep_ensemble`): width N, L hidden layers, one training point,
phi = identity, mean-field parameterisation, discrete gradient descent with step eta, recorded at
t = 0..T-1 before each update, Delta(t) = y - (f(t) - f(0)).  The saddle point is the exact
discrete-time DMFT; the propagator Sigma = lim N Cov(q) is the physical block of -[Hess S]^-1.

Derivation (discrete time, per neuron, one layer pair W^l between h^l and h^{l+1})
--------------------------------------------------------------------------------
Unrolling the updates, h^{l+1}(t) = chi^{l+1}(t) + eta gamma sum_{s<t} Delta(s) Phi^l(t,s) g^{l+1}(s) and
z^l(t) = xi^l(t) + eta gamma sum_{s<t} Delta(s) G^{l+1}(t,s) phi(h^l(s)), with chi^{l+1} = W^l(0) phi(h^l)/sqrt N,
xi^l = W^l(0)^T g^{l+1}/sqrt N.  Enforcing chi, xi with conjugates chi_hat, xi_hat and averaging over W^l(0)
gives Gaussian sources u^{l+1} ~ GP(0, Phi^l), r^l ~ GP(0, G^{l+1}) and the cross term
-N sum_{t,s} Bx(t,s) Ax(t,s), Bx = <chi_hat^{l+1}(t) g^{l+1}(s)>, Ax = <phi(h^l(t)) xi_hat^l(s)>.  Introducing
Ax, Bx with conjugates and integrating out Ax exactly (it enters linearly) leaves ONE pair of full T x T
matrices per layer pair, which after a constant rescaling (which leaves the physical block of the
propagator invariant) are real:

    A^l(t,s): coupling of g^{l+1}(s) into h^{l+1}(t)    (saddle: Rphi[l](t,s) = <d h^l(t)/d r^l(s)>,  s < t)
    B^l(t,s): coupling of h^l(s)    into z^l(t)         (saddle: Rg[l+1](t,s) = <d g^{l+1}(t)/d u^{l+1}(s)>, s <= t)

The pairing term is -Tr(A^l B^l) = -sum_{t,s} A^l(t,s) B^l(s,t): the causal entries of A pair with the
ANTI-causal entries of B and vice versa, so both must be kept as full matrices (restricting both to their
causal supports makes the pairing vanish identically).  With x = (h(0..T-1), z(0..T-1)) of layer l,

    M_l = [[I, -C_l], [-E_l, I]],  C_l(t,s) = A^{l-1}(t,s) + [s<t] eta gamma Delta(s) Phi^{l-1}(t,s)
                                   E_l(t,s) = B^l(t,s)     + [s<t] eta gamma Delta(s) G^{l+1}(t,s)
    (A^0 = B^L = 0, Phi^0 = G^{L+1} = 1 1^T), sources (u, r) ~ N(0, Sw_l), Sw_l = diag(Phi^{l-1}, G^{l+1}).

The single-site generating function is the exact Gaussian integral over (x, x_hat), INCLUDING the Jacobian
1/det M_l (=1 only for causal couplings, which the anti-causal entries of A, B are not):

    ln Z_l = -1/2 ln det [[-Q_l, M_l^T], [M_l, Sw_l]]        (4T x 4T; = -ln det M_l at Q_l = 0)
    -x^T Q_l x / 2 = -sum_{t>=s} [Phi_hat^l(t,s) h(t) h(s) + G_hat^l(t,s) z(t) z(s)]
                     + [l = L] sum_t Delta_hat(t) (z(t) h(t) - z(0) h(0)) / gamma

(the last term is N^-1 sum_i of the exact finite-width f~(t) = f(t) - f(0): the error dynamics is exact in
discrete time, no gradient-flow approximation and no K-driven Delta update).  The action per neuron is

    S = sum_l sum_{t>=s} [Phi_hat^l Phi^l + G_hat^l G^l](t,s) + sum_t Delta_hat(t) (Delta(t) - y)
        - sum_{l=1}^{L-1} Tr(A^l B^l) + sum_{l=1}^{L} ln Z_l .

Symmetric kernels are parameterised by their lower triangles (t >= s), each distinct entry having its own
conjugate.  At the saddle all hats vanish, A = Rphi, B = Rg and every first derivative of S is zero
(checked in the tests).  Then N Cov(q_phys) -> Sigma = [-(Hess S)^-1]_{phys, phys}; K is a derived
observable, dK(t) = sum_l G^{l+1}(t,t) dPhi^l(t,t) + Phi^l(t,t) dG^{l+1}(t,t).

Relation to the paper (App. "Deep Linear Networks", continuous time): A, B here are gamma times the paper's
A, B (so -Tr(A B) is its -gamma^2 Tr(A B)), the Delta terms carry the step eta and act only on s < t, the
response terms include the same-time entry of Rg (discrete time), and A, B enter M_l WITHOUT the causal mask
Theta the paper puts on them (with the mask the action is not stationary at the DMFT solution: its
d/dA of the pairing term is balanced only by anti-causal derivatives of ln Z).  The propagator is the
physical block of the full inverse; the paper's route (Sigma0 = [[U^-1 kappa U^-T, -U^-1], [-U^-T, 0]],
then the Schur complement over A, B) gives the same matrix (tests/test_deep_linear.py).

Solve: the Hessian is never formed whole.  The primal-primal block of each ln Z_l's Hessian vanishes at the
saddle (ln Z_l = 0 at zero hats and causal couplings), so only its rows along the dual directions (hats and
anti-causal couplings, half of the local variables) are differentiated (forward-over-reverse of the log-det
above) and added into the blocks U (dual x primal) and Kd (dual x dual) with the bilinear part; the propagator
comes from the causal solve every propagator uses (:mod:`dmftc.runtime.solvers.causal_solve`,
:func:`dmftc.runtime.solvers.linalg.sandwich`).  The mean correction needs the whole inverse,
[[U^-1 Kd U^-T, -U^-1], [-U^-T, 0]] from U^-1.
The dense Hessian and its LU are the tests' oracle (:mod:`dmftc.reference.dense_hessian`).
"""
from __future__ import annotations

import time as _time

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.solvers.causal_solve import CausalBlocks, assemble_blocks, causal_propagator, covariance_of_all
from dmftc.runtime.problem.deep_action import (Layout, Propagator, Saddle, bilinear_part, gather_local, log_z_local,
                                       saddle_of_march, saddle_point_vector)
from dmftc.errors import ParameterError
from dmftc.runtime.problem.deep_model import family_jit
from dmftc.runtime.problem.standard_spec import as_model


__all__ = ["deep_linear_saddle", "deep_linear_action", "deep_linear_propagator", "linear_blocks", "stationarity",
           "require_affine_readout"]


def require_affine_readout(model) -> None:
    """Refuse the O(1/N) mean correction of a model whose error signal is nonlinear in the readout averages (another
    loss, linearised at each saddle: dmftc.runtime.problem.deep_model), whose curvature enters the third derivatives.  An
    affine error signal with coefficients that differ between points is also linearised, exactly: it passes."""
    if model.readout_fn is not None and not model.affine_readout:
        raise ParameterError(
            "the O(1/N) mean correction is computed for error signals affine in the network output (the squared "
            "loss); another loss makes the error signal a nonlinear function of the output, whose second "
            "derivative enters the action's third derivatives and is not implemented")


# ----------------------------------------------------------------------------------------------
# infinite-width saddle point: exact forward march of linear maps on the Gaussian sources
# ----------------------------------------------------------------------------------------------
def deep_linear_saddle(*, L: int, T: int, model=None, gamma: float | None = None, y: float | None = None,
                       eta: float | None = None) -> Saddle:
    """Exact infinite-width solution of the discrete-time DMFT of an L-hidden-layer linear network whose action
    is ``model``'s (a :class:`dmftc.runtime.problem.deep_model.DeepModel`; default the standard network with gamma, y, eta).

    Every field of layer l is linear in that layer's sources w = (u^l(0..T-1), r^l(0..T-1)),
    Cov(w) = diag(Phi[l-1], G[l+1]); the march on the exact basis (:func:`dmftc.runtime.march.deep_dmft.march_exact`:
    a compiled spec's own single-site program, or for a DeepModel without a spec the reference structured march
    of :mod:`dmftc.reference.structured_march`) carries the fields' coefficients on the 2 L T source basis
    vectors, so all averages are exact quadratic forms and the responses are coefficients: Rphi[l](t,s) = dh^l(t)/dr^l(s), Rg[l](t,s) = dz^l(t)/du^l(s).
    (dmftc.reference.deep_marches.numpy_linear_saddle writes the same march out in numpy: the tests' oracle.)
    """
    from dmftc.runtime.problem.activation import as_activation
    from dmftc.runtime.march.deep_dmft import march_exact, march_kernels

    L, T = int(L), int(T)
    if L < 1 or T < 1:
        raise ValueError("need L >= 1 and T >= 1")
    model = as_model(model, gamma, y, eta, L=L)
    own = bool(getattr(model.module, "LINEAR", False))         # a compiled linear spec: its own program
    kern, prm = march_kernels(None if own else as_activation("linear"), model, L)
    return saddle_of_march(model, march_exact(kern, prm, L, T, points=model.points), L, T)


# ----------------------------------------------------------------------------------------------
# the action
# ----------------------------------------------------------------------------------------------
_HESS_CACHE: dict = {}


def local_hessian(T, model):
    """(v, top) -> Hessian of ln Z_l of ``model``'s action, compiled once per T and model family (the model's
    numeric values are traced: a sweep over gamma or a spec's parameters reuses it)."""
    return family_jit(_HESS_CACHE, (T,), model, lambda model_of: jax.hessian(
        lambda v, top, vals: log_z_local(v, model_of(vals), top, T=T)))


_DUAL_CACHE: dict = {}


def dual_positions(T: int, points: int = 1) -> np.ndarray:
    """Positions in the local vector of ln Z_l (:func:`dmftc.runtime.problem.deep_action.log_z_local` order) of the DUAL
    directions of the causal solve (:func:`dmftc.runtime.solvers.causal_solve.causal_order`): the hats Phi_hat, G_hat,
    Delta_hat and the anti-causal couplings, A(t, s) with time(s) >= time(t) and B(t, s) with time(s) > time(t)
    (time = step // points). The same for every layer (a boundary layer's constant entries are among them,
    harmlessly)."""
    nt = T * (T + 1) // 2
    time = np.arange(T) // points
    t_full, s_full = (time[k] for k in np.divmod(np.arange(T * T), T))
    o_a, o_b, o_hat = 2 * nt, 2 * nt + T * T, 2 * nt + 2 * T * T
    return np.concatenate([o_a + np.flatnonzero(s_full >= t_full), o_b + np.flatnonzero(s_full > t_full),
                           np.arange(o_hat, o_hat + 2 * nt), o_hat + 2 * nt + T + np.arange(T)])


def _local_dual_rows(T, model, points: int = 1):
    """(v, top) -> the rows H[dual, :] of ln Z_l's Hessian (forward-over-reverse along the dual directions only,
    half of all: the primal-primal block, zero at the saddle, is not computed), compiled once per (T, points)
    and model family."""
    dual = dual_positions(T, points)

    def build(model_of):
        def rows(v, top, vals):
            grad = jax.grad(lambda w: log_z_local(w, model_of(vals), top, T=T))
            basis = jnp.zeros((len(dual), v.shape[0])).at[jnp.arange(len(dual)), dual].set(1.0)
            return jax.vmap(lambda e: jax.jvp(grad, (v,), (e,))[1])(basis)
        return rows

    return family_jit(_DUAL_CACHE, (T, points), model, build)


def deep_linear_action(x, *, L: int, T: int, model=None, gamma: float | None = None, y: float | None = None,
                       eta: float | None = None):
    """Action S per neuron of ``model`` (default: the standard network with gamma, y, eta) as a differentiable
    (JAX) function of the flat order-parameter vector x (see :class:`Layout`; a dict of arrays is packed
    first).  Formula in the module docstring."""
    model = as_model(model, gamma, y, eta, L=L)
    lay = Layout(L, T)
    if isinstance(x, dict):
        x = lay.pack(x)
    q = lay.unpack(jnp.asarray(x))
    s = bilinear_part(q, L=L, T=T, y=model.readout[0])   # (traceable: a family jit traces the values)
    x = jnp.asarray(x)
    for l in range(1, L + 1):
        v, _ = gather_local(x, lay, l, model.phi0, model.g_top)
        s = s + log_z_local(v, model, float(l == L), T=T)
    return s


# ----------------------------------------------------------------------------------------------
# Hessian and propagator
# ----------------------------------------------------------------------------------------------
def linear_blocks(x0, lay: Layout, model, points: int = 1) -> CausalBlocks:
    """U and Kd of the closed-form Gaussian action of ``model`` at its saddle x0
    (:func:`dmftc.runtime.solvers.causal_solve.assemble_blocks`): the bilinear part and, one layer at a time, the dual rows
    of each ln Z_l's Hessian over its local variables (:func:`_local_dual_rows`; its primal-primal block is zero
    at the saddle: ln Z_l = 0 at zero hats and causal couplings).
    ``points``: P of a spec on several training points (``lay.T`` counts its T P steps)."""
    rows = _local_dual_rows(lay.T, model, points)
    dual = dual_positions(lay.T, points)
    x0 = np.asarray(x0, np.float64)              # host values: the local vectors are gathered in NumPy
    L = lay.L

    def local_hessians():
        for l in range(1, L + 1):
            r = np.asarray(rows(gather_local(x0, lay, l, model.phi0, model.g_top)[0], float(l == L)))
            h = np.zeros((r.shape[1], r.shape[1]))
            h[dual] = r
            h[:, dual] = r.T
            yield l, h

    return assemble_blocks(x0, lay, local_hessians(), points)


def deep_linear_propagator(*, L: int, T: int, model=None, gamma: float | None = None, y: float | None = None,
                           eta: float | None = None, correction: bool = False) -> Propagator:
    """Sigma = [-(Hess S)^-1]_{phys,phys} at the exact saddle of ``model``'s action (default: the standard network
    with gamma, y, eta), by the causal solve (:func:`dmftc.runtime.solvers.causal_solve.causal_propagator`); observables
    Delta, K, Phi[l](t,t), G[l](t,t), and ``sigma_phys`` over the whole physical block (two-time covariances).
    ``correction``: also the O(1/N) mean correction (``Propagator.mean_correction``), which needs the whole
    inverse of the Hessian and the action's third derivatives (:mod:`dmftc.runtime.engines.deep_linear_correction`)."""
    t0 = _time.perf_counter()
    model = as_model(model, gamma, y, eta, L=L)
    if correction:
        require_affine_readout(model)
    sad = deep_linear_saddle(L=L, T=T, model=model)
    model = sad.model                  # (a nonlinear error signal: linearised at this saddle)
    x0 = saddle_point_vector(sad)
    lay = Layout(L, T)
    t1 = _time.perf_counter()
    blocks = linear_blocks(x0, lay, model)
    t2 = _time.perf_counter()
    P = causal_propagator(sad, blocks, full=True)
    if correction:
        from dmftc.runtime.engines.deep_linear_correction import mean_correction_from_inverse

        t3 = _time.perf_counter()
        C = covariance_of_all(blocks, model)
        del blocks
        P.m1_phys = mean_correction_from_inverse(x0, C, L=L, T=T, model=model)[: lay.n_phys]
        P.diagnostics["time_mean_correction"] = _time.perf_counter() - t3
    P.diagnostics.update({"time_saddle": t1 - t0, "time_hessian": t2 - t1, "stationarity": stationarity(sad, model),
                          "time_total": _time.perf_counter() - t0})
    return P


def stationarity(sad: Saddle, model) -> float:
    """max |dS/dq| of ``model``'s closed-form action at the saddle ``sad`` relative to max(1, |q|): round-off when
    the saddle (marched from a spec's own program) is the stationary point of the action the propagator
    differentiates (the spec's couplings, readout, boundaries and K as :mod:`dmftc.runtime.problem.deep_model` reads them)."""
    x0 = saddle_point_vector(sad)
    L, T = sad.L, sad.T
    grad = family_jit(_GRAD_CACHE, (L, T), model, lambda model_of: jax.grad(
        lambda x, vals: deep_linear_action(x, L=L, T=T, model=model_of(vals))))(jnp.asarray(x0))
    return float(np.max(np.abs(np.asarray(grad))) / max(1.0, float(np.max(np.abs(x0)))))


_GRAD_CACHE: dict = {}


