"""Deep specs on several training points: the point index, checked and folded into time.

A deep spec may declare a point index, ``index mu, nu in 1..P``, and then writes every per-neuron quantity with
it: fields and sources ``h[l, mu](t)``, ``u[l, mu] ~ gp(0, Phi[l-1])`` (a Gaussian process over (point, time)),
kernels and responses between two points at two times ``Phi[l, mu, nu](t, s)``, the error signal
``Delta[mu](t)`` and same-time pair quantities such as the NTK ``K[mu, nu](t)``; array parameters have the point
count as their dimensions (``param Kx[P, P]``, ``param y[P]``).  A sum over earlier times pairs with a sum over
the points, ``sum(s < t: sum(nu: A[l-1, mu, nu](t, s) g[l, nu](s)))``: in a network trained on P points every
update is a sum over them.

This stage checks that every point index is the one its time argument carries (the equation's own point mu at
its time t, the summed point nu at the summed time s; located errors otherwise) and then folds the point into
time: the runtime orders the pairs (time, point) as one index tau = t P + mu, causal in t, so that a kernel
Phi[l](tau, sigma) is a (T P) x (T P) matrix, a sum over s < t and nu is one causal sum over sigma, and the spec
below this stage reads like a one-point deep spec (:mod:`dmftc.frontend.check_deep` and every later stage run
on it unchanged).  What the fold needs at run time is recorded in :class:`PointAxis` (which parameters and
one-time order parameters carry the point, and how many).

Test points: a network is trained on some of the points only, and the others are read out (predictions, their
errors and their kernels with the training points).  A one-point parameter at the summed point of a field's
update, ``sum(nu: m[nu] Delta[nu](s) Phi[l-1, mu, nu](t, s) g[l, nu](s))``, is the update mask: 1 on a training
point, 0 on a point the network never trains on.  It must multiply the error signal's term of every field that
reads the error signal at the summed point; the fold removes it from the expression and records it
(``PointAxis.mask``), and the runtime drops the updates of the masked points (their couplings at s; their
responses vanish with them).  The error signal of a masked point is still its order parameter: e.g. its
residual y - f, the test error.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dmftc.frontend import ast
from dmftc.errors import NameSpecError, ShapeSpecError, SpecError, StructureSpecError

__all__ = ["PointAxis", "fold_points"]

_HINT = ("quantities at the equation's time t carry its point index; a sum over earlier times pairs with a sum "
         "over the points, e.g. sum(s < t: sum(nu: A[l-1, mu, nu](t, s) g[l, nu](s)))")


@dataclass(frozen=True)
class PointAxis:
    """The point index of a deep spec: its names, the size parameter, and the number of point indices (1 or 2)
    of each array parameter and one-time order parameter (``params``, ``orders``: ((name, count), ...))."""

    names: tuple[str, ...]
    size: str
    params: tuple[tuple[str, int], ...]
    orders: tuple[tuple[str, int], ...]
    mask: str | None = None          # the update mask (module doc): a parameter with one point index


@dataclass(frozen=True)
class _Ctx:
    """Which point each time variable carries (``bind``), and the pair (points, time) of a same-time pair
    quantity's equation (``pair``)."""

    bind: tuple = ()                 # ((time var, point index), ...)
    pair: tuple | None = None        # ((a, b), time var)
    own: tuple = ()                  # the point indices of the equation's own left-hand side (parameters)

    def at(self, time):
        return dict(self.bind).get(time)

    def with_bind(self, **kw):
        return dataclasses.replace(self, bind=tuple({**dict(self.bind), **kw}.items()))


