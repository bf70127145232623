"""The saddle-point march of a deep spec from its generated single-site program (issue 12).

Where the structured march of :mod:`dmftc.runtime.deep_dmft` fills a fixed template (forward field h, backward
field z, g = phi'(h) z; the spec supplies coupling coefficients, boundaries and readout), this march runs the
spec's own field equations, kernels, responses and readout, as :mod:`dmftc.codegen.site` printed them into the
generated module (``SITE`` and the ``site_*`` functions, called with an :class:`Evaluator`).  Per time step t,
every layer's quantities in the order of their same-time reads (``SITE['reads']``, :func:`schedule`):

* a gp source ``x[l] ~ gp(0, Q[l+k])`` grows causally, x(t) = sum_{s<=t} C(t, s) xi(s), the Cholesky factor C of
  Q[l+k] extended by its row t (a boundary layer's constant value beyond the hidden layers; pivots below a
  relative threshold are zero, as in the structured march);
* a field is its function of the fields at t (paths,), the fields at every earlier s (paths, T), the rows t of
  the neighbouring kernels and responses (T,) and the one-time order parameters (T,);
* a kernel's row t is the weighted path average of its observable at (t, s <= t);
* a response ``R[l](t, s) = <d X(t) / d x[l](s)>`` is the path average of forward-mode tangents: every field of
  the layer carries its derivative with respect to an additive perturbation of the source x[l] at each time s
  (``jax.jvp`` of the same generated functions, vectorised over s, the order parameters held fixed).  The
  tangents are pathwise: a kink in phi' (relu) differentiates to 0 on each side, and the delta function of its
  phi'' is dropped, not mollified.  Measured against depth-L relu networks (experiments/deep_relu_means.py): the
  means of K are 3-10% of their peak off in rich training, growing with gamma and depth; with the delta as a
  Gaussian of width 0.1 they are 9-73% off, and as the width shrinks the means diverge (the neurons of layer 1
  that switch off keep a fixed h, so the tangents multiply deltas at the same point).  The solution says so
  (:func:`dmftc.runtime.deep_solution.kink_note`);
* a path factor of the fields' sums (``SITE['terms']``: phi(h[l](s)), g[l](s)) is computed once, at its time, with
  its tangents; a sum reads the kept values and tangents (paths x T^2 per factor and step, as for one
  matrix-vector product), so that no step re-evaluates a factor, or differentiates it, over the whole history.
  The fields' own tangents live for the current step only.  Tangent histories are stored flat, (direction s *
  paths, time), and written as columns in place (a 3-D buffer read through a reshape made XLA copy it each step);
* last, the readout constraints: each average X(t) on the paths ('direct') and, where
  :mod:`dmftc.derive.site` found Stein's lemma to apply, sum_{s<=t} Cov_x(t, s) <dY / dx(s)> + <X - x(t) Y>
  ('stein', the default, whose Monte Carlo error does not grow like 1/gamma); an average at a fixed time reads
  its t-form's history.

A two-layer spec's program (dmftc.derive.site_lowering: one layer, sources constant in time, order parameters
that are all readouts) runs through the same march: its sources are the values the caller drew (``normals``),
its causal integrals are running sums carried as state (``SITE['sums']``, advanced at the end of each step), and
its arrays are laid out over the sample indices (:class:`Evaluator`, :class:`Buffers`);
:mod:`dmftc.runtime.site_engine` differentiates it for the propagator (:func:`replay_march`,
:func:`readout_pass`).

With ``direct=True`` the result is the exact saddle of the Monte Carlo action of the given paths (what the
propagator differentiates).  The structured march computes the same numbers (tests/test_site_march.py: equal to
round-off on the same paths for several specs, both readouts).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dmftc.errors import StructureSpecError
from dmftc.runtime.deep_dmft import _PIVOT_TOL, _extend_cholesky, _set_col, layer_number


__all__ = ["Buffers", "Evaluator", "boundary_row", "constraint_pass", "layer_names", "layer_number", "point_params",
           "readout_pass", "replay_march", "schedule", "site_march", "update_mask"]


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
        self.tangents = tangents or {}       # perturbations (dmftc.runtime.site_tangents): 'field', 'rsum', 'q'
        self.var, self.depth = layer_names(mod)
        self.hist, self.rows, self.q1, self.src, self._act = hist, rows, q1, src, act
        self.width, self.bounds, self.terms, self.points = width, bounds, terms or {}, points
        self.idx = jnp.arange(T)
        self.mu = t % points
        self._given, self.p = p, point_params(mod, p, self.mu)
        # [s < t] (dmftc.derive.site.PAST), times the update mask of the point of s (test points: no updates)
        self.past = (self.idx // points < t // points).astype(jnp.float64) * update_mask(mod, p, T)

    def at(self, l):
        """The same step seen from layer l."""
        return Evaluator(self.mod, self.L, self.T, self.t, l, self.hist, self.rows, self.q1, self.src, self._given,
                         self._act, self.width, self.bounds, terms=self.terms, points=self.points, sz=self.sz,
                         rsums=self.rsums, tangents=self.tangents)

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
        v = h[:, self.t] if time == "t" else h[:, self.fixed(time)]
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
        return boundary_row(self.boundary(name, l), self.t, self.T, self.points) if full is None else full[self.t]

    def diag(self, name, ref):
        return self.row(name, ref)[self.t]

    def boundary(self, name, l):
        for (n, ref), v in self.bounds.items():
            if n == name and layer_number(ref, self.l, self.L, self.var, self.depth) == l:
                return v
        raise StructureSpecError(f"{name}[{l}] is neither a hidden layer nor a boundary of {self.mod.SPEC_PATH}")

    def q(self, name, time):
        v = self.q1[name]
        if self.layout:
            return v if time == "s" else self._at(v, time)
        return v if time == "s" else (v[self.t] if time == "t" else v[self.fixed(time)])

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
        if self.layout:                 # a select, not dynamic_update_slice (XLA CPU mis-compiled its fusion with
            return jnp.where(jnp.arange(self.T) == t, v, buf)    # the jvp of a rank-6 layout: LLVM IR failure)
        if buf.ndim == 1:
            return buf.at[t].set(v)
        return _set_col(buf, jnp.broadcast_to(v, buf.shape[:1]), t)

    def col(self, buf, t):
        if self.layout:
            return buf if buf.shape[-1] == 1 else _column(buf, t)
        return buf[..., t]

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


def site_march(mod, act, L: int, T: int, xi: dict, wts, p: dict, *, width: float = 0.1, direct: bool = False,
               pivot_tol: float = _PIVOT_TOL, tangent_wts=None, points: int = 1, normals: dict | None = None,
               sizes: dict | None = None):
    """One march of the generated module ``mod`` on standard normals ``xi`` (source name -> (L, S, T)) with path
    weights ``wts`` (S,) summing to 1 (or 1 per row of an exact basis).  ``act``: (phi, phi', phi'', ...) as
    functions of x; ``p``: parameter values; ``width``: the delta functions' width (where the generated code
    has any).  ``direct``: the readout reads the plain path averages (the saddle of the Monte Carlo action of
    these paths) instead of their Stein's-lemma form.  Returns (rows {(name, l): (T, T) causal rows of kernels
    and responses}, q1 {name: (T,)}, hist {(field, l): (S, T)}, avg {('stein' | 'direct', symbol): (T,)},
    chol {(source, l): (T, T)}).  ``pivot_tol``: residual variance below this fraction of the diagonal counts as
    zero in the sources' Cholesky factors (an exact basis needs the tighter ``deep_dmft._PIVOT_TOL_EXACT``).
    ``tangent_wts``: the weights of the averages of tangents (responses, the Stein term); default ``wts``.  On an
    exact basis (rows = basis directions of the sources, ``wts`` = 1 each, exact for the quadratic averages of
    linear fields) the tangents are the same on every row and their average is any row's: weights 1 / rows.
    ``points``: P of a spec on several training points, whose steps are then the T = (time steps) P pairs
    (time, point) (:class:`Evaluator`).  ``normals``: the values (S,) of the sources constant in time
    (``SITE['normals']``, a two-layer spec's: drawn by the caller from the module's ``source_covariances``), the
    same in every layer; ``sizes``: the sizes of its sample indices (dmftc.runtime.params), whose arrays then
    have the layout of :class:`Evaluator` (q1 (1, index dims, T))."""
    c = _march(mod, act, L, T, xi, wts, p, width=width, direct=direct, pivot_tol=pivot_tol, tangent_wts=tangent_wts,
               points=points, normals=normals, sizes=sizes)
    return c["rows"], c["q1"], c["hist"], c["avg"], c["chol"]


def replay_march(mod, act, L: int, T: int, xi: dict, wts, p: dict, q: dict, **kw) -> dict:
    """The march with the one-time order parameters held at the given trajectories ``q`` ({name: (T,)}) instead
    of solving the readouts: what the saddle-point map makes of them.  Returns the march's state with, besides
    those of :func:`site_march`, 'solved' {name: (T,)} (each readout constraint's solution from the averages
    of these paths, the order parameters read at the same time taken from ``q``), 'paths' {average: (S, T)}
    (its per-path values) and 'dv' {(name, average): (T,)} (the solution's derivative in the average).  At the
    saddle, 'solved' equals ``q``; its Jacobian in ``q`` and the paths' covariance give the propagator
    (dmftc.runtime.site_engine).  A two-layer program (layout) keeps its fields' and running sums' current values
    only; their histories come back too, 'rec_hist' {(field, 1): (S, index dims, T)} and 'rec_sums', for
    :func:`readout_pass`."""
    return _march(mod, act, L, T, xi, wts, p, replay=q, **kw)


def _march(mod, act, L: int, T: int, xi: dict, wts, p: dict, *, width: float = 0.1, direct: bool = False,
           pivot_tol: float = _PIVOT_TOL, tangent_wts=None, points: int = 1, normals: dict | None = None,
           replay: dict | None = None, sizes: dict | None = None):
    """The march (:func:`site_march`; ``replay``: :func:`replay_march`)."""
    site = mod.SITE
    if "terms" not in site:
        raise StructureSpecError(f"{mod.SPEC_PATH}: its generated module predates the site march's path factors; "
                                 "recompile it (dmftc compile)")
    normals = {} if normals is None else normals
    missing = [n for n in site.get("normals", ()) if n not in normals]
    if missing:
        raise StructureSpecError(f"{mod.SPEC_PATH}: no values given for the constant-in-time sources {missing}")
    S = next(iter(xi.values())).shape[1] if xi else jnp.shape(next(iter(normals.values())))[0]
    twts = wts if tangent_wts is None else tangent_wts
    order = schedule(site, L, *layer_names(mod))
    names, terms = site["fields"], site["terms"]
    wrt = tuple(sorted({x for _, x in site["responses"]}))
    resp = dict(site["responses"])
    covs = {x: (fam, off) for x, fam, off in site["sources"]}
    stein = {sym: (f, x) for sym, f, x in site["stein"]}
    fixed = {sym: (o, k) for sym, o, k in site["fixed"]}
    bounds = mod.boundaries(p) if hasattr(mod, "boundaries") else {}
    idx = jnp.arange(T)
    B = Buffers(site, sizes, S, T)
    readout_of = {sym: q for q, syms in site["readouts"] for sym in syms}
    sums = site.get("sums", ())
    layers = range(1, L + 1)
    keep = B.layout and replay is not None
    src0 = {(n, l): B.source(n, v) for n, v in normals.items() for l in layers}     # the same at every step

    def step(t, c):
        hist, tval, dterm, chol, rows, q1, avg = (dict(c[k]) for k in ("hist", "terms", "dterms", "chol", "rows",
                                                                        "q1", "avg"))
        rs = dict(c["rsum"])
        if replay is not None:
            solved, paths, dv = dict(c["solved"]), dict(c["paths"]), dict(c["dv"])
        if keep:
            rec = {k: dict(c[k]) for k in ("rec_hist", "rec_sums")}
            rec["rec_sums"] = {k: B.put(v, rs[k], t) for k, v in rec["rec_sums"].items()}
        src, dcol = dict(src0), {}            # this step's gp sources join the constant ones
        onehot = (idx == t).astype(jnp.float64)

        def ev(l, srcs=src, cur=None, tv=tval):
            return Evaluator(mod, L, T, t, l, hist, rows, q1, srcs, p, act, width, bounds, cur=cur, terms=tv,
                             points=points, sz=sizes, rsums=rs)

        E0 = ev(1)

        def now(l):
            """Layer l's fields at t (zero for those not yet computed at this step)."""
            return {(f, l): B.col(hist[(f, l)], t) for f in names}

        def dnow(l, x):
            """Their tangents in x[l](s), (direction s, paths) each (zero for those not yet computed)."""
            return {(f, l): dcol.get((x, f, l), jnp.zeros((T, S))) for f in names}

        def tangent_at_t(fn, l, x, axis):
            """d fn / d x[l](s) for every s, the direction s on ``axis`` of (paths, T), for an observable of layer
            l's fields at t only (a path factor's, a response's, the Stein term's): the jvp in the fields' values
            at t, whose tangents are those of the current step."""
            return jax.vmap(lambda a: jax.jvp(lambda cur: fn(ev(l, cur=cur)), (now(l),), (a,))[1],
                            in_axes=0, out_axes=axis)(dnow(l, x))

        for kind, name, l in order:
            if kind == "source":
                fam, off = covs[name]
                row = (rows[(fam, l + off)][t] if 1 <= l + off <= L
                       else boundary_row(E0.at(l).boundary(fam, l + off), t, T, points))
                chol[(name, l)] = C = _extend_cholesky(chol[(name, l)], row * (idx <= t), t, pivot_tol)
                src[(name, l)] = xi[name][l - 1] @ C[t]
            elif kind == "field":
                fn = getattr(mod, f"site_field_{name}")
                srcs = {k: v for k, v in src.items() if k[1] == l}
                tl = {k: v for k, v in tval.items() if k[1] == l}

                def value(tv, ss, cs, fn=fn):
                    """The field as a function of layer l's path factors (histories), sources and fields at t."""
                    return fn(ev(l, srcs={**src, **ss}, cur=cs, tv={**tval, **tv}))

                hist[(name, l)] = B.put(hist[(name, l)], value(tl, srcs, now(l)), t)
                for x in wrt:                                   # d field(t) / d x[l](s): (direction s, paths)
                    dt = {k: dterm[(x,) + k].reshape(T, S, T) for k in tl}     # (direction s, paths, time)
                    ds = {k: (onehot[:, None] * jnp.ones((1, S)) if k[0] == x else jnp.zeros((T, S))) for k in srcs}
                    dcol[(x, name, l)] = jax.vmap(lambda a, b, d: jax.jvp(value, (tl, srcs, now(l)), (a, b, d))[1])(
                        dt, ds, dnow(l, x))
            elif kind == "term":
                fn = getattr(mod, f"site_term_{terms.index(name)}")
                tval[(name, l)] = B.put(tval[(name, l)], fn(ev(l, cur=now(l))), t)
                for x in wrt:
                    dterm[(x, name, l)] = _set_col(dterm[(x, name, l)], tangent_at_t(fn, l, x, 0), t)
            elif name in resp:
                d = tangent_at_t(getattr(mod, f"site_response_{name}"), l, resp[name], 1)
                rows[(name, l)] = rows[(name, l)].at[t].set(twts @ d)
            else:
                obs = getattr(mod, f"site_kernel_{name}")(E0.at(l))
                rows[(name, l)] = rows[(name, l)].at[t].set((wts @ jnp.broadcast_to(obs, (S, T))) * (idx <= t))
        EL = E0.at(L)
        now_avg, now_X = {}, {}
        for qname, syms in site["readouts"]:
            for sym in syms:
                if sym in fixed:
                    continue
                now_X[sym] = X = getattr(mod, f"site_average_{sym}")(EL)
                now_avg[sym] = B.mean(wts, X, readout_of[sym])
                avg[("direct", sym)] = B.put(avg[("direct", sym)], now_avg[sym], t)
                if sym in stein:
                    f, x = stein[sym]
                    fam, off = covs[x]
                    Yf = getattr(mod, f"site_stein_{sym}")
                    dY = tangent_at_t(Yf, L, x, 1)
                    cov = (rows[(fam, L + off)][t] if 1 <= L + off <= L
                           else boundary_row(EL.boundary(fam, L + off), t, T, points))
                    val = jnp.sum(cov * (idx <= t) * (twts @ dY)) + wts @ (X - src[(x, L)] * Yf(EL))
                    avg[("stein", sym)] = avg[("stein", sym)].at[t].set(val)
            vals = {}
            for sym in syms:
                base, k = fixed.get(sym, (sym, None))
                kind = "stein" if (base in stein and not direct) else "direct"
                if kind == "direct" and k is None:
                    vals[sym] = now_avg[sym]
                else:
                    vals[sym] = B.col(avg[(kind, base)], t if k is None else k * points + t % points)
            solve = getattr(mod, f"site_constraint_{qname}")
            if replay is None:
                q1[qname] = B.put(q1[qname], solve(EL, vals), t)
                continue
            solved[qname] = B.put(solved[qname], solve(EL, vals), t)
            for sym in syms:
                if sym not in fixed:
                    paths[sym] = B.put(paths[sym], now_X[sym], t)
                unit = {k: jnp.ones_like(v) * float(k == sym) for k, v in vals.items()}    # per component
                dv[(qname, sym)] = B.put(dv[(qname, sym)], jax.jvp(lambda v: solve(EL, v), (vals,), (unit,))[1], t)
        E1 = ev(1)                  # the running sums advance by their increments at t (order parameters at t known)
        incs = {(n, l): getattr(mod, f"site_increment_{k}")(E1.at(l)) for k, (n, _) in enumerate(sums)
                for l in layers}
        out = {"hist": hist, "terms": tval, "dterms": dterm, "chol": chol, "rows": rows, "q1": q1, "avg": avg,
               "rsum": {k: v + incs[k] for k, v in rs.items()}}
        if replay is not None:
            out.update(solved=solved, paths=paths, dv=dv)
        if keep:
            rec["rec_hist"] = {k: B.put(v, hist[k], t) for k, v in rec["rec_hist"].items()}
            out.update(rec)
        return out

    c0 = {"hist": {(f, l): B.zeros(f, S, current=B.layout) for f in names for l in layers},
          "terms": {(n, l): B.zeros(None, S) for n in terms for l in layers},
          "dterms": {(x, n, l): jnp.zeros((T * S, T)) for x in wrt for n in terms for l in layers},
          "chol": {(x, l): jnp.zeros((T, T)) for x, _, _ in site["sources"] for l in layers},
          "rows": {(q, l): jnp.zeros((T, T)) for q in site["kernels"] + tuple(resp) for l in layers},
          "q1": {q: B.zeros(q) for q, _ in site["readouts"]},
          "avg": {(k, sym): B.zeros(q) for q, syms in site["readouts"] for sym in syms if sym not in fixed
                  for k in ("stein", "direct") if k == "direct" or sym in stein}}
    c0["rsum"] = {(n, l): B.zeros(n, S if scope == "sample" else None, current=True) for n, scope in sums
                  for l in layers}
    if keep:                        # the current-only buffers' histories, for the readout pass
        c0["rec_hist"] = {k: B.zeros(k[0], S) for k in c0["hist"]}
        c0["rec_sums"] = {(n, l): B.zeros(n, S if scope == "sample" else None) for n, scope in sums for l in layers}
    if replay is not None:
        c0["q1"] = {q: jnp.broadcast_to(jnp.asarray(replay[q], jnp.float64), B.zeros(q).shape)
                    for q, _ in site["readouts"]}
        c0.update(solved={q: B.zeros(q) for q, _ in site["readouts"]},
                  paths={sym: B.zeros(q, S) for q, syms in site["readouts"] for sym in syms if sym not in fixed},
                  dv={(q, sym): B.zeros(q) for q, syms in site["readouts"] for sym in syms})
    return jax.lax.fori_loop(0, T, step, c0)



def readout_pass(mod, T: int, wts, p: dict, q: dict, hist: dict, *, normals: dict, sizes: dict | None = None,
                 width: float = 0.0, rsums: dict | None = None) -> dict:
    """The readouts of a one-time program (a two-layer spec's: no kernels, responses or Stein plans) on fixed
    field histories ``hist`` ({(field, 1): buffer}, as a march left them) with the order parameters held at
    ``q`` (``rsums``: the running sums' histories, likewise fixed): {name: buffer} of each readout constraint's
    solution, as :func:`replay_march` computes it.  The
    fields do not read the order parameters outside ``SITE['drivers']``; their derivatives in the solutions
    come from this pass alone (dmftc.runtime.site_engine)."""
    site = mod.SITE
    if site["kernels"] or site["responses"] or site["stein"] or site["fixed"]:
        raise StructureSpecError(f"{mod.SPEC_PATH}: the readout pass is that of a one-time program")
    S = jnp.shape(wts)[0]
    B = Buffers(site, sizes, S, T)
    src = {(n, 1): B.source(n, v) for n, v in normals.items()}
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), B.zeros(n).shape) for n, _ in site["readouts"]}

    def step(t, solved):
        E = Evaluator(mod, 1, T, t, 1, hist, {}, q1, src, p, (), width, {}, sz=sizes, rsums=rsums)
        solved = dict(solved)
        for name, syms in site["readouts"]:
            vals = {sym: B.mean(wts, getattr(mod, f"site_average_{sym}")(E), name) for sym in syms}
            solved[name] = B.put(solved[name], getattr(mod, f"site_constraint_{name}")(E, vals), t)
        return solved

    return jax.lax.fori_loop(0, T, step, {n: B.zeros(n) for n, _ in site["readouts"]})


