"""The saddle-point march of a deep spec read from its IR: the single-site process as the spec writes it.

Where :mod:`dmftc.runtime.deep_dmft` marches a fixed structure (forward field h, backward field z, g = phi'(h) z,
with the spec supplying coupling coefficients, boundaries and readout), this march evaluates the spec's own
field equations, kernels, responses and constraints from :class:`dmftc.ir.ModelIR` (issue 12: one engine that
reads the spec).  Per time step t, with every layer's quantities scheduled by their same-time dependencies
(found in the expressions: a field reads its layer's fields at t, its source, whose covariance row t is a
neighbouring layer's kernel, and kernel and response rows t of neighbouring layers):

* a gp source ``x[l] ~ gp(0, Q[l+k])`` is extended causally, x(t) = sum_{s<=t} C(t, s) xi(s), the Cholesky factor
  C of Q[l+k] growing by its row t (boundary layers: the constant boundary value);
* a field is its expression with fields at t (paths,), fields at the earlier time s inside a causal sum (paths,
  T), kernels and responses at (t, s) (rows t, (T,)) and one-time order parameters at s (T,);
* a two-time order parameter's row t is the weighted path average of its observable at (t, s <= t);
* a response ``R[l](t, s) = <d X(t) / d x[l](s)>`` is the average of forward-mode tangents: every field of the
  layer carries its derivative with respect to an additive perturbation of the source x[l] at each earlier
  time s (JAX jvp of the same expression, the order parameters held fixed);
* a constraint ``coeff q(t) + rest = 0`` whose rest reads single-site averages (the readout) gives q(t) last.

Scalar constraints that read no single-site average (K(t) from the kernels' diagonals) are not part of the
march.  The march is the exact saddle of the Monte Carlo action of the given paths with the direct readout, as
``dmftc.runtime.deep_dmft.march_paths``; the tests check the two marches agree to round-off on the same paths.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

from dmftc.errors import StructureSpecError
from dmftc.runtime.deep_dmft import _PIVOT_TOL, _extend_cholesky

jax.config.update("jax_enable_x64", True)

__all__ = ["SiteProgram", "site_march"]

_NAME = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(?:\[([^\]]+)\])?$")


def _split(name: str) -> tuple[str, str | None]:
    m = _NAME.match(name)
    return m.group(1), m.group(2)


def _layer(ref: str | None, l: int, L: int, var: str, depth: str) -> int:
    """The layer number of a reference such as 'l-1', 'L+1', '0' inside layer l of L."""
    text = ref.replace(" ", "")
    m = re.match(r"^([A-Za-z_][A-Za-z_0-9]*)?([+-]?[0-9]+)?$", text)
    base = {var: l, depth: L}.get(m.group(1), 0) if m.group(1) else 0
    return base + int(m.group(2) or 0)


@dataclass(frozen=True)
class SiteProgram:
    """What the march needs from a deep spec's IR (names as the spec writes them)."""
    fields: tuple             # (name, expr) in the spec's dependency order
    sources: dict             # source name -> (covariance family, layer offset)
    families: dict            # two-time average name -> observable expr (in t and s)
    responses: dict           # response name -> (observable expr at t, source name)
    readouts: tuple           # (name, coeff, rest, ((symbol, expr), ...)) constraints read in the march
    stein: dict               # average symbol -> (field, source, Y): <X> by Stein's lemma (see _stein_plan)
    at_fixed_time: dict       # average symbol -> (t-form symbol, time): <X(t)> taken at a fixed time
    boundaries: dict          # (name, layer text) -> value
    layer_var: str
    depth: str
    activation: str
    time: str
    params: tuple

    @classmethod
    def from_ir(cls, ir) -> "SiteProgram":
        if ir.kind != "deep":
            raise StructureSpecError("the site march reads deep specs (a layer axis); this spec has none")
        lay = next(a for a in ir.axes if a.kind == "layer")
        fams = {o.name: o.observable for o in ir.orders if o.kind == "average" and o.times == 2}
        resp = {o.name: (o.observable, o.wrt) for o in ir.orders if o.kind == "response"}
        reads = tuple((o.name, o.coeff, o.rest, tuple((a.symbol, a.expr) for a in o.averages))
                      for o in ir.orders if o.kind == "constraint" and o.averages)
        srcs = {}
        for s in ir.sources:
            (name, _), = s.targets
            srcs[name] = (s.depends_on[0], s.layer_offset)
        bnd = {(b.name, b.layer): b.value for b in ir.boundaries}
        fields = tuple((f.name, f.expr) for f in ir.fields)
        tsym = sp.Symbol(ir.time[0])
        stein, fixed = {}, {}
        for _, _, _, avgs in reads:
            for sym, expr in avgs:
                plan = _stein_plan(expr, dict(fields), srcs, {w for _, w in resp.values()}, tsym)
                if plan is not None:
                    stein[sym] = plan
            for sym, expr in avgs:
                if sym in stein or tsym in expr.free_symbols:
                    continue
                for other, oexpr in avgs:
                    if other in stein:
                        times = {int(a) for a in _times(expr)}
                        if len(times) == 1 and sp.simplify(oexpr.subs(tsym, next(iter(times))) - expr) == 0:
                            fixed[sym] = (other, next(iter(times)))
        return cls(fields, srcs, fams, resp, reads, stein, fixed, bnd, lay.name, lay.size,
                   ir.activations[0][0], ir.time[0], ir.params)


