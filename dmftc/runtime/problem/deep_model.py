"""The model-specific part of a deep network's action, as the propagator needs it: read from a compiled deep
spec (:func:`from_spec`), or built by hand (the tests' oracles: :mod:`dmftc.reference.standard_model`).

The deep propagator (:mod:`dmftc.runtime.engines.deep_propagator`) differentiates the MSR action

    S = sum_l [sum_{t>=s} (Phi_hat Phi + G_hat G)](l) - sum_l Tr(A[l] B[l+1]) + sum_t Delta_hat (Delta - y0)
        + sum_l ln Z_l,

whose single-site process of layer l is x = w + F(x) with

    h(t) = u(t) + sum_s C(t, s) g(s),     C = A[l-1] + [s < t] k_h(Phi[l-1](t, s), Delta(s)),
    z(t) = r(t) + sum_s E(t, s) phi(h(s)),  E = B[l+1] + [s < t] k_z(G[l+1](t, s), Delta(s)),

u ~ GP(0, Phi[l-1]), r ~ GP(0, G[l+1]), and, in the last layer, the readout Delta(t) = y0 + c_t E[z phi](t) +
c_0 E[z phi](0) (its Delta_hat term).  The responses A, B enter additively (the -Tr(A B) pairing of the
action fixes that); everything else is the spec's:

* ``k_h``, ``k_z``: the coupling coefficients, any elementwise function of (kernel entry, Delta(s)) -- their
  first and second partial derivatives (the chain rule from the order parameters to the couplings) come from
  JAX, not from a formula written here;
* ``readout`` = (y0, c_t, c_0): the error signal's affine dependence on the averages E[z phi].  Another loss makes
  the error signal a nonlinear function F(E_t, E_0) (e.g. the logistic loss, F = y / (1 + exp(y f))).  Exactly,
  the readout average is then an order parameter f = E[z phi] of its own (with its hat), and Delta = F(f) a
  deterministic constraint.  At the saddle every hat vanishes (ln Z = 0 at zero hats for any kernels), so the
  Hessian sees F only through its first derivatives there, and eliminating f, f_hat gives the affine readout
  with per-step coefficients c_t(t) = dF/dE_t, c_0(t) = dF/dE_0 at the saddle's averages, and y0(t) such that
  the saddle's Delta is reproduced.  ``readout_fn`` keeps F; :meth:`DeepModel.linearised` returns the model
  linearised at a march's averages (:func:`dmftc.runtime.problem.deep_action.saddle_of_march` does so), and the
  unlinearised model refuses to give its features.  (The O(1/N) mean correction needs the action's third
  derivatives, which do see F''; it is refused for such specs.)
* ``phi0``, ``g_top``: the constant boundary kernels Phi[0] and G[L+1] (the responses A[0], B[L+1] must be 0);
* ``points``: P of a spec on several training points (dmftc.frontend.points_deep), whose action runs over the
  T P pairs (time, point) tau = t P + mu: the couplings' strict mask is then [time of s < time of t], a boundary
  kernel may be a (P, P) matrix over the points (the input Gram matrix), and y0 a (P,) vector;
* ``k_of``: the scalar K(t) as a function of the time diagonals of the kernels (layers 0..L+1), linearised by
  JAX for the propagator of K.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import Pos, StructureSpecError
from dmftc.runtime.numerics.march_numerics import array_module


__all__ = ["DeepModel", "from_spec", "trained_mask"]


@dataclass(frozen=True)
class DeepModel:
    """See the module doc.  ``key`` identifies the model in compilation caches.  Models of one ``family`` differ
    only in their numeric ``values``: ``bind(values)`` (values may be JAX tracers) rebuilds the model, so that
    compiled code (:func:`family_jit`) is shared across parameter values instead of recompiled for each."""
    key: tuple
    label: str
    k_h: Callable = field(repr=False)     # (Phi, Delta) -> coefficient, elementwise (broadcasting)
    k_z: Callable = field(repr=False)     # (G, Delta) -> coefficient
    readout: tuple                        # (y0, c_t, c_0)
    phi0: float                           # Phi[0](t, s) (on P points: a number or a (P, P) matrix)
    g_top: float                          # G[L+1](t, s)
    k_of: Callable = field(repr=False)    # (dPhi: list l = 0..L of (T,), dG: list l = 1..L+1 of (T,)) -> (T,)
    family: tuple | None = None           # identifies bind (None: compiled per key)
    values: tuple = ()                    # (name, value) pairs that bind takes
    bind: Callable | None = field(default=None, repr=False, compare=False)
    module: object = field(default=None, repr=False, compare=False)   # the compiled spec's generated module
    points: int = 1                       # training points folded into time (module doc)
    readout_fn: Callable | None = field(default=None, repr=False, compare=False)  # F(e_t, e_0) of a nonlinear
    #                                       error signal (per point on P points); None: affine (module doc)
    linear_readout: bool = True           # False until linearised at a saddle when readout_fn is set
    affine_readout: bool = True           # readout_fn affine (per-point coefficients): its linearisation is exact
    trained: tuple | None = None          # on P points: 1 where the network trains on the point, 0 on a test point
    one_time: Callable | None = field(default=None, repr=False, compare=False)   # T -> (T, nc): the spec's
    #                                       one-time coefficients (the local functions read them), None: none
    march: Callable | None = field(default=None, repr=False, compare=False)  # (activation, model) -> kernels
    #                                       with .params(L) and .march(...): how a model without a compiled spec is
    #                                       marched (the tests' models: dmftc.reference.structured_march.ModelKernels)

    @property
    def standard_params(self) -> dict | None:
        """(gamma, eta, y) of the hand-written standard network this model is
        (:func:`dmftc.reference.standard_model.standard`), else None."""
        return dict(zip(("gamma", "eta", "y"), self.key[1:4])) if self.key[0] == "standard" else None

    @property
    def y0(self):
        """The target: a number, or (P,) on several points (per step (n,) when linearised at a saddle)."""
        self._affine()
        y = np.asarray(self.readout[0], float)
        return float(y) if y.ndim == 0 else y

    def y_steps(self, n: int):
        """y0 at each of the n steps (time, point): a number for one point, else (n,)."""
        self._affine()
        y = self.readout[0]
        if self.readout_fn is not None:              # linearised: already one value per step
            return y
        xp = array_module(y)                          # numpy on the host, JAX when a family jit traces y
        return xp.tile(xp.asarray(y), n // self.points) if np.ndim(y) else y

    def _affine(self):
        if not self.linear_readout:
            raise RuntimeError(f"{self.label}: the error signal is nonlinear in the readout averages; use the model "
                               "linearised at the saddle (DeepModel.linearised)")

    def linearised(self, e) -> "DeepModel":
        """For a nonlinear error signal F (``readout_fn``): the model whose readout is F's tangent at the readout
        averages ``e`` (n,) of every step (time, point) of a march: per step y0, c_t, c_0 (n,) with
        y0 + c_t e(t) + c_0 e(0) = F(e(t), e(0)) (module doc).  An affine model is returned as it is."""
        if self.readout_fn is None:
            return self
        P = self.points
        e = jnp.asarray(e, jnp.float64).reshape(-1, P)          # (T, P)
        e0 = e[0]
        ones = jnp.ones(P)
        fn = lambda a, b: jnp.broadcast_to(jnp.asarray(self.readout_fn(a, b), jnp.float64), (P,))  # noqa: E731
        val, ct = jax.vmap(lambda a: jax.jvp(lambda x: fn(x, e0), (a,), (ones,)))(e)
        c0 = jax.vmap(lambda a: jax.jvp(lambda x: fn(a, x), (e0,), (ones,))[1])(e)
        y0 = val - ct * e - c0 * e0[None, :]
        lin = tuple(np.asarray(v, float).reshape(-1) for v in (y0, ct, c0))
        values = tuple((k, v) for k, v in self.values if k != _LINEARISED) + ((_LINEARISED, lin),)
        family = self.family
        if family is not None and (_LINEARISED,) not in family:     # (compiled once for every saddle)
            family = tuple(family) + ((_LINEARISED,),)
        return replace(self, readout=lin, linear_readout=True, values=values, family=family)

    def one_time_rows(self, T: int):
        """(T, nc): the one-time coefficients the local functions read at each step, or None."""
        return None if self.one_time is None else self.one_time(T)

    def strict(self, n: int):
        """(n, n) mask [time of s < time of t] over the steps (time, point), times the update mask of the point of
        s (``trained``): a test point's updates, the only place its couplings enter, are absent."""
        tt = np.arange(n) // self.points
        m = (tt[:, None] > tt[None, :]).astype(float)
        if self.trained is not None:
            m = m * np.asarray(self.trained, float)[np.arange(n) % self.points][None, :]
        return m

    def features(self):
        """Coefficients (a, b) of the last layer's Delta_hat feature a z phi(t) + b z phi(0) in ln Z_L
        (ln F = hats . f; the readout's sign: Delta - y0 - c_t E_t - c_0 E_0 = 0 at the saddle): numbers, or one
        per step (n,) for a nonlinear error signal linearised at a saddle."""
        self._affine()
        return -self.readout[1], -self.readout[2]

    def error_signal(self, e_t, e_0):
        """y0 + c_t e_t + c_0 e_0, written so that Delta(0) = y0 exactly when c_0 = -c_t (the network's case)."""
        y0, ct, c0 = self.readout
        return y0 + ct * (e_t - e_0) + (ct + c0) * e_0

    def couplings(self, pp_sym, gn_sym, a, b, Delta):
        """(C, E) (T, T) of a layer from its neighbours' kernels (symmetric), responses (T, T) and Delta."""
        strict = self.strict(Delta.shape[0])
        C = strict * self.k_h(pp_sym, Delta[None, :]) + a
        E = strict * self.k_z(gn_sym, Delta[None, :]) + b
        return C, E

    def partials(self, which, q, Delta):
        """Elementwise partial derivatives of k (``which`` 'h' or 'z') at the kernel q (T, T) and Delta (T,):
        (k_q, k_D, k_qq, k_qD, k_DD), each (T, T), entry (t, s) the derivative of k(t, s) in q(t, s) and Delta(s)
        (k may depend on (t, s) itself, through a spec's time coefficients).  One compiled program per coupling
        and model family (:func:`family_jit`)."""
        fn = family_jit(_K_PARTIALS, (which,), self, lambda model_of: lambda q, d, vals: _k_partials(
            model_of(vals).k_h if which == "h" else model_of(vals).k_z, q, d))
        return tuple(np.asarray(v) for v in fn(jnp.asarray(q, jnp.float64), jnp.asarray(Delta, jnp.float64)))

    def k_jacobian(self, dPhi, dG):
        """(dK/dPhi[l](t,t) for l = 1..L, dK/dG[l](t,t) for l = 1..L), each a list of (T,) arrays: the scalar
        K is time-local, so a forward derivative with a ones tangent per layer gives its diagonal Jacobian.
        One compiled program per depth and model family (:func:`family_jit`)."""
        L = len(dPhi) - 1
        base = [jnp.asarray(a, jnp.float64) for a in dPhi] + [jnp.asarray(a, jnp.float64) for a in dG]
        fn = family_jit(_K_JACOBIAN, (L,), self, lambda model_of: lambda base, vals: _k_columns(
            model_of(vals).k_of, base, L))
        out = [np.asarray(v) for v in fn(base)]
        return out[:L], out[L:]

    def k_hessian(self, dPhi, dG):
        """Second derivatives of K(t) in the fluctuating diagonals Phi[1..L](t,t), G[1..L](t,t), in that order:
        (T, 2L, 2L) (K is time-local, so per time one small Hessian; by JAX from ``k_of``, one compiled program
        per depth and model family)."""
        L = len(dPhi) - 1
        base = np.stack([np.asarray(a, float) for a in dPhi] + [np.asarray(a, float) for a in dG], axis=1)  # (T, 2L+2)
        fn = family_jit(_K_HESSIAN, (L,), self, lambda model_of: lambda rows, vals: jax.vmap(
            lambda row: _k_row_hessian(model_of(vals).k_of, row, L))(rows))
        return np.asarray(fn(jnp.asarray(base)))


