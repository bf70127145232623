"""One deep layer's single-site program at one time step, as the propagator differentiates it: the local map.

A deep spec's program (``SITE`` and the ``site_*`` functions of its generated module, :mod:`dmftc.codegen.site`)
computes at every step t the fields that carry a source (``h = u + sum_s C(t, s) g(s)``, ``z = r + ...``: the
x-fields, one per source, in the order of the sources' layer offsets -1, +1, which is the order of w = (u, r)),
then the fields that are functions of those at the same time (``g``), the path factors the fields' sums read at
earlier times (``SITE['terms']``: ``g[l](s)``, ``phi(h[l](s))``), the kernels' observables (a path factor at s
times a function of the fields at t) and the readout average (``z[L](t) phi(h[L](t))``).  Everything but the
x-fields' own equations is local in time: a function of x(t) = (h(t), z(t)).  This module evaluates those
generated functions with an evaluator that supplies x(t) (:class:`_LocalEvaluator`) and takes their derivatives
in x(t) by JAX (``jax.jacfwd``, nested), so the per-path derivatives of :mod:`dmftc.runtime.sensitivities.site_moments` come
from the spec's own program:

* the outputs y (the path factors the couplings read, one per coupling kind) and their first, second and third
  derivatives Y1, Y2, Y3;
* each kernel's two factors (at t and at s) and the readout observable, with first and second derivatives.

The activation enters the program only through ``E.act(k, x)`` (phi and its derivatives, :mod:`dmftc.derive.
activation`: distributions, with delta functions mollified to Gaussians of the solve's width).  Here ``act(k)`` is
a ``jax.custom_jvp`` whose derivative is ``act(k + 1)``, so differentiating the program reproduces the spec's
derivatives of phi as distributions, delta functions included (plain autodiff of phi' would drop them).  Other
non-smooth functions of the fields (abs, max, min, Heaviside outside phi, e.g. in a surrogate gradient field) are
printed by the site program's kink-aware helpers (:func:`dmftc.runtime.numerics.kernels.kabs`, ...), whose derivatives are
the delta functions mollified with ``E.kink``: the solve's width here, 0 in the march (pathwise tangents).  Such a
kink is mollified by the product rule (a'' of a = 1 / (1 + |h|) is -2 delta(h) / (1 + |h|)^2 where the symbolic
derivative of :mod:`dmftc.derive.activation` gives -2 delta(h)), which differs at O(width) and is removed with
the rest of the width's bias by the propagator's extrapolation to width 0: for g = z / (1 + |h|) (L = 2, T = 6,
eta = 0.1, 8192 paths in 8 groups, same paths) the extrapolated N Var of Delta, K, G[1], Phi[2] is within 0.3% of
each peak, and 0.26 standard errors, of the symbolic derivatives' (the closed forms that the runtime used before).

A spec with one-time coefficients (``ONE_TIME_COEFFICIENTS``, e.g. a weight decay's a(t) in ``phi(a(t) h)``,
:mod:`dmftc.frontend.coefficients_deep`) has local functions that depend on the step: their values at each
point's step come along with the field values (``CV``, from :meth:`dmftc.runtime.problem.deep_model.DeepModel.
one_time_rows`), and the derivatives are taken in the fields only.

The couplings are the x-fields' sums: kind 'C' (the forward field's: h reads g) and 'E' (the backward field's: z
reads phi(h)), as :class:`dmftc.runtime.sensitivities.local_estimator.LocalEstimator` builds them from the spec's action
(:mod:`dmftc.runtime.problem.deep_model`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import StructureSpecError

__all__ = ["LocalMap", "local_map"]


def _chain(activation, pad=False):
    """act(k)(x) = activation.derivative(k)(x) for k = 0..4 (phi and four derivatives of a SiteActivation), each a
    custom_jvp whose derivative is the next one: autodiff of the program differentiates phi as the spec's
    distributions.  ``pad``: the derivative of the fourth is 0 instead of an error (for integrands in which fifth
    derivatives are traced but structurally multiplied by zero, :mod:`dmftc.runtime.matrix_free.integrand`)."""
    acts = []

    def make(k):
        part = activation.derivative(k)

        @jax.custom_jvp
        def act(x):
            return part(x)

        @act.defjvp
        def _jvp(primals, tangents):
            (x,), (dx,) = primals, tangents
            if k + 1 >= len(acts):
                if pad:
                    return act(x), jnp.zeros_like(dx)
                raise NotImplementedError("the propagator needs phi and its first four derivatives only")
            return act(x), acts[k + 1](x) * dx

        return act

    acts.extend(make(k) for k in range(5))
    return tuple(acts)


class _LocalEvaluator:
    """What the generated ``site_*`` functions read, at one time step of one layer, when everything they read is
    the x-fields at that time (values given): derived fields are computed by their own ``site_field_*``; kernel
    observables read their path factor at s through ``term`` (``terms``: name -> value)."""

    def __init__(self, mod, x: dict, p: dict, acts, kink, terms=None, coefs=None):
        self.mod, self.x, self.p, self._acts, self.kink, self.terms = mod, x, p, acts, kink, terms or {}
        self._coefs = coefs or {}
        self.width = kink
        self._cur = {}

    def field(self, name, ref, time, vec=False):
        if time != "t":
            raise StructureSpecError(f"{name} at time {time}: not a function of the fields at the same time")
        if name in self.x:
            return self.x[name]
        if name not in self._cur:
            self._cur[name] = getattr(self.mod, f"site_field_{name}")(self)
        return self._cur[name]

    def act(self, k, x):
        return self._acts[k](x)

    def term(self, name):
        return self.terms[name]

    def coef(self, name, time=None):
        """A one-time coefficient's value at this step (given with the field values)."""
        if time is not None:
            raise StructureSpecError(f"{name} at time {time}: not a function of the fields at the same time")
        if name not in self._coefs:
            raise StructureSpecError(f"the single-site program reads the one-time coefficient {name!r}: the local "
                                     "map needs its value at each step (CV, DeepModel.one_time_rows)")
        return self._coefs[name]

    def __getattr__(self, what):              # rows, sources, sums: not local in time
        raise StructureSpecError(f"the single-site program reads {what!r} where the propagator needs a function "
                                 "of the fields at the same time")