def _times(expr):
    """The time arguments of the one-argument function applications (fields) in ``expr``."""
    return [a.args[0] for a in expr.atoms(sp.core.function.AppliedUndef) if len(a.args) == 1]


def _stein_plan(X, fields: dict, sources: dict, tangents: set, tsym):
    """How to average X(t) (a readout average, fields at time t) with Stein's lemma: X is linear in a field
    F(t) whose equation is F = x(t) + (terms without x(t)) for a gp source x whose tangents the march carries, so
    E[X] = sum_{s<=t} Cov_x(t, s) E[dY / dx(s)] + E[X - x(t) Y] with Y = dX / dF(t) (the first term is the exact
    Gaussian integration by parts of E[x(t) Y]; the second is averaged on the paths).  This is the estimator whose
    Monte Carlo error does not grow like 1/gamma at small gamma.  Returns (F, x, Y) or None (then X is averaged
    directly)."""
    for app in sorted(X.atoms(sp.core.function.AppliedUndef), key=str):
        base, _ = _split(type(app).__name__)
        if base not in fields or app.args != (tsym,):
            continue
        if sp.diff(X, app, 2) != 0:
            continue
        for xname in sources:
            if xname not in tangents:
                continue
            xs = [a for a in fields[base].atoms(sp.core.function.AppliedUndef)
                  if _split(type(a).__name__)[0] == xname and a.args == (tsym,)]
            if len(xs) == 1 and sp.diff(fields[base], xs[0]) == 1 and sp.diff(fields[base], xs[0], 2) == 0:
                return base, xname, sp.diff(X, app)
    return None