class _Fold:
    def __init__(self, spec: ast.Spec, err):
        self.spec, self.err = spec, err
        ix = spec.indices[0]
        self.names, self.size, self.decl = tuple(ix.names), ix.size, ix
        self.layer = spec.layers[0].var

    # ------------------------------------------------------------ helpers
    def fail(self, cls, msg, pos, hint=None):
        raise self.err(cls, msg, pos, hint=hint)

    def point(self, i, where, pos):
        if i not in self.names:
            self.fail(ShapeSpecError, f"'{i}' in {where} is not a point index", pos,
                      hint=f"the point indices are {', '.join(self.names)} (index ... in 1..{self.size})")
        return i

    def split(self, name, indices, pos, layered: bool, count: int):
        """(layer part, point part) of ``name[indices]`` that carries a layer index (``layered``) and ``count``
        point indices."""
        want = (1 if layered else 0) + count
        if len(indices) != want:
            shape = ", ".join(([self.layer] if layered else []) + list(self.names[:count] or ("mu",)))
            pts = {0: "no point index", 1: "one point index", 2: "two point indices"}[count]
            self.fail(ShapeSpecError, f"'{name}' takes {'the layer index and ' if layered else ''}{pts}", pos,
                      hint=f"write {name}[{shape}]" if want else f"write {name} without indices")
        lay, pts = tuple(indices[:1]) if layered else (), tuple(indices[1:] if layered else indices)
        for i in pts:
            self.point(i, f"'{name}[{', '.join(indices)}]'", pos)
        if len(set(pts)) != len(pts):
            self.fail(ShapeSpecError, f"the point indices of '{name}' must differ", pos,
                      hint=f"declare {name}[{', '.join(([self.layer] if layered else []) + list(self.names[:count]))}]")
        return lay, pts

    # ------------------------------------------------------------ declarations
    def run(self):
        s = self.spec
        if len(s.indices) > 1:
            self.fail(StructureSpecError, "a deep spec declares one point index", s.indices[1].pos,
                      hint=f"name both in one line: 'index {', '.join(self.names)}, ... in 1..{self.size}'")
        ix = self.decl
        if ix.start != 1:
            self.fail(SpecError, "index ranges start at 1", ix.pos, hint=f"write 'in 1..{ix.size}'")
        size = next((p for p in s.params if p.name == ix.size), None)
        if size is None or size.dims:
            self.fail(NameSpecError, f"the number of points '{ix.size}' is not a scalar parameter", ix.pos,
                      hint=f"declare it first, e.g. 'param {ix.size} = 3 \"training points\"'")
        v = size.default
        if not (isinstance(v, ast.Num) and float(v.value).is_integer() and v.value >= 1):
            self.fail(ShapeSpecError, f"the number of points '{size.name}' must be an integer >= 1", v.pos,
                      hint=f"write e.g. 'param {size.name} = 3'")
        self.params = {}
        params = []
        for p in s.params:
            if p.dims:
                if len(p.dims) > 2 or any(d != ix.size for d in p.dims):
                    self.fail(ShapeSpecError, f"array parameter '{p.name}' of a deep spec has one or two dimensions "
                              f"of size '{ix.size}'", p.pos, hint=f"write 'param {p.name}[{ix.size}]' or "
                              f"'param {p.name}[{ix.size}, {ix.size}]'")
                self.params[p.name] = len(p.dims)
            params.append(dataclasses.replace(p, dims=()))
        self.orders, self.counts = {}, {}
        orders = []
        for o in s.orders:
            if o.time2 is not None:
                lay, pts = self.split(o.name, o.indices, o.pos, True, 2)
                self.counts[o.name] = 2
                orders.append(dataclasses.replace(o, indices=lay))
            else:
                if not o.indices:
                    self.fail(ShapeSpecError, f"order parameter '{o.name}' of a deep spec on several points carries "
                              "the point index", o.pos, hint=f"write {o.name}[{self.names[0]}]({o.time}), or "
                              f"{o.name}[{', '.join(self.names[:2])}]({o.time}) for a same-time pair such as the NTK")
                if len(o.indices) > 2:
                    self.split(o.name, o.indices, o.pos, False, 2)
                _, pts = self.split(o.name, o.indices, o.pos, False, len(o.indices))
                self.orders[o.name] = self.counts[o.name] = len(pts)
                orders.append(dataclasses.replace(o, indices=()))
        sources = []
        for src in s.sources:
            tgts = []
            for tg in src.targets:
                lay, _ = self.split(tg.name, tg.indices, tg.pos, True, 1)
                self.counts[tg.name] = 1
                tgts.append(dataclasses.replace(tg, indices=lay))
            sources.append(dataclasses.replace(src, targets=tuple(tgts)))
        for f in s.fields:               # responses (two times, undeclared) and fields carry 2 and 1 points
            if f.name not in self.counts and f.name not in self.params:
                self.counts[f.name] = 2 if f.time2 is not None else 1
        self.masks, self.updates = {}, {}             # field -> (mask name, pos); field -> pos of its update term
        fields = [self.equation(f) for f in s.fields]
        mask = self.check_mask()
        actions = [dataclasses.replace(a, body=self.expr(a.body, _Ctx())) for a in s.actions]
        folded = dataclasses.replace(s, params=tuple(params), indices=(), orders=tuple(orders),
                                     sources=tuple(sources), fields=tuple(fields), actions=tuple(actions))
        axis = PointAxis(self.names, ix.size, tuple(self.params.items()), tuple(self.orders.items()), mask)
        return folded, axis

    def equation(self, f):
        self.field = f.name
        n = self.counts.get(f.name, 1)
        layered = f.name not in self.orders
        lay, pts = self.split(f.name, f.indices, f.pos, layered, n)
        if n == 2 and f.time2 is None:                           # a same-time pair, K[mu, nu](t)
            ctx = _Ctx(pair=(pts, f.time), own=pts)
        else:
            times = (f.time, f.time2) if f.time2 is not None else (f.time,)
            ctx = _Ctx(bind=tuple(zip(times, pts)), own=pts)
        return dataclasses.replace(f, indices=lay, body=self.expr(f.body, ctx))

    # ------------------------------------------------------------ expressions
    def expr(self, e, ctx: _Ctx):
        rec = lambda x, c=ctx: self.expr(x, c)        # noqa: E731
        if isinstance(e, ast.IndexSum):
            return self.index_sum(e, ctx)
        if isinstance(e, (ast.TimeSum, ast.Integral)):
            b = e.body
            if _causal(e) and isinstance(b, ast.IndexSum) and len(b.indices) == 1:   # sum(s < t: sum(nu: x))
                return dataclasses.replace(e, body=self.paired(b, e.var, b.body, ctx))
            return dataclasses.replace(e, body=rec(b))
        if isinstance(e, ast.Call) and e.name in self.counts:
            return self.reference(e, ctx)
        if isinstance(e, ast.Call) and e.name == "trace" and all(
                isinstance(a, ast.Indexed) and len(a.indices) == 1 for a in e.args):
            return e                 # trace(A[l], B[l+1]): over points and times alike (the pairing -Tr(A B))
        if isinstance(e, ast.Hat) and e.name in self.counts:
            layered = e.name not in self.orders
            lay, _ = self.split(e.name, e.indices, e.pos, layered, self.counts[e.name])
            return dataclasses.replace(e, indices=lay)
        if isinstance(e, ast.Indexed) and e.name in self.params:
            return self.parameter(e, ctx)
        if isinstance(e, ast.Indexed) and e.name in self.counts:
            self.fail(ShapeSpecError, f"'{e.name}' needs its time argument{'s' if self.counts[e.name] == 2 else ''}",
                      e.pos, hint=_HINT)
        if isinstance(e, ast.Name) and e.name in self.names:
            self.fail(ShapeSpecError, f"the point index '{e.name}' is not a value", e.pos,
                      hint="point indices label fields, kernels and parameters, e.g. y[mu]")
        if isinstance(e, ast.Name) and e.name in self.params:
            self.fail(ShapeSpecError, f"array parameter '{e.name}' needs its point "
                      f"ind{'ices' if self.params[e.name] == 2 else 'ex'}", e.pos,
                      hint=f"write {e.name}[{', '.join(self.names[:self.params[e.name]])}]")
        if isinstance(e, (ast.Call, ast.PrimeCall)):
            return dataclasses.replace(e, args=tuple(rec(a) for a in e.args))
        if isinstance(e, ast.BinOp):
            return dataclasses.replace(e, left=rec(e.left), right=rec(e.right))
        if isinstance(e, ast.Neg):
            return dataclasses.replace(e, operand=rec(e.operand))
        if isinstance(e, (ast.Expectation, ast.LayerSum)):
            return dataclasses.replace(e, body=rec(e.body))
        if isinstance(e, ast.Response):
            return dataclasses.replace(e, of=rec(e.of), wrt=rec(e.wrt))
        if isinstance(e, ast.Matrix):
            return dataclasses.replace(e, rows=tuple(rec(r) for r in e.rows))
        return e

    def index_sum(self, e, ctx: _Ctx):
        """sum(nu: ...) paired with a causal time sum directly inside or around it binds that sum's time to nu;
        sum(mu, nu: ...) over terms with duals (the action) binds the duals' times to their points."""
        for i in e.indices:
            self.point(i, "a sum", e.pos)
            if i in dict(ctx.bind).values() or (ctx.pair and i in ctx.pair[0]):
                self.fail(ShapeSpecError, f"the point index '{i}' is already in use here", e.pos,
                          hint="sum over another point index")
        inner = e.body
        if _causal(inner) and len(e.indices) == 1:               # sum(nu: sum(s < t: x))
            return dataclasses.replace(inner, body=self.paired(e, inner.var, inner.body, ctx))
        bind, pair = {}, None
        for node in ast.walk(inner):
            if isinstance(node, ast.Hat) and node.name in self.counts:
                layered = node.name not in self.orders
                _, pts = self.split(node.name, node.indices, node.pos, layered, self.counts[node.name])
                if node.time2 is None and len(pts) == 2:
                    pair = (pts, node.time)
                    continue
                for tm, p in zip((node.time, node.time2), pts):
                    if bind.setdefault(tm, p) != p:
                        self.fail(ShapeSpecError, f"the time '{tm}' carries the points '{bind[tm]}' and '{p}' in one "
                                  "sum", node.pos, hint=_HINT)
        if not bind and pair is None:
            self.fail(StructureSpecError, f"a sum over the points {', '.join(e.indices)} pairs with a sum over "
                      "earlier times (or, in the action, with the duals of the order parameters)", e.pos, hint=_HINT)
        new = ctx.with_bind(**bind)
        if pair is not None:
            new = dataclasses.replace(new, pair=pair, own=pair[0])
        elif bind:
            new = dataclasses.replace(new, own=tuple(bind.values())[:1])
        return self.expr(inner, new)

    def paired(self, e, time, body, ctx: _Ctx):
        """The body of a sum over one point index paired with the causal sum over ``time``."""
        (i,) = e.indices
        self.point(i, "a sum", e.pos)
        if i in dict(ctx.bind).values() or (ctx.pair and i in ctx.pair[0]):
            self.fail(ShapeSpecError, f"the point index '{i}' is already in use here", e.pos,
                      hint="sum over another point index")
        return self.expr(self.strip_mask(body, time, i), ctx.with_bind(**{time: i}))

    # ------------------------------------------------------------ the update mask (test points)
    def strip_mask(self, body, time, i):
        """``body`` of a field's update sum over the point ``i`` at ``time`` without its update-mask factors
        (module doc), recorded with the terms that read the error signal at (i, time)."""
        terms, stripped = [], False
        for sign, term in _terms(body):
            factors = _factors(term)
            masks = [f for f in factors if isinstance(f, ast.Indexed) and self.params.get(f.name) == 1
                     and tuple(f.indices) == (i,)]
            signal = [f for f in factors if isinstance(f, ast.Call) and self.orders.get(f.name) == 1
                      and tuple(f.indices) == (i,) and len(f.args) == 1 and isinstance(f.args[0], ast.Name)
                      and f.args[0].name == time]
            if signal:
                self.updates.setdefault(self.field, signal[0].pos)
            if masks:
                m = masks[0]
                if len(masks) > 1 or not signal:
                    self.fail(ShapeSpecError, f"'{ast.to_text(m)}': a parameter of the summed point '{i}' is an "
                              "update mask and multiplies the error signal's term only", m.pos,
                              hint=f"write e.g. sum({i}: {m.name}[{i}] Delta[{i}]({time}) Phi[l-1, mu, {i}](t, {time}) "
                                   f"g[l, {i}]({time})); other parameters are read with the equation's own point")
                self.masks.setdefault(self.field, (m.name, m.pos))
                term, stripped = _product([f for f in factors if f is not m], m.pos), True
            terms.append((sign, term))
        return _sum(terms) if stripped else body

    def check_mask(self):
        """The update mask's name (None without one): one parameter, in every field that reads the error signal
        at a summed point."""
        if not self.masks:
            return None
        names = {n for n, _ in self.masks.values()}
        if len(names) > 1:
            n, pos = sorted(self.masks.values(), key=lambda v: (v[1].line, v[1].col))[-1]
            self.fail(ShapeSpecError, f"one update mask for every field: the spec uses {', '.join(sorted(names))}",
                      pos, hint="a point is trained on or not, in every layer and field alike")
        (name,) = names
        for field, pos in self.updates.items():
            if field not in self.masks:
                self.fail(ShapeSpecError, f"the update of '{field}' lacks the update mask '{name}' that the other "
                          "fields' updates carry", pos,
                          hint=f"multiply its error-signal term by {name}[...] too: a test point updates no layer")
        return name

    def reference(self, e, ctx: _Ctx):
        name, n = e.name, self.counts[e.name]
        layered = name not in self.orders
        lay, pts = self.split(name, e.indices, e.pos, layered, n)
        times = [a.name if isinstance(a, ast.Name) else None for a in e.args]
        shown = f"{name}[{', '.join(e.indices)}]({', '.join(ast.to_text(a) for a in e.args)})"
        if n == 2 and (len(times) == 1 or (ctx.pair and times[0] == times[1] == ctx.pair[1])):
            if ctx.pair is None or tuple(pts) != tuple(ctx.pair[0]) or times[0] != ctx.pair[1]:
                self.fail(ShapeSpecError, f"'{shown}': a same-time pair of points is read only in the equation of a "
                          "pair quantity, with its own points", e.pos,
                          hint="e.g. K[mu, nu](t) = sum(l = 0..L: G[l+1, mu, nu](t, t) Phi[l, mu, nu](t, t))")
        else:
            for tm, p in zip(times, pts):
                want = ctx.at(tm) if tm is not None else None
                if tm is None:                       # a fixed time, e.g. z[L, mu](0): a point in use
                    if p not in dict(ctx.bind).values():
                        self.fail(ShapeSpecError, f"'{shown}': the point '{p}' is not one of this equation's", e.pos,
                                  hint=_HINT)
                elif want is None:
                    self.fail(ShapeSpecError, f"'{shown}': no point is paired with the time '{tm}'", e.pos,
                              hint=_HINT)
                elif want != p:
                    self.fail(ShapeSpecError, f"'{shown}': at the time '{tm}' the point is '{want}', not '{p}'", e.pos,
                              hint=_HINT)
        return dataclasses.replace(e, indices=lay, args=tuple(self.expr(a, ctx) for a in e.args))

    def parameter(self, e, ctx: _Ctx):
        n = self.params[e.name]
        _, pts = self.split(e.name, e.indices, e.pos, False, n)
        if tuple(pts) != tuple(ctx.own[:n]) or len(ctx.own) < n:
            own = ", ".join(ctx.own) if ctx.own else "none"
            self.fail(ShapeSpecError, f"'{ast.to_text(e)}': a parameter with point indices is read with the points of "
                      f"its equation ({own})", e.pos,
                      hint="two-point parameters such as the input Gram matrix enter through a boundary kernel: "
                           "Phi[0, mu, nu](t, s) = Kx[mu, nu]")
        return ast.Name(e.pos, e.name)