@dataclass(frozen=True)
class LocalMap:
    """The local map of one deep spec's program (module doc) at fixed parameters and delta width.

    ``xfields``: the x-fields in the order of the sources' slots in w; ``outputs``: the path factors the couplings
    read; ``kinds``: ((name, x-field index, output index), ...) of the couplings, 'C' then 'E'; ``kernels``:
    the kernel families in feature order (forward kernel Phi, then G)."""

    key: tuple
    xfields: tuple
    outputs: tuple
    kinds: tuple
    kernels: tuple
    mod: object = field(compare=False, hash=False, repr=False)
    p: dict = field(compare=False, hash=False, repr=False)
    acts: tuple = field(compare=False, hash=False, repr=False)
    kink: float = 0.0

    @property
    def coefficients(self):
        """The one-time coefficients the program reads (``E.coef``), in the order of ``CV``'s last axis."""
        return tuple(getattr(self.mod, "ONE_TIME_COEFFICIENTS", ()))

    @property
    def nx(self):
        return len(self.xfields)

    @property
    def ny(self):
        return len(self.outputs)

    def _ev(self, xv, terms=None, cv=None):
        coefs = {} if cv is None else dict(zip(self.coefficients, cv))
        return _LocalEvaluator(self.mod, dict(zip(self.xfields, xv)), self.p, self.acts, self.kink, terms, coefs)

    def outputs_at(self, xv, cv=None):
        """The outputs y (ny,) at one time, x-field values xv (nx,)."""
        ev = self._ev(list(xv), cv=cv)
        return jnp.stack([getattr(self.mod, f"site_term_{self._term_index(o)}")(ev) for o in self.outputs])

    def features_at(self, xv, cv=None):
        """(the kernels' factors at t (nk,), their factors at s (nk,), the readout observable ()) at one time."""
        xs = list(xv)
        ev = self._ev(xs, cv=cv)
        s_fac = jnp.stack([getattr(self.mod, f"site_term_{self._term_index(self._kernel_term(k))}")(ev)
                           for k in self.kernels])
        t_fac = []
        for k in self.kernels:
            one = self._ev(xs, {self._kernel_term(k): 1.0}, cv)
            t_fac.append(jnp.asarray(getattr(self.mod, f"site_kernel_{k}")(one)).reshape(()))
        readout = jnp.asarray(getattr(self.mod, f"site_average_{self._readout()}")(ev)).reshape(())
        return jnp.stack(t_fac), s_fac, readout

    # ---------------------------------------------------------------- derivatives, vectorised over (paths, T)
    def output_tensors(self, X, CV=None):
        """X (..., nx) -> (y, Y1, Y2, Y3): (..., ny), (..., ny, nx), (..., ny, nx, nx), (..., ny, nx, nx, nx).
        ``CV`` (..., nc): the one-time coefficients at each point's time (``coefficients``)."""
        return _vmap_lead(_derivatives(self.outputs_at, 3), X, CV)

    def feature_values(self, X, CV=None):
        """X (..., nx) -> (a, b, r): the kernels' factors at t and at s (..., nk) and the readout observable (...),
        without derivatives."""
        return _vmap_lead(self.features_at, X, CV)

    def feature_tensors(self, X, CV=None):
        """X (..., nx) -> ((a, A1, A2), (b, B1, B2), (r, R1, R2)): the kernels' factors at t and at s (..., nk),
        (..., nk, nx), (..., nk, nx, nx) and the readout observable (...), (..., nx), (..., nx, nx)."""
        v, d1, d2 = _vmap_lead(_derivatives(self.features_at, 2), X, CV)
        return tuple((v[i], d1[i], d2[i]) for i in range(3))

    # ---------------------------------------------------------------- structure read from SITE
    def _term_index(self, name):
        return self.mod.SITE["terms"].index(name)

    def _kernel_term(self, kernel):
        return _reads_of(self.mod, ("row", kernel), "term")[0]

    def _readout(self):
        site = self.mod.SITE
        fixed = {sym for sym, *_ in site.get("fixed", ())}
        syms = [s for _, avgs in site["readouts"] for s in avgs if s not in fixed]
        if len(syms) != 1:
            raise StructureSpecError("the propagator needs one readout average of the last layer at time t, "
                                     f"found {syms}")
        return syms[0]