class _Eval:
    """SymPy expression -> JAX value at one step (traced once under jit).

    ``vec``: inside a causal sum (or a two-time observable) the earlier time s runs over the last axis: fields at
    s are (paths, T) histories, fields at t (paths, 1), rows (T,)."""

    def __init__(self, prog: SiteProgram, L, t, l, hist, rows, q1, src, p, act, T):
        self.prog, self.L, self.t, self.l = prog, L, t, l
        self.hist, self.rows, self.q1, self.src, self.p, self.act, self.T = hist, rows, q1, src, p, act, T
        self.tsym, self.ssym = sp.Symbol(prog.time), sp.Symbol("s")
        self.fields = {n for n, _ in prog.fields}
        self.two_time = set(prog.families) | set(prog.responses)

    def layer(self, ref):
        return _layer(ref, self.l, self.L, self.prog.layer_var, self.prog.depth)

    def time_of(self, a):
        """'t', 's' or an integer time."""
        if a == self.tsym:
            return "t"
        if a == self.ssym:
            return "s"
        return int(a)

    def __call__(self, e, vec=False):
        c = lambda x: self(x, vec)  # noqa: E731
        if e.is_Number:
            return float(e)
        if isinstance(e, sp.Symbol):
            return self.p[e.name]
        if isinstance(e, sp.Add):
            out = c(e.args[0])
            for a in e.args[1:]:
                out = out + c(a)
            return out
        if isinstance(e, sp.Mul):
            out = c(e.args[0])
            for a in e.args[1:]:
                out = out * c(a)
            return out
        if isinstance(e, sp.Pow):
            return c(e.base) ** c(e.exp)
        if isinstance(e, sp.Sum):
            body = self(e.function, True)
            (_, lo, hi), = e.limits
            idx = jnp.arange(self.T)
            mask = (idx < self.t) if hi != self.tsym else (idx <= self.t)
            body = jnp.broadcast_to(body, jnp.shape(body)[:-1] + (self.T,)) if jnp.ndim(body) else \
                jnp.full((self.T,), body)
            return jnp.sum(jnp.where(mask, body, 0.0), axis=-1)
        if isinstance(e, sp.core.function.AppliedUndef) or \
                type(e).__name__.rstrip("'") == self.prog.activation:
            return self.apply(e, vec)
        fn = getattr(jnp, type(e).__name__.lower(), None)
        if fn is None:
            raise StructureSpecError(f"the site march cannot evaluate {e}")
        return fn(*[c(a) for a in e.args])

    def apply(self, e, vec):
        name = type(e).__name__
        order = len(name) - len(name.rstrip("'"))
        if name.rstrip("'") == self.prog.activation:
            return self.act[order](self(e.args[0], vec))
        base, ref = _split(name)
        times = [self.time_of(a) for a in e.args]
        if base in self.fields:
            l = self.layer(ref) if ref else self.l
            h = self.hist[(base, l)]
            (tm,) = times
            if tm == "s":
                return h
            v = h[:, self.t] if tm == "t" else h[:, tm]
            return v[:, None] if vec else v
        if base in self.prog.sources:
            return self.src[(base, self.layer(ref))]
        if base in self.two_time:
            l = self.layer(ref)
            full = self.rows.get((base, l))
            row = jnp.full((self.T,), self.boundary(base, l)) if full is None else full[self.t]
            if times == ["t", "s"]:
                return row
            if times == ["t", "t"]:
                return row[self.t]
            raise StructureSpecError(f"the site march reads two-time order parameters at (t, s), not {e}")
        if base in self.q1:
            (tm,) = times
            if tm == "s":
                return self.q1[base]
            return self.q1[base][self.t] if tm == "t" else self.q1[base][tm]
        raise StructureSpecError(f"the site march cannot evaluate {e}")

    def boundary(self, name, l):
        for (n, ref), v in self.prog.boundaries.items():
            if n == name and _layer(ref, self.l, self.L, self.prog.layer_var, self.prog.depth) == l:
                return float(v)
        raise StructureSpecError(f"{name}[{l}] is neither a layer of the march nor a boundary")


def _refs(prog: SiteProgram, expr, tsym):
    """(kind, base, layer ref, same_time) of every function application in ``expr``: kind 'field', 'source',
    'row' (two-time order parameter) or 'other'; same_time False for a field read at s inside a strictly
    causal sum (s < t) or at a fixed earlier time."""
    fields = {n for n, _ in prog.fields}
    two = set(prog.families) | set(prog.responses)
    out = []

    def walk(e, strict):
        if isinstance(e, sp.Sum):
            (_, _, hi), = e.limits
            walk(e.function, hi != tsym)
            return
        if isinstance(e, sp.core.function.AppliedUndef) or (isinstance(e, sp.Function) and not e.is_Number):
            name = type(e).__name__
            base, ref = _split(name.rstrip("'"))
            if base in fields:
                same = e.args[0] == tsym or (not strict and e.args[0] == sp.Symbol("s"))
                out.append(("field", base, ref, same))
            elif base in prog.sources:
                out.append(("source", base, ref, True))
            elif base in two:
                out.append(("row", base, ref, True))
        for a in e.args:
            if isinstance(a, sp.Basic):
                walk(a, strict)

    walk(expr, False)
    return out


