"""What the site march needs from a deep spec's IR (issue 12): its single-site program, analysed in SymPy.

From :class:`dmftc.ir.ModelIR` (kind 'deep') this stage collects the fields in dependency order, the gp sources
with the kernel and layer offset of their covariance, the two-time averages (kernels) and responses, the
constraints that read single-site averages (the readout) and the boundaries, and derives

* the **same-time reads** of every quantity, in layer references relative to its own layer: a field reads its
  layer's fields at t (not those at s inside a strictly causal sum), its source, and the rows t of kernels and
  responses (row t of a kernel needs that layer's fields at t, whatever s it is read at); a kernel or response
  row reads the fields of its observable.  :mod:`dmftc.runtime.march.site_march` orders one time step by them;
* for each readout average X(t), whether **Stein's lemma** applies: X linear in a field F(t) whose equation is
  F = x(t) + (terms without x(t)) for a gp source x with a response (so the march carries tangents in x), then
  E[X] = sum_{s<=t} Cov_x(t, s) E[dY / dx(s)] + E[X - x(t) Y] with Y = dX/dF(t): exact Gaussian integration by
  parts for the x(t) Y part, whose Monte Carlo error would otherwise grow like 1/gamma;
* averages at a fixed time that are a t-form average at that time (E[z(0) phi(h(0))]), read from its history;
* the **path factors** of the fields' causal sums (:func:`path_factors`): each function of the layer's fields at the
  earlier time s alone (phi(h[l](s)), g[l](s)) is a quantity of its own, computed once per step with its tangents,
  so that a sum reads the kept values and tangents instead of re-evaluating the factor (and differentiating it)
  over the whole history at every step.

:mod:`dmftc.codegen.site` prints the result into the generated module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import sympy as sp

__all__ = ["SiteProgram", "assemble", "merge_sums", "path_factors", "split_name", "split_path"]

_NAME = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(?:\[([^\]]+)\])?$")


def split_name(name: str) -> tuple[str, str | None]:
    """'Phi[l-1]' -> ('Phi', 'l-1'); 'Delta' -> ('Delta', None)."""
    m = _NAME.match(name.rstrip("'"))
    return m.group(1), m.group(2)


def _apps(expr):
    return sorted(expr.atoms(sp.core.function.AppliedUndef), key=str)


@dataclass(frozen=True)
class SiteProgram:
    """A deep spec's single-site program (names as the spec writes them; layer references as text)."""
    fields: tuple            # ((name, expr), ...) in dependency order
    sources: tuple           # ((name, covariance kernel, layer offset), ...)
    families: tuple          # ((name, observable in t and s), ...)
    responses: tuple         # ((name, observable at t, source), ...)
    readouts: tuple          # ((name, coeff, rest, ((symbol, expr), ...)), ...)
    stein: tuple             # ((symbol, field F, source x, Y = dX/dF(t)), ...)
    fixed: tuple             # ((symbol, t-form symbol, time), ...)
    reads: tuple             # ((('field' | 'row', name), ((kind, name, layer ref), ...)), ...)
    time: str
    activation: str
    layer: str               # the layer variable ('l')
    history: tuple = ()      # fields read at an earlier time s by some field (through the path factors)
    terms: tuple = ()        # the path factors of the fields' sums, at s (values and tangents kept over time)
    normals: tuple = ()      # sources constant in time (normal(0, C): a two-layer spec's), drawn by the caller
    axes: tuple | None = None    # a two-layer spec's sample indices ((name, size), ...), the arrays' layout (None: deep)
    stored: tuple = ()       # ((quantity, its sample indices), ...) (two-layer)
    sums: tuple = ()         # running sums ((name, indices, scope 'sample' | 'order', eta * increment at t), ...)
    tangents: tuple = ()     # ((kind 'field' | 'sum' | 'average', name, its tangent), ...) (two-layer: the Jacobian)
    drivers: tuple = ()      # the one-time order parameters the fields and running sums read (two-layer)
    factors: tuple = ()      # ((field, (the path factors its causal sums read, ...)), ...) (deep)
    known: tuple = ()        # the one-time coefficients the program reads (deep: a weight decay's a(t))

    @property
    def tangent_sources(self) -> tuple:
        """The sources whose tangents the march carries (those of the responses), sorted."""
        return tuple(sorted({x for _, _, x in self.responses}))