def _derivatives(f, order):
    """(x, c) -> (f(x, c), f'(x, c), ..., f^(order)(x, c)), derivatives in x by nested forward mode, each level
    traced once (the lower orders ride along as auxiliary outputs instead of being traced again inside every
    higher one)."""
    def level(fn):
        def top(x, c):
            t, lower = fn(x, c)
            return t, lower + (t,)
        return lambda x, c: jax.jacfwd(top, has_aux=True)(x, c)

    fn = lambda x, c: (f(x, c), ())                            # noqa: E731
    for _ in range(order):
        fn = level(fn)

    def all_orders(x, c):
        t, lower = fn(x, c)
        return lower + (t,)
    return all_orders


def _vmap_lead(fn, X, CV=None):
    """fn of one (nx,) vector (and its one-time coefficients) applied over the leading axes of X."""
    lead = X.shape[:-1]
    flat = X.reshape((-1, X.shape[-1]))
    if CV is None:
        out = jax.vmap(lambda x: fn(x, None))(flat)
    else:
        out = jax.vmap(fn)(flat, jnp.broadcast_to(CV, lead + CV.shape[-1:]).reshape((flat.shape[0], -1)))
    return jax.tree_util.tree_map(lambda a: a.reshape(lead + a.shape[1:]), out)


def _reads_of(mod, what, kind):
    for q, deps in mod.SITE["reads"]:
        if tuple(q) == tuple(what):
            return [name for k, name, *_ in deps if k == kind]
    raise StructureSpecError(f"{what[1]} is not in the single-site program of {mod.SPEC_PATH}")


