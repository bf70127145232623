"""Fields in recurrence form and per-step parameters of a two-layer spec: what each reads and when it is known.

A field with an initial value is a recurrence (an optimiser's state: a velocity, a weight)::

    v(t) = beta * v(t - 1) + gamma * Delta(t) * g(t) - lam * h(t);   v(-1) = 0
    h(t) = h(t - 1) + eta * gamma * lr[t - 1] * v(t - 1);           h(0) = u

Its right side reads quantities at ``t`` and ``t - 1``.  One step t of the march computes the fields at t, then
the order parameters at t (the single-site averages), then advances the state.  So a recurrence is

* **early** when its right side reads nothing at time t (only t - 1): X(t) is known when step t starts, and
  other fields and observables read X(t) as a field.  Its equation holds from t = 1 on: its initial value is X(0);
* **late** when it reads something at t (an order parameter, a field, another late recurrence): X(t) is known
  only at the end of step t.  Its equation holds from t = 0 on: its initial value is X(-1).  Only recurrences
  read it, late ones at t (in an order without cycles) and any at t - 1.

A late recurrence at t - 1 keeps only the recurrences' previous values: it may read, at t - 1, late recurrences
(whose previous values are kept), and at t everything else.  Reading t + 1, X(t) on X's own right side and a
same-time cycle between late recurrences are located errors.  :mod:`dmftc.ir.two_layer` lowers each recurrence
to a running sum of the march (its state, advanced at the end of each step: O(T) per path).
"""
from __future__ import annotations

from dataclasses import dataclass

from dmftc.errors import CausalitySpecError, StructureSpecError
from dmftc.frontend import ast

__all__ = ["Recurrence", "plan_recurrences", "time_offset"]


@dataclass(frozen=True)
class Recurrence:
    """A field in recurrence form: ``name(t) = body`` for t > start, ``name(start) = init``; kind 'early' (start
    0) or 'late' (start -1); ``after``: the late recurrences it reads at t (evaluated before it)."""

    name: str
    body: ast.Expr
    init: ast.Expr
    kind: str
    start: int
    after: tuple[str, ...] = ()


def time_offset(arg, tv: str):
    """The offset k of a time argument ``tv + k`` (``t`` -> 0, ``t - 1`` -> -1), or None if it is not one."""
    if isinstance(arg, ast.Name) and arg.name == tv:
        return 0
    if isinstance(arg, ast.BinOp) and arg.op in "+-" and isinstance(arg.left, ast.Name) and arg.left.name == tv \
            and isinstance(arg.right, ast.Num) and arg.right.value == int(arg.right.value):
        k = int(arg.right.value)
        return k if arg.op == "+" else -k
    return None


def _refs(body, names: set, tv: str):
    """((name, offset, position), ...) of the calls of ``names`` at tv + offset in ``body``, outside integrals."""
    out = []

    def walk(e):
        if isinstance(e, ast.Integral):
            return
        if isinstance(e, ast.Call) and e.name in names and len(e.args) == 1:
            k = time_offset(e.args[0], tv)
            if k is not None:
                out.append((e.name, k, e.pos))
        for c in ast.children(e):
            walk(c)

    walk(body)
    return out


