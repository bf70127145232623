"""What a single-site program reads at one step: the :class:`Evaluator` the generated ``site_*`` functions are
called with, the array :class:`Buffers` of a two-layer program's layout, and the order of a step's quantities
(:func:`schedule`).  The march itself: :mod:`dmftc.runtime.march.site_march`."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dmftc.errors import StructureSpecError
from dmftc.runtime.numerics.march_numerics import at_index, set_col, set_index
from dmftc.runtime.problem.spec_kernels import layer_number

__all__ = ["Buffers", "Evaluator", "boundary_row", "layer_names", "layer_number", "point_params", "schedule",
           "update_mask"]

_SLICE_RANK = 4        # layout buffers up to this rank are written by dynamic_update_slice


class Evaluator:
    """The values the generated ``site_*`` functions read at step t in layer l (see dmftc.codegen.site).

    On P training points (``points``) the steps are the pairs tau = t P + mu (dmftc.frontend.points_deep): t is
    tau, a strictly causal sum runs over the earlier times (every point), a fixed time k reads the pair
    (k, mu), a boundary kernel given per pair of points is read at (mu, nu), and a parameter with one point
    index is read at mu (``p``).

    A two-layer spec's program (``SITE['axes']``: dmftc.derive.site_lowering) lays every array out as (paths, one
    axis per sample index, time), size 1 where a quantity does not carry an index and on the time axis of a
    value at one time (``layout``; ``sz``: the index sizes): values at t are (paths, ..., 1), histories and
    one-time order parameters at s (paths or 1, ..., T), and a causal sum keeps its time axis (size 1)."""

    def __init__(self, mod, L, T, t, l, hist, rows, q1, src, p, act, width, bounds, cur=None, terms=None, points=1,
                 sz=None, rsums=None, tangents=None):
        self.mod, self.L, self.T, self.t, self.l, self.cur = mod, L, T, t, l, cur or {}
        self.layout, self.sz, self.rsums = "axes" in mod.SITE, sz, rsums or {}
        self.tangents = tangents or {}       # perturbations (dmftc.runtime.sensitivities.site_tangents): 'field', 'rsum', 'q'
        self.var, self.depth = layer_names(mod)
        self.hist, self.rows, self.q1, self.src, self._act = hist, rows, q1, src, act
        self.width, self.bounds, self.terms, self.points = width, bounds, terms or {}, points
        self.kink = 0.0          # the program's kink-aware helpers differentiate pathwise in the march (no deltas)
        self._given = p

    # the step's values that do not depend on the layer: computed when first read (each is traced operations, and
    # the march makes an evaluator for every read of a generated function), shared with the layers' (:meth:`at`)
    _SHARED = ("idx", "mu", "p", "past")

    @functools.cached_property
    def idx(self):
        return jnp.arange(self.T)

    @functools.cached_property
    def mu(self):
        """The point of this step."""
        return self.t % self.points

    @functools.cached_property
    def p(self):
        """The parameter values as this step's point reads them."""
        return point_params(self.mod, self._given, self.mu)

    @functools.cached_property
    def past(self):
        """[s < t] (dmftc.derive.site.PAST), times the update mask of the point of s (test points: no updates)."""
        return ((self.idx // self.points < self.t // self.points).astype(jnp.float64)
                * update_mask(self.mod, self._given, self.T))

    @property
    def step(self):
        """The step number t as a value (time in a two-layer spec's expressions)."""
        return jnp.asarray(self.t, jnp.float64)

    def per_step(self, name, k):
        """The per-step parameter ``name`` (one value per step, lr[T]) at step t + k (clipped to the grid: the
        march never uses a value beyond it)."""
        v = jnp.asarray(self._given[name], jnp.float64)
        return at_index(v, jnp.clip(self.t + k, 0, v.shape[0] - 1))

    def coef(self, name, time=None):
        """Row t of the time coefficient ``name`` (the generated module's ``coefficients``); a one-time
        coefficient's value at t, or at the fixed time ``time``."""
        return at_index(self.mod.coefficients(self._given, self.T)[name], self.t if time is None else self.fixed(time))

    def at(self, l):
        """The same step seen from layer l."""
        other = Evaluator(self.mod, self.L, self.T, self.t, l, self.hist, self.rows, self.q1, self.src, self._given,
                          self._act, self.width, self.bounds, terms=self.terms, points=self.points, sz=self.sz,
                          rsums=self.rsums, tangents=self.tangents)
        other.__dict__.update({k: self.__dict__[k] for k in self._SHARED if k in self.__dict__})
        return other

    def fixed(self, k):
        """The step of the fixed time k at this step's point."""
        return k * self.points + self.mu

    def layer(self, ref):
        return layer_number(ref, self.l, self.L, self.var, self.depth)

    def _at(self, x, time):
        """A layout array at the time 't' or a fixed time (its time axis kept, size 1); a buffer of the current
        values only (time axis of size 1) is its value at t."""
        if x.shape[-1] == 1 and time == "t":
            return x
        return _column(x, self.t if time == "t" else self.fixed(time))

    def dfield(self, name):
        """The tangent of a field of this layer at t (paths, index dims, directions)."""
        return self.tangents["field"][(name, self.l)]

    def drsum(self, name):
        """The tangent of a running sum at t."""
        return self.tangents["rsum"][(name, self.l)]

    def dq(self, name):
        """The tangent of a one-time order parameter at t (1, index dims, directions)."""
        return self.tangents["q"][name]

    def rsum(self, name):
        """A running sum (dmftc.derive.site_lowering) of this layer at t: eta times the sum of its increments over
        the earlier times."""
        return self._at(self.rsums[(name, self.l)], "t")

    def field(self, name, ref, time, vec=False):
        key = (name, self.layer(ref))
        if self.layout:
            if time == "t" and key in self.cur:
                return self.cur[key]
            if time == "s" and self.hist[key].shape[-1] != self.T:
                raise StructureSpecError(f"{name} is read at earlier times, but the march keeps its current value only")
            return self.hist[key] if time == "s" else self._at(self.hist[key], time)
        if time == "t" and key in self.cur:                      # a value at t given separately (tangents)
            return self.cur[key][:, None] if vec else self.cur[key]
        h = self.hist[key]
        if time == "s":
            return h
        v = at_index(h, self.t if time == "t" else self.fixed(time), 1)
        return v[:, None] if vec else v

    def term(self, name):
        """A path factor of this layer at every time s (paths, T): its values so far (zero from t on, or at t
        once this step computed it)."""
        return self.terms[(name, self.l)]

    def source(self, name, ref, vec=False):
        """A source at t (paths,): a gp's, or a constant-in-time one's; inside a sum over s, (paths, 1)."""
        v = self.src[(name, self.layer(ref))]
        return v[:, None] if vec and not self.layout else v

    def row(self, name, ref):
        l = self.layer(ref)
        full = self.rows.get((name, l))
        if full is None:
            return boundary_row(self.boundary(name, l), self.t, self.T, self.points)
        return at_index(full, self.t)

    def diag(self, name, ref):
        return at_index(self.row(name, ref), self.t)

    def boundary(self, name, l):
        for (n, ref), v in self.bounds.items():
            if n == name and layer_number(ref, self.l, self.L, self.var, self.depth) == l:
                return v
        raise StructureSpecError(f"{name}[{l}] is neither a hidden layer nor a boundary of {self.mod.SPEC_PATH}")

    def q(self, name, time):
        v = self.q1[name]
        if self.layout:
            return v if time == "s" else self._at(v, time)
        return v if time == "s" else at_index(v, self.t if time == "t" else self.fixed(time))

    def act(self, k, x):
        return self._act[k](x)

    def causal_dot(self, P, C, upto):
        mask = (self.idx <= self.t).astype(jnp.float64) if upto else self.past
        row = C * mask if jnp.ndim(C) else jnp.full((self.T,), C) * mask
        if self.layout:
            return jnp.sum(row if P is None else P * row, axis=-1, keepdims=True)
        if P is None:
            return jnp.sum(row)
        if jnp.shape(P)[-1] != self.T:                        # a factor constant in s (a field at t)
            return P[..., 0] * jnp.sum(row)
        return P @ row


def _column(x, t):
    """x[..., t:t+1] for a traced t, as a one-hot contraction (see :meth:`Buffers.put`)."""
    return jnp.sum(jnp.where(jnp.arange(x.shape[-1]) == t, x, 0.0), axis=-1, keepdims=True)


class Buffers:
    """The march's arrays over time: a deep program's (paths, T) histories and (T,) one-time order parameters, or
    a two-layer program's layout (:class:`Evaluator`): (paths or 1, one axis per sample index, T), size 1 on
    the indices a quantity does not carry.  ``put`` writes the values at time t, ``col`` reads them."""

    def __init__(self, site: dict, sizes, S: int, T: int):
        self.layout, self.S, self.T = "axes" in site, S, T
        if self.layout:
            if sizes is None:
                raise StructureSpecError("the march of a program with sample axes needs their sizes")
            stored = dict(site["stored"])
            self.dims = {n: tuple(int(sizes[size]) if a in idx else 1 for a, size in site["axes"])
                         for n, idx in stored.items()}
            self.dims[None] = (1,) * len(site["axes"])

    def zeros(self, name, lead=None, current=False):
        """A buffer of ``name`` (None: a scalar) over time, with ``lead`` rows (paths) or none; ``current``: of the
        value at the current time only (layout: a time axis of size 1)."""
        if self.layout:
            return jnp.zeros((1 if lead is None else lead,) + self.dims[name] + (1 if current else self.T,))
        return jnp.zeros(self.T if lead is None else (lead, self.T))

    def put(self, buf, v, t):
        """``buf`` with its values at time t set to ``v`` (broadcast)."""
        if self.layout and buf.shape[-1] == 1:
            return jnp.broadcast_to(v, buf.shape)
        if self.layout and buf.ndim <= _SLICE_RANK:      # one column written in place (the select below rewrites
            v = jnp.broadcast_to(v, buf.shape[:-1] + (1,)).astype(buf.dtype)    # the whole buffer: O(S T^2))
            return jax.lax.dynamic_update_slice_in_dim(buf, v, t, axis=buf.ndim - 1)
        if self.layout:                 # a select, not dynamic_update_slice (XLA CPU mis-compiled its fusion with
            return jnp.where(jnp.arange(self.T) == t, v, buf)    # the jvp of a rank-6 layout: LLVM IR failure)
        if buf.ndim == 1:
            return set_index(buf, v, t)
        return set_col(buf, jnp.broadcast_to(v, buf.shape[:1]), t)

    def col(self, buf, t):
        if self.layout:
            return buf if buf.shape[-1] == 1 else _column(buf, t)
        return at_index(buf, t, -1)

    def mean(self, wts, X, name):
        """The weighted path average of X, a value of ``name``'s shape."""
        if self.layout:
            X = jnp.broadcast_to(X, (self.S,) + self.dims[name] + (1,))
            return jnp.tensordot(wts, X, axes=1)[None]
        return wts @ X

    def source(self, name, v):
        """A constant-in-time source's values (paths,) or (paths, its index) in the layout."""
        v = jnp.asarray(v, jnp.float64)
        return jnp.reshape(v, (v.shape[0],) + self.dims[name] + (1,)) if self.layout else v


def layer_names(mod) -> tuple:
    """(layer variable, depth parameter) of a generated module: a deep spec's, or those of the one layer a
    two-layer spec's program is lowered to (dmftc.derive.site_lowering)."""
    return getattr(mod, "LAYER", None) or mod.SITE["layer"], getattr(mod, "DEPTH", None)


def update_mask(mod, p: dict, n: int):
    """The update mask of the point of every step (n,): 1 where the network trains on that point, 0 on a test
    point (dmftc.frontend.points_deep); 1.0 when every point trains."""
    pts = getattr(mod, "POINTS", None)
    name = pts.get("mask") if pts else None
    if name is None:
        return 1.0
    m = jnp.asarray(p[name], jnp.float64)
    return m[jnp.arange(n) % m.shape[0]]


def point_params(mod, p: dict, mu):
    """The parameters as the step of point ``mu`` reads them: one with one point index (y[mu]) at mu."""
    pts = getattr(mod, "POINTS", None)
    if not pts:
        return p
    one = {n for n, k in pts["params"] if k == 1}
    return {k: (v[mu] if k in one else v) for k, v in p.items()}


def boundary_row(value, t, T: int, points: int = 1):
    """Row t (T,) of a boundary kernel: a constant, or (P points) a matrix over the pairs of points read at
    (point of t, point of s)."""
    if jnp.ndim(value) == 2:
        idx = jnp.arange(T)
        return jnp.asarray(value)[t % points][idx % points]
    return value * jnp.ones(T)


def schedule(site: dict, L: int, var: str, depth: str) -> list:
    """One time step's order: nodes ('source', x, l), ('field', f, l), ('term', P, l) (a path factor), ('row', Q, l)
    for l = 1..L, each after what it reads at the same time (``site['reads']``); deterministic (the
    earliest-declared ready node first)."""
    reads = dict(site["reads"])
    constant = set(site.get("normals", ()))
    deps = {}
    for l in range(1, L + 1):
        for x, fam, off in site["sources"]:
            deps[("source", x, l)] = {("row", fam, l + off)} if 1 <= l + off <= L else set()
        for kind, names in (("field", site["fields"]), ("term", site["terms"]),
                            ("row", site["kernels"] + tuple(n for n, _ in site["responses"]))):
            for n in names:
                need = set()
                for rk, rn, ref in reads[(kind, n)]:
                    if rk == "source" and rn in constant:        # drawn before the march
                        continue
                    tgt = layer_number(ref, l, L, var, depth)
                    if rk in ("field", "term") and tgt != l:
                        raise StructureSpecError(f"{n} reads the {rk} {rn} of another layer; layers are coupled "
                                                 "only through order parameters")
                    if 1 <= tgt <= L:
                        need.add((rk, rn, tgt))
                deps[(kind, n, l)] = need
    order, done, rank = [], set(), {n: k for k, n in enumerate(deps)}
    while len(order) < len(deps):
        ready = [n for n in deps if n not in done and deps[n] <= done]
        if not ready:
            raise StructureSpecError("the quantities of one time step read each other in a cycle: "
                                     f"{sorted(n for n in deps if n not in done)[:4]}")
        node = min(ready, key=rank.__getitem__)
        order.append(node)
        done.add(node)
    return order