_LINEARISED = "readout (linearised)"     # DeepModel.values key of a linearised nonlinear error signal
_K_JACOBIAN: dict = {}
_K_HESSIAN: dict = {}
_K_PARTIALS: dict = {}


def _k_partials(k, q, d):
    """(k_q, k_D, k_qq, k_qD, k_DD) (T, T) of a coupling k(q, D) at the kernel q (T, T) and D (T,).  Entry (t, s)
    of k depends on q(t, s) and D(s) only (checked by :func:`from_spec`), so a forward derivative with a tangent of
    ones gives every entry's partial derivative at once, and nesting two gives the second ones."""
    oq, od = jnp.ones_like(q), jnp.ones_like(d)
    f = lambda q, d: k(q, d[None, :])                                          # noqa: E731
    dq = lambda q, d: jax.jvp(lambda x: f(x, d), (q,), (oq,))[1]                # noqa: E731
    dd = lambda q, d: jax.jvp(lambda x: f(q, x), (d,), (od,))[1]                # noqa: E731
    full = lambda x: jnp.broadcast_to(jnp.asarray(x, jnp.float64), q.shape)    # noqa: E731
    return (full(dq(q, d)), full(dd(q, d)), full(jax.jvp(lambda x: dq(x, d), (q,), (oq,))[1]),
            full(jax.jvp(lambda x: dq(q, x), (d,), (od,))[1]), full(jax.jvp(lambda x: dd(q, x), (d,), (od,))[1]))