def constraint_pass(mod, T: int, p: dict, q: dict, avg: dict, *, sizes: dict | None = None,
                    width: float = 0.0) -> dict:
    """Each readout constraint's solution over the whole trajectory from fixed single-site averages ``avg``
    ({average: buffer}) with the order parameters at ``q``, the running sums of order parameters recomputed from
    ``q``: the deterministic part of the saddle-point map, whose second derivative the O(1/N) mean correction
    needs (dmftc.runtime.site_engine).  A one-time program only (as :func:`readout_pass`)."""
    site = mod.SITE
    B = Buffers(site, sizes, 1, T)
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), B.zeros(n).shape) for n, _ in site["readouts"]}
    order = [(k, n) for k, (n, scope) in enumerate(site.get("sums", ())) if scope == "order"]

    def step(t, c):
        solved, rs = dict(c[0]), c[1]
        E = Evaluator(mod, 1, T, t, 1, {}, {}, q1, {}, p, (), width, {}, sz=sizes, rsums=rs)
        for name, syms in site["readouts"]:
            vals = {sym: B.col(avg[sym], t) for sym in syms}
            solved[name] = B.put(solved[name], getattr(mod, f"site_constraint_{name}")(E, vals), t)
        return solved, {(n, 1): rs[(n, 1)] + getattr(mod, f"site_increment_{k}")(E) for k, n in order}

    c0 = ({n: B.zeros(n) for n, _ in site["readouts"]}, {(n, 1): B.zeros(n, None, current=True) for _, n in order})
    return jax.lax.fori_loop(0, T, step, c0)[0]