def schedule(prog: SiteProgram, L: int) -> list:
    """The order of one time step: nodes ('source', x, l), ('field', f, l), ('row', Q, l) for l = 1..L, each
    after what it reads at the same time (Kahn's algorithm; a cycle is a spec error)."""
    tsym = sp.Symbol(prog.time)
    lay = lambda ref, l: _layer(ref, l, L, prog.layer_var, prog.depth) if ref else l  # noqa: E731
    deps = {}
    for l in range(1, L + 1):
        for name, (fam, off) in prog.sources.items():
            deps[("source", name, l)] = {("row", fam, l + off)} if 1 <= l + off <= L else set()
        for name, expr in prog.fields:
            d = set()
            for kind, base, ref, same in _refs(prog, expr, tsym):
                if not same:
                    continue
                tgt = lay(ref, l)
                if kind == "field" and tgt != l:
                    raise StructureSpecError(f"field {name} reads {base}[{ref}], a field of another layer; layers "
                                             "are coupled only through order parameters")
                if kind == "field" and base == name:
                    continue
                if 1 <= tgt <= L:
                    d.add((kind, base, tgt))
            deps[("field", name, l)] = d
        for fam, obs in list(prog.families.items()) + [(r, of) for r, (of, _) in prog.responses.items()]:
            deps[("row", fam, l)] = {("field", base, lay(ref, l)) for kind, base, ref, _ in _refs(prog, obs, tsym)
                                     if kind == "field"}
    order, done = [], set()
    while len(order) < len(deps):
        ready = [n for n in deps if n not in done and deps[n] <= done]
        if not ready:
            left = sorted(n for n in deps if n not in done)
            raise StructureSpecError(f"the quantities {left[:4]} of one time step depend on each other in a cycle")
        # deterministic: the earliest-declared ready node first
        node = min(ready, key=lambda n: list(deps).index(n))
        order.append(node)
        done.add(node)
    return order