def _reads(expr, fields: set, sources: set, two_time: set, tsym, own: str | None):
    """Same-time reads of ``expr`` as ((kind, name, layer ref), ...), sorted (see the module doc)."""
    out = set()

    def walk(e, strict):
        if time_sum(e):
            hi = e.limits[-1][2]
            walk(e.function, hi != tsym)
            return
        if isinstance(e, sp.core.function.AppliedUndef):
            base, ref = split_name(type(e).__name__)
            if base in fields:
                same = e.args[0] == tsym or (not strict and e.args[0] == sp.Symbol("s"))
                if same and base != own:
                    out.add(("field", base, ref or ""))
            elif base in sources:
                out.add(("source", base, ref or ""))
            elif base in two_time:
                out.add(("row", base, ref or ""))
        for a in e.args:
            if isinstance(a, sp.Basic):
                walk(a, strict)

    walk(expr, False)
    return tuple(sorted(out))


def _stein_plan(X, fields: dict, sources: tuple, tangents: set, tsym):
    """(F, x, Y) when Stein's lemma applies to the average of X (module doc), else None."""
    for app in _apps(X):
        base, _ = split_name(type(app).__name__)
        if base not in fields or app.args != (tsym,) or sp.diff(X, app, 2) != 0:
            continue
        for xname, _, _ in sources:
            if xname not in tangents:
                continue
            xs = [a for a in _apps(fields[base]) if split_name(type(a).__name__)[0] == xname and a.args == (tsym,)]
            if len(xs) == 1 and sp.diff(fields[base], xs[0]) == 1 and sp.diff(fields[base], xs[0], 2) == 0:
                return base, xname, sp.diff(X, app)
    return None


def time_sum(e) -> bool:
    """Whether ``e`` is a causal sum over the earlier time s, its last limit (SymPy writes a sum over s of a sum
    over sample indices as one sum whose earlier limits are the indices'), not a sum over sample indices only."""
    s = sp.Symbol("s")
    return isinstance(e, sp.Sum) and e.limits[-1][0] == s and all(lim[0] != s for lim in e.limits[:-1])


PAST = sp.Symbol("[s<t]")     # the indicator of s < t inside a sum over s <= t (E.past in the generated code)


def _own_past(f, fields: set, tsym, layer: str, activation: str, known=()) -> bool:
    """Whether the factor ``f`` is a function of fields of its own layer at s alone (parameters, the activation
    and the one-time coefficients ``known`` aside): its value at s is known from step s on."""
    s = sp.Symbol("s")
    if f.has(sp.Sum) or f.has(PAST) or tsym in f.free_symbols:
        return False
    apps = f.atoms(sp.core.function.AppliedUndef)
    own = [a for a in apps if split_name(type(a).__name__)[0] in fields]
    other = [a for a in apps if a not in own and type(a).__name__.rstrip("'") != activation
             and not (type(a).__name__ in known and a.args == (s,))]
    return bool(own) and not other and all(a.args == (s,) and split_name(type(a).__name__)[1] == layer
                                            for a in own)


def split_path(term, fields: set, tsym, layer: str, activation: str, known=()):
    """One term of a causal sum's body -> (its path factors at s alone, as one product (None if none); the other
    path-dependent factors; the other factors).  A field of this layer at s inside an 'other' path factor
    (one that reads a time t quantity as well) is a path factor of its own (:func:`path_factors`)."""
    path = [f for f in sp.Mul.make_args(term) if _path_dependent(f, fields)]
    own = [f for f in path if _own_past(f, fields, tsym, layer, activation, known)]
    rest = [f for f in sp.Mul.make_args(term) if not _path_dependent(f, fields)]
    return (sp.Mul(*own) if own else None), [f for f in path if f not in own], rest


def path_factors(expr, fields: set, tsym, layer: str, activation: str, known=()):
    """The path factors at s of the causal sums in a field equation (module doc), in order of appearance, and
    those read at the same time (the sums over s <= t): (factors, same-time factors)."""
    s = sp.Symbol("s")
    out, same = [], []
    for sm in sp.preorder_traversal(expr):
        if not time_sum(sm):
            continue
        hi = sm.limits[-1][2]
        for term in sp.Add.make_args(sm.function):
            own, others, _ = split_path(term, fields, tsym, layer, activation, known)
            found = [own] if own is not None else []
            for f in others:
                found += [a for a in _apps(f) if split_name(type(a).__name__)[0] in fields and a.args == (s,)
                          and split_name(type(a).__name__)[1] == layer]
            out += found
            if hi == tsym:
                same += found
    return tuple(dict.fromkeys(out)), tuple(dict.fromkeys(same))


def _path_dependent(e, fields: set) -> bool:
    return any(split_name(type(a).__name__)[0] in fields for a in e.atoms(sp.core.function.AppliedUndef))