def plan_recurrences(checker) -> tuple[Recurrence, ...]:
    """The recurrences of a checked spec (module doc), or a located error."""
    spec, err = checker.spec, checker.err
    tv = spec.time.var
    fields = {f.name: f for f in spec.fields}
    inits = {}
    for i in spec.initials:
        if i.name not in fields:
            hint = f"declare the field first: {i.name}(t) = ..." if i.name not in checker.symbols else None
            raise err(StructureSpecError, f"initial value of '{i.name}', which is not a field", i.pos, hint=hint)
        if i.name in inits:
            raise err(StructureSpecError, f"a second initial value of '{i.name}'", i.pos)
        if fields[i.name].indices:
            raise err(StructureSpecError, f"'{i.name}' has sample indices: recurrences are scalar fields for now",
                      fields[i.name].pos)
        checker.expr(i.body, ctx="field", bound=set(), time=None)
        bad = [x for x in ast.walk(i.body) if isinstance(x, (ast.Call, ast.Integral))
               and (isinstance(x, ast.Integral) or x.name in fields or checker.symbols.get(x.name) is not None
                    and checker.symbols[x.name].kind == "order")]
        if bad:
            raise err(StructureSpecError, "an initial value is made of sources and parameters", bad[0].pos,
                      hint=f"e.g. {i.name}(0) = u")
        inits[i.name] = i
    rec = set(inits)
    for n in rec:
        integral = next((x for x in ast.walk(fields[n].body) if isinstance(x, ast.Integral)), None)
        if integral is not None:
            raise err(StructureSpecError, f"'{n}' is a recurrence: its right side reads values at {tv} and {tv} - 1, "
                      "not integrals", integral.pos, hint="a recurrence is already a running sum: add the integrand "
                                                          f"at {tv} - 1 to {n}({tv} - 1)")
    orders = {o.name for o in spec.orders}
    reads = {}
    for f in spec.fields:
        for name, k, pos in _refs(f.body, set(fields) | orders, tv):
            if k > 0:
                raise err(CausalitySpecError, f"'{f.name}' reads {name}({tv} + {k}), a later time: not causal", pos,
                          hint=f"a field at {tv} reads {tv} and {tv} - 1")
            if f.name not in rec:
                if k < 0:
                    raise err(CausalitySpecError, f"'{name}({tv} - {-k})' in the field '{f.name}', which is not a "
                              "recurrence", pos, hint=f"give '{f.name}' an initial value, e.g. {f.name}(0) = ..., to "
                                                      "write it in recurrence form, or use a causal integral")
                continue
            if k < -1:
                raise err(StructureSpecError, f"'{f.name}' reads {name}({tv} - {-k}): a recurrence reads {tv} and "
                          f"{tv} - 1 only", pos, hint="introduce a recurrence for the older value")
            if name == f.name and k == 0:
                raise err(CausalitySpecError, f"'{f.name}({tv})' on its own right side: a recurrence reads its "
                          f"previous value {f.name}({tv} - 1)", pos)
            reads.setdefault(f.name, []).append((name, k, pos))
    late = {n for n in rec if any(k == 0 for _, k, _ in reads.get(n, ()))}
    plans = []
    for name in sorted(rec, key=list(fields).index):
        kind = "late" if name in late else "early"
        want = -1 if kind == "late" else 0
        init = inits[name]
        if init.time != want:
            why = (f"it reads {next(f'{n}({tv})' for n, k, _ in reads[name] if k == 0)} at the same time, so its "
                   f"equation holds from {tv} = 0 on") if kind == "late" else \
                f"it reads only {tv} - 1, so it is known when step {tv} starts and its equation holds from {tv} = 1 on"
            raise err(StructureSpecError, f"the initial value of '{name}' must be given at {tv} = {want}: {why}",
                      init.pos, hint=f"write {name}({want}) = ...")
        if kind == "late":
            for n, k, pos in reads[name]:
                if k == -1 and n not in late:
                    raise err(StructureSpecError, f"'{name}' reads {n}({tv} - 1), but at the end of step {tv} only the "
                              "previous values of the recurrences that read time t are kept", pos,
                              hint=f"read {n}({tv}) instead, or make the equation of '{name}' read {tv} - 1 only")
        after = tuple(dict.fromkeys(n for n, k, _ in reads.get(name, ()) if k == 0 and n in late))
        plans.append(Recurrence(name, fields[name].body, init.body, kind, want, after))
    for f in spec.fields:                        # other fields read the early recurrences at t only
        if f.name in rec:
            continue
        for name, k, pos in _refs(f.body, late, tv):
            raise err(CausalitySpecError, f"the field '{f.name}' reads {name}({tv}), which is known only at the end "
                      f"of step {tv} (it reads the order parameters at {tv})", pos,
                      hint=f"only recurrences read '{name}'")
    _cycles(plans, reads, err, tv)
    return tuple(plans)


def _cycles(plans, reads, err, tv):
    """Reject a same-time cycle between late recurrences, at the read that closes it."""
    after = {p.name: p.after for p in plans if p.kind == "late"}
    state: dict = {}

    def visit(n, chain):
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            cyc = chain[chain.index(n):] + [n]
            pos = next(pos for m, k, pos in reads[cyc[-2]] if m == n and k == 0)
            raise err(CausalitySpecError, "recurrences read each other at the same time: "
                      + " -> ".join(f"{c}({tv})" for c in cyc), pos,
                      hint=f"one of them must read the other's previous value, at {tv} - 1")
        state[n] = 1
        for d in after[n]:
            visit(d, chain + [n])
        state[n] = 2

    for n in after:
        visit(n, [])