def _k_columns(k_of, base, L):
    """The diagonal Jacobian columns of K(t) in Phi[1..L], G[1..L] (``base``: Phi[0..L], G[1..L+1] diagonals)."""
    fn = lambda *xs: k_of(list(xs[:L + 1]), list(xs[L + 1:]))  # noqa: E731
    out = []
    for i in list(range(1, L + 1)) + list(range(L + 1, 2 * L + 1)):   # Phi[1..L], G[1..L]
        tang = [jnp.zeros_like(x) for x in base]
        tang[i] = jnp.ones_like(base[i])
        out.append(jax.jvp(fn, list(base), tang)[1])
    return out


def _k_row_hessian(k_of, row, L):
    """Hessian of K at one time in Phi[1..L], G[1..L] (G[l] at L + l), ``row`` all 2L + 2 diagonals there."""
    var = jnp.asarray(list(range(1, L + 1)) + list(range(L + 1, 2 * L + 1)))

    def k(xs):
        full = row.at[var].set(xs)
        vals = [full[i:i + 1] for i in range(2 * L + 2)]
        return jnp.sum(jnp.asarray(k_of(vals[:L + 1], vals[L + 1:]), jnp.float64))

    return jax.hessian(k)(row[var])


def family_jit(cache: dict, key: tuple, model: DeepModel, build: Callable) -> Callable:
    """A compiled function of ``model``'s action, shared by its family: ``build(model_of)`` returns the function
    to compile, ``model_of(vals)`` the model inside it (vals traced when the model has a family, ignored else).
    Returns fn(*args) for this model's values; compiled once per (key, family) or (key, model.key)."""
    if model.bind is None:
        full = key + (("model",) + tuple(model.key),)
        if full not in cache:
            cache[full] = jax.jit(build(lambda _vals: model))
        fn = cache[full]
        return lambda *args: fn(*args, {})
    full = key + (("family",) + tuple(model.family),)
    if full not in cache:
        cache[full] = jax.jit(build(model.bind))
    fn, vals = cache[full], dict(model.values)
    return lambda *args: fn(*args, vals)