def _structure(mod):
    """(xfields, outputs, kinds, kernels) of a deep program (module doc); a StructureSpecError for a program the
    propagator's local map does not describe."""
    site, roles = mod.SITE, mod.ROLES
    by_source = {}
    for name in site["fields"]:
        srcs = _reads_of(mod, ("field", name), "source")
        if srcs:
            if len(srcs) != 1:
                raise StructureSpecError(f"the field {name} reads the sources {srcs}; the propagator needs one source "
                                         "per field")
            by_source[srcs[0]] = name
    order = sorted(site["sources"], key=lambda s: s[2])           # layer offset -1 (forward) before +1
    if [s[2] for s in order] != [-1, 1] or set(by_source) != {s[0] for s in order}:
        raise StructureSpecError("the propagator needs a forward and a backward source, each driving one field")
    xfields = tuple(by_source[s[0]] for s in order)
    outputs, kinds = [], []
    for kind, xf in zip(("C", "E"), xfields):
        terms = list(dict(site["factors"])[xf])
        if len(terms) != 1:
            raise StructureSpecError(f"the field {xf} sums {len(terms)} path factors over earlier times; the "
                                     "propagator needs one")
        if terms[0] not in outputs:
            outputs.append(terms[0])
        kinds.append((kind, xfields.index(xf), outputs.index(terms[0])))
    kernels = (roles["Phi"], roles["G"])
    return xfields, tuple(outputs), tuple(kinds), kernels


def local_map(activation, pad: bool = False) -> LocalMap:
    """The local map of ``activation``'s program (a :class:`dmftc.runtime.problem.activation.SiteActivation`): the compiled
    spec it came from (``activation.program``), else the standard network's program
    (:func:`dmftc.runtime.problem.standard_spec.standard_program`), in which the activation enters through ``E.act`` only.
    ``pad``: phi's fifth derivative is 0 (see ``_chain``)."""
    return _local_map(activation, bool(pad))


@lru_cache(maxsize=64)
def _local_map(activation, pad=False) -> LocalMap:
    if activation.program is not None:
        mod, p = activation.program
    else:
        if not activation.standard_gradient or activation.grad is not None:
            raise StructureSpecError(f"activation {activation.label}: a gradient field other than phi'(h) z needs "
                                     "the spec that defines it")
        from dmftc.runtime.problem.standard_spec import standard_program

        mod, p = standard_program(), {}
    xfields, outputs, kinds, kernels = _structure(mod)
    acts = _chain(activation, pad)
    lm = LocalMap(key=(activation.key, mod.SPEC_SHA256) + (("pad",) if pad else ()), xfields=xfields, outputs=outputs, kinds=kinds,
                  kernels=kernels, mod=mod, p=dict(p), acts=acts, kink=float(activation.width))
    _check_products(lm)
    return lm


def _check_products(lm: LocalMap):
    """Each kernel's observable is (its path factor at s) x (a function of the fields at t): checked on random
    field values, since the features are built from the two factors."""
    rng = np.random.default_rng(0)
    for _ in range(3):
        xt, xs = rng.standard_normal(lm.nx) * 0.7, rng.standard_normal(lm.nx) * 0.7
        ct, cs = ((jnp.asarray(rng.uniform(0.5, 1.5, len(lm.coefficients))) if lm.coefficients else None)
                  for _ in range(2))
        a, _, _ = lm.features_at(jnp.asarray(xt), ct)
        _, b, _ = lm.features_at(jnp.asarray(xs), cs)
        for i, k in enumerate(lm.kernels):
            term = lm._kernel_term(k)
            full = getattr(lm.mod, f"site_kernel_{k}")(lm._ev(list(xt), {term: b[i]}, ct))
            if not np.isclose(float(jnp.asarray(full).reshape(())), float(a[i] * b[i]), rtol=1e-12, atol=1e-14):
                raise StructureSpecError(f"the observable of {k} is not a product of a factor at s and one at t; the "
                                         "propagator needs E[a(t) b(s)]")
