"""Time coefficients of a deep spec: deterministic two-time functions defined by recurrences in t.

An optimiser's state (a velocity, a decayed weight) makes every weight matrix a linear function of its gradients
at earlier steps, W(t) = W(0) - sum_{s<t} c(t, s) grad(s), with coefficients that depend on the parameters only.
A deep spec writes such a coefficient without a layer index, as a recurrence in t at fixed s with its value at
t = s::

    q(t, s) = beta * q(t - 1, s);                       q(s, s) = 1
    c(t, s) = c(t - 1, s) + lr[t - 1] * q(t - 1, s);    c(s, s) = 0

The recurrence holds for t > s, the diagonal equation gives t = s, and a coefficient is 0 for t < s.  A right
side may read numbers, parameters (and the step size), per-step parameters at earlier steps (lr[t - 1]), the
times t and s as values, coefficients at (t - 1, s), and other coefficients at (t, s) (without a same-time cycle);
field equations read a coefficient at (t, s) inside their causal sums.

A one-time coefficient (a weight decay's shrinking factor of the initial weights) is a recurrence in t from its
value at t = 0, written with one time::

    a(t) = a(t - 1) - eta * lr[t - 1] * v(t - 1);       a(0) = 1
    v(t) = beta * v(t - 1) + lam * a(t);                v(0) = lam

Its right side may read what a two-time one does, with one-time coefficients at t - 1 or t in place of the
two-time ones; field equations and averages read it at t, at the time of a causal sum, or (in an average) at 0.
Anything else (an order parameter, a field, another time) is a located error.  The generated module evaluates the
recurrences (``coefficients(p, T)``, :mod:`dmftc.codegen.deep`): a (T, T) array of each two-time coefficient and
a (T,) array of each one-time one.
"""
from __future__ import annotations

from dataclasses import dataclass

from dmftc.errors import CausalitySpecError, NameSpecError, ShapeSpecError, StructureSpecError
from dmftc.frontend import ast
from dmftc.frontend.names import BUILTIN_FUNCTIONS
from dmftc.frontend.recurrence import time_offset

__all__ = ["Coefficient", "is_coefficient", "plan_coefficients", "step_offset"]


@dataclass(frozen=True)
class Coefficient:
    """``name(t, s) = body`` for t > s, ``name(s, s) = init``; ``after``: the coefficients it reads at (t, s).  A
    one-time coefficient (``time2`` None): ``name(t) = body`` for t > 0, ``name(0) = init``."""

    name: str
    body: ast.Expr
    init: ast.Expr
    pos: object
    after: tuple[str, ...] = ()
    time2: str | None = "s"

    @property
    def one_time(self) -> bool:
        return self.time2 is None


def is_coefficient(f: ast.FieldDecl, symbols: dict, initials=frozenset()) -> bool:
    """An equation without a layer index, of two times (or of one time, with an initial value ``name(0) = ...``
    among ``initials``), defining a name not declared otherwise."""
    return not f.indices and f.name not in symbols and (f.time2 is not None or f.name in initials)


def plan_coefficients(eqs, *, time_var: str, params: dict, per_step: set, err, word_pos,
                      initials=()) -> tuple[Coefficient, ...]:
    """The coefficients of the equations ``eqs`` (each ``c(t, s) = ...``, ``c(s, s) = ...`` or ``a(t) = ...``) and
    the initial values ``initials`` (``a(0) = ...``, :class:`ast.InitialDecl`), checked and in same-time
    dependency order.  ``params``: parameter name -> dims; ``per_step``: the per-step parameters."""
    tv = time_var
    bodies, inits = {}, {}
    for i in initials:
        if i.time != 0:
            raise err(StructureSpecError, f"the initial value of the one-time coefficient '{i.name}' is given at 0",
                      word_pos(i.name, i.pos), hint=f"write {i.name}(0) = ...")
        if i.name in inits:
            raise err(NameSpecError, f"'{i.name}(0)' is given twice", word_pos(i.name, i.pos))
        inits[i.name] = i
    for f in eqs:
        if f.time == f.time2:
            if f.time in (tv,) or f.time in params:
                raise err(NameSpecError, f"the initial value of '{f.name}' is written at its second time, "
                          f"{f.name}(s, s)", word_pos(f.time, f.pos), hint=f"write {f.name}(s, s) = ...")
            if f.name in inits:
                raise err(NameSpecError, f"'{f.name}(s, s)' is given twice", word_pos(f.name, f.pos))
            inits[f.name] = f
            continue
        if f.time != tv:
            raise err(NameSpecError, f"the coefficient '{f.name}' must be defined at the time variable '{tv}'",
                      word_pos(f.time, f.pos), hint=f"write {f.name}({tv}, s) = ...")
        if f.name in bodies:
            raise err(NameSpecError, f"'{f.name}' is defined twice (first at line {bodies[f.name].pos.line})",
                      word_pos(f.name, f.pos))
        bodies[f.name] = f
    for name, f in inits.items():
        if name not in bodies and isinstance(f, ast.InitialDecl):    # pragma: no cover - check.py routes these
            raise err(StructureSpecError, f"'{name}(0)' is the initial value of a one-time coefficient, but "
                      f"'{name}({tv}) = ...' is not defined", word_pos(name, f.pos))
        if name not in bodies:
            raise err(StructureSpecError, f"'{name}(s, s)' is the initial value of a coefficient, but '{name}({tv}, "
                      f"s) = ...' is not defined", word_pos(name, f.pos),
                      hint=f"a time coefficient is a recurrence: {name}({tv}, s) = ... {name}({tv} - 1, s) ...")
    for name, f in bodies.items():
        if name not in inits:
            raise err(StructureSpecError, f"the coefficient '{name}' has no initial value", word_pos(name, f.pos),
                      hint=f"add '{name}(s, s) = ...' (its value at {tv} = s; the recurrence holds for {tv} > s). "
                           "Response functions and kernels carry a layer index: " f"{name}[l]({tv}, s)")
    for name, f in bodies.items():
        if (f.time2 is None) != isinstance(inits[name], ast.InitialDecl):
            i = inits[name]
            raise err(ShapeSpecError, f"the initial value of '{name}' has {'one time' if f.time2 else 'two times'}, "
                      f"its recurrence {'two' if f.time2 else 'one'}", word_pos(name, i.pos),
                      hint=f"write {name}(s, s) = ..." if f.time2 else f"write {name}(0) = ...")
    names = {n for n, f in bodies.items() if f.time2 is not None}
    ones = {n for n, f in bodies.items() if f.time2 is None}
    after = {}
    for name, f in bodies.items():
        s = f.time2
        after[name] = _check(f.body, name, tv, s, names if s else ones, params, per_step, err, diag=False)
        _check(inits[name].body, name, tv, s, set(), params, set(), err, diag=True)
    order, state = [], {}

    def visit(n, chain):
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cyc = chain[chain.index(n):] + [n]
            raise err(CausalitySpecError, f"coefficients depend on each other at the same time: {' -> '.join(cyc)}",
                      bodies[cyc[0]].body.pos,
                      hint=f"read one of them at ({tv} - 1{', s' if bodies[cyc[0]].time2 else ''})")
        state[n] = 1
        for d in after[n]:
            visit(d, chain + [n])
        state[n] = 2
        order.append(n)

    for n in bodies:
        visit(n, [])
    return tuple(Coefficient(n, bodies[n].body, inits[n].body, bodies[n].pos, after[n], bodies[n].time2)
                 for n in order)