def _spec_error(mod, why, where=None, hint=None):
    """A StructureSpecError at the spec text the generated part ``where`` came from (mod.SOURCE_POS: 'h', 'z',
    a scalar's name, or a boundary 'A[0]'; a key ending in '[' matches any layer), with the line and a caret
    when the spec file (mod.SPEC_FILE, set by dmftc.load, else the recorded path) still has the compiled text."""
    from dmftc.build import REPO_ROOT                  # generated modules record spec paths relative to it

    table = getattr(mod, "SOURCE_POS", {})
    key = next((k for k in table if k == where or (where and where.endswith("[") and k.startswith(where))), None)
    pos = Pos(*table[key]) if key else None
    source = None
    for path in (getattr(mod, "SPEC_FILE", None), REPO_ROOT / mod.SPEC_PATH):
        try:
            text = Path(path).read_text()
        except (OSError, TypeError):
            continue
        if hashlib.sha256(text.encode()).hexdigest() == mod.SPEC_SHA256:
            source = text
            break
    return StructureSpecError(f"the deep propagator cannot read this spec's action: {why}", pos, hint=hint,
                              source=source, filename=mod.SPEC_PATH)


def from_spec(mod, p: dict) -> DeepModel:
    """The model of a compiled deep spec (generated module ``mod``) at parameter values ``p``.  The generated
    functions are used as they are (JAX-traceable); the structure the propagator relies on (responses additive,
    couplings elementwise, readout affine, response boundaries zero) is checked on random values and refused
    with a StructureSpecError that says what differs."""
    r, q = mod.ROLES, {k: (np.asarray(v, float) if np.ndim(v) else float(v)) for k, v in p.items()}
    pts = getattr(mod, "POINTS", None)
    static = {mod.DEPTH: q[mod.DEPTH]} | ({pts["size"]: q[pts["size"]]} if pts else {})
    if pts and pts.get("mask"):           # the update mask shapes the causal masks: fixed in compiled code
        static[pts["mask"]] = q[pts["mask"]]
    points = int(q[pts["size"]]) if pts else 1
    rng = np.random.default_rng(2024)
    T = 5
    X, D, R = rng.standard_normal((T, T)), rng.standard_normal(T), rng.standard_normal((T, T))
    close = lambda a, b: np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-10, atol=1e-12)  # noqa: E731
    prev, nxt = _rows(mod)
    zero = np.zeros((T, T))
    k_h, k_z = _spec_couplings(mod, q)

    # additive responses, checked by derivatives (exact whatever the scale of the other terms): the coupling's
    # Jacobian in the response rows is the identity, at two points
    eye = np.eye(T * T)
    h_jacobian = jax.jit(jax.jacfwd(lambda a: jnp.asarray(mod.h_coupling(prev(X, a), D[None, :], q), jnp.float64)))
    for point in (zero, R):
        jac = h_jacobian(jnp.asarray(point))
        if not close(np.asarray(jac).reshape(T * T, T * T), eye):
            raise _spec_error(mod, f"the coefficient of g[l](s) in h[l](t) must be {r['A']}[l-1](t, s) plus terms "
                                   f"free of {r['A']}", "h")
    c0, _ = mod.z_coupling(nxt(X, R), D[None, :], q)
    if not close(np.broadcast_to(np.asarray(c0, float), (T, T)), R):
        raise _spec_error(mod, f"the same-time coefficient of phi(h[l](s)) in z[l](t) must be {r['B']}[l+1](t, s)",
                          "z")
    for name, k in (("h", k_h), ("z", k_z)):
        jac = jax.jit(jax.jacfwd(lambda a, d: jnp.asarray(k(a, d[None, :]), jnp.float64), argnums=(0, 1)))(
            jnp.asarray(X), jnp.asarray(D))
        dq, dd = (np.asarray(j).reshape(T * T, -1) for j in jac)
        ok_q = np.all(np.abs(dq - np.diag(np.diag(dq))) < 1e-12)
        dd_off = dd.copy()
        dd_off[np.arange(T * T), np.tile(np.arange(T), T)] = 0.0
        if not (ok_q and np.all(np.abs(dd_off) < 1e-12)):
            raise _spec_error(mod, f"the {name} coupling c(t, s) must depend on the kernel entry at (t, s) and on "
                                   "Delta(s) only (it depends on other entries)", name)
    y0, ct, c0_ = (np.asarray(v, float) for v in _spec_readout(mod, q))
    affine = bool(mod.READOUT_AFFINE)                # (derived symbolically: dmftc.derive.deep.ScalarDef.affine)
    readout_fn = None
    if affine and np.ptp(ct) == 0 and np.ptp(c0_) == 0:      # one affine readout for every point
        y0 = y0 if y0.ndim else float(y0)
        ct, c0_ = float(np.ravel(ct)[0]), float(np.ravel(c0_)[0])
    else:                # another loss, or per-point coefficients: linearised at each saddle (module doc; exact and
        #                  kept for the O(1/N) mean correction when affine)
        readout_fn = lambda a, b: mod.readout(a, b, q)                                   # noqa: E731
    bnd = {k: (np.asarray(v, float) if np.ndim(v) else float(v)) for k, v in _spec_boundaries(mod, q).items()}
    for resp in ("A", "B"):
        if np.any(np.asarray(bnd.get(resp, 0.0)) != 0.0):
            raise _spec_error(mod, f"the boundary response {r[resp]} must be 0 (got {bnd[resp]})", f"{r[resp]}[",
                              hint="the responses of the input and readout layers vanish: set them to 0")
    L = int(q[mod.DEPTH])
    if tuple(mod.SCALARS) != ("K",):
        raise _spec_error(mod, f"the propagator maps one scalar named K; the spec declares {', '.join(mod.SCALARS)}",
                          (mod.SCALARS or (mod.ERROR_SIGNAL,))[0])
    k_of = _spec_k_of(mod, q)
    test = [rng.standard_normal(T) for _ in range(L + 1)], [rng.standard_normal(T) for _ in range(L + 1)]
    try:
        k_of(*test)
    except (IndexError, KeyError) as err:            # pragma: no cover - the checker fixes the layer range
        raise _spec_error(mod, f"K reads a kernel outside layers 0..L+1 ({err})", "K") from None
    # the depth (and the number of points) are integers fixed in compiled code; the rest is traced
    free = tuple(sorted((k, v) for k, v in q.items() if k not in static))
    return DeepModel(key=("spec", mod.SPEC_SHA256, tuple(sorted((k, _hashable(v)) for k, v in q.items()))),
                     label=f"{mod.MODEL} ({mod.SPEC_PATH})", k_h=k_h, k_z=k_z, readout=(y0, ct, c0_),
                     phi0=bnd.get("Phi", 1.0), g_top=bnd.get("G", 1.0), k_of=k_of,
                     family=("spec", mod.SPEC_SHA256, tuple((k, _hashable(v)) for k, v in static.items()),
                             tuple(k for k, _ in free)),
                     values=free, bind=lambda vals: _spec_bound(mod, vals | static, readout_fn is not None, affine),
                     module=mod, points=points,
                     readout_fn=readout_fn, linear_readout=readout_fn is None, affine_readout=affine,
                     trained=trained_mask(mod, q), one_time=_spec_one_time(mod, q))