def site_march(prog: SiteProgram, act, L: int, T: int, xi: dict, wts, p: dict, direct: bool = False):
    """One march on given standard normals ``xi`` (source name -> (L, S, T)) with path weights ``wts`` (S,)
    summing to 1.  ``act``: functions (phi, phi', phi'', ...) of the activation; ``p``: parameter values.
    ``direct``: the readout constraints read the plain path averages (the saddle of the Monte Carlo action of
    these paths) instead of their Stein's-lemma form.  Returns {(name, l): (T, T) causal rows} for kernels and
    responses, {name: (T,)} for the march's constraints, the fields' paths {(name, l): (S, T)}, the readout
    averages {('stein' | 'direct', symbol): (T,)} and the sources' Cholesky factors {(name, l): (T, T)}."""
    S = next(iter(xi.values())).shape[1]
    order = schedule(prog, L)
    wrt = sorted({w for _, w in prog.responses.values()})
    names = [n for n, _ in prog.fields]
    fexpr = dict(prog.fields)
    idx = jnp.arange(T)

    def step(t, c):
        hist, dhist, chol, rows, q1, avg = (dict(c[k]) for k in ("hist", "dhist", "chol", "rows", "q1", "avg"))
        src = {}
        onehot = (idx == t).astype(jnp.float64)
        for kind, name, l in order:
            ev = _Eval(prog, L, t, l, hist, rows, q1, src, p, act, T)
            if kind == "source":
                fam, off = prog.sources[name]
                row = rows[(fam, l + off)][t] if 1 <= l + off <= L else jnp.full((T,), ev.boundary(fam, l + off))
                chol[(name, l)] = C = _extend_cholesky(chol[(name, l)], row * (idx <= t), t, _PIVOT_TOL)
                src[(name, l)] = xi[name][l - 1] @ C[t]
            elif kind == "field":
                layer_hist = {f: hist[(f, l)] for f in names}
                srcs = {k: v for k, v in src.items() if k[1] == l}

                def value(hs, ss, name=name, l=l):
                    h2 = dict(hist)
                    h2.update({(f, l): v for f, v in hs.items()})
                    s2 = dict(src)
                    s2.update(ss)
                    return _Eval(prog, L, t, l, h2, rows, q1, s2, p, act, T)(fexpr[name])

                v = value(layer_hist, srcs)
                hist[(name, l)] = hist[(name, l)].at[:, t].set(v)
                for w in wrt:
                    tang_h = {f: dhist[(w, f, l)] for f in names}
                    tang_s = {k: (jnp.ones((S, 1)) * onehot if k[0] == w else jnp.zeros((S, T))) for k in srcs}
                    dv = jax.vmap(lambda th, ts: jax.jvp(value, (layer_hist, srcs), (th, ts))[1],
                                  in_axes=(2, 1), out_axes=1)(tang_h, tang_s)
                    dhist[(w, name, l)] = dhist[(w, name, l)].at[:, t, :].set(dv)
            else:
                if name in prog.families:
                    obs = _Eval(prog, L, t, l, hist, rows, q1, src, p, act, T)(prog.families[name], True)
                    row = (wts @ jnp.broadcast_to(obs, (S, T))) * (idx <= t)
                else:
                    of, w = prog.responses[name]
                    layer_hist = {f: hist[(f, l)] for f in names}

                    def value(hs, of=of, l=l):
                        h2 = dict(hist)
                        h2.update({(f, l): v for f, v in hs.items()})
                        return _Eval(prog, L, t, l, h2, rows, q1, src, p, act, T)(of)

                    tang = {f: dhist[(w, f, l)] for f in names}
                    d = jax.vmap(lambda th: jax.jvp(value, (layer_hist,), (th,))[1], in_axes=2, out_axes=1)(tang)
                    row = wts @ d
                rows[(name, l)] = rows[(name, l)].at[t].set(row)
        for qname, coeff, rest, avgs in prog.readouts:
            vals = {}
            ev = _Eval(prog, L, t, L, hist, rows, q1, src, p, act, T)
            for sym, expr in avgs:
                if sym in prog.at_fixed_time:
                    continue
                X = ev(expr)
                direct_val = wts @ X
                if sym in prog.stein:
                    F, x, Y = prog.stein[sym]
                    fam, off = prog.sources[x]
                    layer_hist = {f: hist[(f, L)] for f in names}

                    def yval(hs, Y=Y):
                        h2 = dict(hist)
                        h2.update({(f, L): v for f, v in hs.items()})
                        return _Eval(prog, L, t, L, h2, rows, q1, src, p, act, T)(Y)

                    tang = {f: dhist[(x, f, L)] for f in names}
                    dY = jax.vmap(lambda th: jax.jvp(yval, (layer_hist,), (th,))[1], in_axes=2, out_axes=1)(tang)
                    cov = rows[(fam, L + off)][t] if 1 <= L + off <= L else \
                        jnp.full((T,), ev.boundary(fam, L + off))
                    stein_val = jnp.sum(cov * (idx <= t) * (wts @ dY)) + wts @ (X - src[(x, L)] * ev(Y))
                    avg[("stein", sym)] = avg[("stein", sym)].at[t].set(stein_val)
                avg[("direct", sym)] = avg[("direct", sym)].at[t].set(direct_val)
            kind = "direct" if direct else "stein"
            for sym, _ in avgs:
                if sym in prog.at_fixed_time:
                    other, k = prog.at_fixed_time[sym]
                    vals[sym] = avg[(kind if other in prog.stein else "direct", other)][k]
                else:
                    vals[sym] = avg[(kind if sym in prog.stein else "direct", sym)][t]
            q1[qname] = q1[qname].at[t].set(-_subs_eval(ev, rest, vals) / ev(coeff))
        return {"hist": hist, "dhist": dhist, "chol": chol, "rows": rows, "q1": q1, "avg": avg}

    c0 = {"hist": {(f, l): jnp.zeros((S, T)) for f in names for l in range(1, L + 1)},
          "dhist": {(w, f, l): jnp.zeros((S, T, T)) for w in wrt for f in names for l in range(1, L + 1)},
          "chol": {(x, l): jnp.zeros((T, T)) for x in prog.sources for l in range(1, L + 1)},
          "rows": {(q, l): jnp.zeros((T, T)) for q in list(prog.families) + list(prog.responses)
                   for l in range(1, L + 1)},
          "q1": {q: jnp.zeros(T) for q, *_ in prog.readouts},
          "avg": {(k, sym): jnp.zeros(T) for *_, avgs in prog.readouts for sym, _ in avgs
                  for k in ("stein", "direct") if sym not in prog.at_fixed_time}}
    c = jax.lax.fori_loop(0, T, step, c0)
    return c["rows"], c["q1"], c["hist"], c["avg"], c["chol"]


def _subs_eval(ev: _Eval, expr, vals: dict):
    """Evaluate ``expr`` with the average symbols replaced by their values."""
    if expr in vals:
        return vals[expr]
    if isinstance(expr, sp.Add):
        return sum((_subs_eval(ev, a, vals) for a in expr.args), 0.0)
    if isinstance(expr, sp.Mul):
        out = 1.0
        for a in expr.args:
            out = out * _subs_eval(ev, a, vals)
        return out
    if isinstance(expr, sp.Pow):
        return _subs_eval(ev, expr.base, vals) ** _subs_eval(ev, expr.exp, vals)
    return ev(expr)