def _check(body, owner, tv, s, names, params, per_step, err, diag):
    """Located errors for anything a coefficient's right side may not read; the coefficients read at (t, s)."""
    same = []
    at, prev = (f"({tv}, {s})", f"({tv} - 1, {s})") if s else (f"({tv})", f"({tv} - 1)")
    where = ((f"the initial value {owner}({s}, {s})" if s else f"the initial value {owner}(0)") if diag
             else f"the recurrence of '{owner}'")
    allowed = ("numbers and parameters" if diag else
               f"numbers, parameters, per-step parameters at earlier steps, {tv}{', ' + s if s else ''}, "
               f"{'' if s else 'one-time '}coefficients at {prev} and other {'' if s else 'one-time '}coefficients "
               f"at {at}")
    for e in ast.walk(body):
        if isinstance(e, ast.Name):
            if e.name in params and not params[e.name]:
                continue
            if not diag and e.name in (tv, s):
                continue
            if e.name == "pi":
                continue
            raise err(StructureSpecError, f"{where} cannot read '{e.name}'", e.pos, hint=f"it may read {allowed}")
        if isinstance(e, ast.Indexed):
            ok = not diag and e.name in per_step and len(e.indices) == 1
            if ok:
                k = step_offset(e.indices[0], tv)
                if k is not None and k < 0:
                    continue
            raise err(CausalitySpecError if ok else StructureSpecError,
                      f"{where} reads '{e.name}[{', '.join(e.indices)}]'", e.pos,
                      hint=f"a per-step parameter is read at an earlier step, e.g. {e.name}[{tv} - 1]" if ok
                      else f"it may read {allowed}")
        if isinstance(e, ast.Call) and e.name in names:
            n = 2 if s else 1
            if e.indices or len(e.args) != n:
                raise err(ShapeSpecError, f"the coefficient '{e.name}' takes {'two times' if s else 'one time'} and "
                          "no layer index", e.pos, hint=f"write {e.name}{prev}")
            k = time_offset(e.args[0], tv)
            if (s and not (isinstance(e.args[1], ast.Name) and e.args[1].name == s)) or k not in (0, -1):
                raise err(CausalitySpecError, f"{where} reads '{e.name}' at other times than {prev} or {at}", e.pos,
                          hint=f"write {e.name}{prev}")
            if k == 0:
                if e.name == owner:
                    raise err(CausalitySpecError, f"'{owner}{at}' is defined in terms of itself", e.pos,
                              hint=f"read it at the previous step, {owner}{prev}")
                same.append(e.name)
            continue
        if isinstance(e, ast.Call) and not e.indices and e.name not in params and e.name in BUILTIN_FUNCTIONS:
            continue
        if isinstance(e, (ast.Call, ast.PrimeCall, ast.Integral, ast.TimeSum, ast.LayerSum, ast.Expectation,
                          ast.Response, ast.Hat, ast.IndexSum, ast.Matrix)):
            what = getattr(e, "name", None)
            raise err(StructureSpecError, f"{where} cannot read " + (f"'{what}'" if what else "this construct"),
                      e.pos, hint=f"a time coefficient depends on the parameters only: it may read {allowed}")
    return tuple(dict.fromkeys(same))


def step_offset(text, tv):
    """k of an index 't', 't-1' (the parser's text of a shifted index), or None."""
    t = text.replace(" ", "")
    if t == tv:
        return 0
    if t.startswith(tv) and t[len(tv):][:1] in "+-" and t[len(tv) + 1:].isdigit():
        return int(t[len(tv):])
    return None