def merge_sums(expr, fields: set, tsym):
    """The causal sums of a field equation as one sum whose body is grouped by its path-dependent factors,
    sum_{s<=t} sum_k P_k(s) C_k(t, s) (C_k path-independent: kernel and response rows, one-time order
    parameters, parameters), so that the march makes one pass over the paths' histories per distinct P_k
    instead of one per term (each pass over the tangents costs paths x T^2).  A term of a strict sum (s < t)
    carries the factor PAST.  Equal to the input as a function of the values (tested through the march)."""
    s = sp.Symbol("s")
    rest, bodies, strict_only = [], [], True
    for term in sp.Add.make_args(expr):
        sums = [f for f in sp.Mul.make_args(term) if time_sum(f) and len(f.limits) == 1]
        if len(sums) != 1:
            rest.append(term)
            continue
        (sm,) = sums
        coeff = term / sm
        if _path_dependent(coeff, fields) or s in coeff.free_symbols:
            rest.append(term)
            continue
        (_, lo, hi), = sm.limits
        if lo != 0 or hi not in (tsym, tsym - 1):
            rest.append(term)
            continue
        strict_only &= hi != tsym
        bodies.append((coeff * sm.function, hi != tsym))
    if len(bodies) < 2:
        return expr
    hi = tsym - 1 if strict_only else tsym
    groups: dict = {}
    for body, strict in bodies:
        for t in sp.Add.make_args(sp.expand(body)):
            path = sp.Mul(*[f for f in sp.Mul.make_args(t) if _path_dependent(f, fields)])
            coef = t / path
            groups[path] = groups.get(path, 0) + (coef * PAST if strict and not strict_only else coef)
    body = sp.Add(*[path * sp.factor_terms(coef) for path, coef in groups.items()])
    return sp.Add(*rest) + sp.Sum(body, (s, 0, hi))


def assemble(fields, srcs, fams, resp, reads, time: str, act: str, layer: str, normals=(), axes=None,
             stored=(), sums=(), tangents=(), drivers=(), known=()) -> SiteProgram:
    """The program from its parts (fields with merged sums, gp sources, kernels, responses, readouts): the Stein
    plans, fixed-time averages, path factors and same-time reads (module doc); ``known``: the one-time
    coefficients (deterministic functions of time) a path factor may read besides the fields."""
    tsym = sp.Symbol(time)
    names = {n for n, _ in fields}
    two = {n for n, _ in fams} | {n for n, _, _ in resp}
    src_names = {n for n, _, _ in srcs} | set(normals)
    carried = {x for _, _, x in resp}
    stein, fixed = [], []
    for _, _, _, avgs in reads:
        plans = {}
        for sym, expr in avgs:
            plan = _stein_plan(expr, dict(fields), srcs, carried, tsym)
            if plan is not None:
                plans[sym] = expr
                stein.append((sym,) + plan)
        for sym, expr in avgs:
            if sym in plans or tsym in expr.free_symbols:
                continue
            times = {a.args[0] for a in _apps(expr) if len(a.args) == 1}
            for other, oexpr in plans.items():
                if len(times) == 1 and sp.simplify(oexpr.subs(tsym, next(iter(times))) - expr) == 0:
                    fixed.append((sym, other, int(next(iter(times)))))
                    break
    s_sym = sp.Symbol("s")
    terms, node_reads, factors = {}, [], []
    for n, e in fields:
        found, same = path_factors(e, names, tsym, layer, act, known)
        terms.update(dict.fromkeys(found))
        factors.append((n, tuple(sp.sstr(f) for f in found)))
        node_reads.append((("field", n), tuple(sorted(set(_reads(e, names, src_names, two, tsym, n))
                                                      | {("term", sp.sstr(f), layer) for f in same}))))
    for f in terms:
        node_reads.append((("term", sp.sstr(f)), _reads(f.xreplace({s_sym: tsym}), names, set(), set(), tsym, None)))
    for n, obs in list(fams) + [(n, of) for n, of, _ in resp]:
        parts = set(sp.preorder_traversal(obs)) if n in dict(fams) else set()     # a kernel reads kept path factors
        kept = {("term", sp.sstr(f), layer) for f in terms if f in parts}
        node_reads.append((("row", n), tuple(sorted({r for r in _reads(obs, names, set(), set(), tsym, None)
                                                     if r[0] == "field"} | kept))))
    history = tuple(n for n, _ in fields if any(
        split_name(type(a).__name__)[0] == n and a.args == (s_sym,) for _, e in fields
        for a in e.atoms(sp.core.function.AppliedUndef)))
    return SiteProgram(tuple(fields), tuple(srcs), tuple(fams), tuple(resp), tuple(reads), tuple(stein),
                       tuple(fixed), tuple(node_reads), time, act, layer, history, tuple(terms), tuple(normals),
                       axes, tuple(stored), tuple(sums), tuple(tangents), tuple(drivers),
                       tuple(factors) if axes is None else (), tuple(known))