def trained_mask(mod, q):
    """The update mask of a spec on several points as a tuple of 0/1 (None without one)."""
    pts = getattr(mod, "POINTS", None)
    name = pts.get("mask") if pts else None
    return None if name is None else tuple(float(v) for v in np.ravel(np.asarray(q[name], float)))


def _hashable(v):
    return tuple(np.ravel(v).tolist()) + (np.shape(v),) if np.ndim(v) else v


def _rows(mod):
    r = mod.ROLES
    prev = lambda P, A: {"Phi": P, "A": A, r["Phi"]: P, r["A"]: A}                                    # noqa: E731
    nxt = lambda G, B: {"G": G, "B": B, r["G"]: G, r["B"]: B}                                         # noqa: E731
    return prev, nxt


def _spec_couplings(mod, q):
    prev, nxt = _rows(mod)

    def k_h(Phi, Delta):
        return mod.h_coupling(prev(Phi, 0.0 * Phi), Delta, q)

    def k_z(G, Delta):
        return mod.z_coupling(nxt(G, 0.0 * G), Delta, q)[1]

    return k_h, k_z


def _spec_one_time(mod, q):
    """T -> (T, nc): the spec's one-time coefficients (generated ``coefficients``), None when it has none."""
    names = tuple(getattr(mod, "ONE_TIME_COEFFICIENTS", ()))
    if not names:
        return None
    return lambda T: jnp.stack([jnp.asarray(mod.coefficients(q, T)[n], jnp.float64) for n in names], axis=-1)