def _causal(e) -> bool:
    """A sum over earlier times: sum(s < t: x), sum(s <= t: x), integral(x, s < t)."""
    return isinstance(e, ast.TimeSum) or (isinstance(e, ast.Integral) and e.cmp is not None)


def fold_points(spec: ast.Spec, err):
    """(the spec with its point index folded into time, :class:`PointAxis`), or (spec, None) without one.
    ``err(cls, msg, pos, hint=None)`` builds a located error."""
    if not spec.indices:
        return spec, None
    fold = _Fold(spec, err)
    return fold.run()


def _terms(e, sign=1):
    """((sign, term), ...) of a sum."""
    if isinstance(e, ast.BinOp) and e.op in "+-":
        return _terms(e.left, sign) + _terms(e.right, sign if e.op == "+" else -sign)
    if isinstance(e, ast.Neg):
        return _terms(e.operand, -sign)
    return [(sign, e)]


def _factors(e):
    """The factors of a product (a quotient's numerator split, its denominator one factor)."""
    if isinstance(e, ast.BinOp) and e.op == "*":
        return _factors(e.left) + _factors(e.right)
    if isinstance(e, ast.BinOp) and e.op == "/":
        return _factors(e.left) + [ast.BinOp(e.pos, "/", ast.Num(e.pos, 1.0), e.right)]
    return [e]


def _product(factors, pos):
    out = factors[0] if factors else ast.Num(pos, 1.0)
    for f in factors[1:]:
        out = ast.BinOp(out.pos, "*", out, f)
    return out


def _sum(terms):
    out = None
    for sign, t in terms:
        if out is None:
            out = t if sign > 0 else ast.Neg(t.pos, t)
        else:
            out = ast.BinOp(out.pos, "+" if sign > 0 else "-", out, t)
    return out