def _spec_k_of(mod, q):
    fam_of = {mod.ROLES["Phi"]: "Phi", mod.ROLES["G"]: "G"}

    def k_of(dPhi, dG):
        def diag(fam, l):
            return dPhi[l] if fam_of[fam] == "Phi" else dG[l - 1]
        return mod.scalar_K(diag, q)

    return k_of


def _spec_readout(mod, q):
    """(y0, c_t, c_0) of the spec's error signal, the coefficients by differentiation (exact: c_t = -c_0 to the
    bit when the spec reads E_t - E_0); affine only if from_spec's check says so.  On several points y0 is (P,)
    and so are the coefficients (the same at every point)."""
    ct, c0 = jax.jit(jax.jacfwd(lambda e, f: mod.readout(e, f, q), argnums=(0, 1)))(0.0, 0.0)
    return mod.readout(0.0, 0.0, q), ct, c0


def _spec_boundaries(mod, q) -> dict:
    """The spec's boundary values keyed by role (Phi, G, A, B)."""
    role = {v: k for k, v in mod.ROLES.items()}
    return {role.get(fam, fam): value for (fam, _), value in mod.boundaries(q).items()}


def _spec_bound(mod, q, nonlinear: bool = False, affine: bool = True) -> DeepModel:
    """The spec's model at parameter values q that may be JAX tracers (no checks: from_spec made them).
    ``nonlinear``: the readout goes through ``readout_fn`` (another loss, or per-point coefficients);
    ``affine``: from_spec found it affine all the same."""
    q = dict(q)
    lin = q.pop(_LINEARISED, None)                    # a nonlinear error signal's tangent at the saddle
    k_h, k_z = _spec_couplings(mod, q)
    bnd = _spec_boundaries(mod, q)
    pts = getattr(mod, "POINTS", None)
    if lin is not None or nonlinear:                  # (not yet linearised: features() refuses)
        fn = lambda a, b: mod.readout(a, b, q)                                           # noqa: E731
        readout = tuple(lin) if lin is not None else _spec_readout(mod, q)
    else:
        y0, ct, c0 = _spec_readout(mod, q)
        if pts:                                       # the coefficients are the same at every point (from_spec)
            ct, c0 = jnp.ravel(ct)[0], jnp.ravel(c0)[0]
        readout, fn = (y0, ct, c0), None
    return DeepModel(key=("spec-bound",), label=mod.MODEL, k_h=k_h, k_z=k_z, readout=readout,
                     phi0=bnd.get("Phi", 1.0), g_top=bnd.get("G", 1.0), k_of=_spec_k_of(mod, q),
                     points=int(q[pts["size"]]) if pts else 1, readout_fn=fn,
                     linear_readout=not nonlinear or lin is not None, affine_readout=affine,
                     trained=trained_mask(mod, q), one_time=_spec_one_time(mod, q))
