"""Print a deep spec's time coefficients (:mod:`dmftc.frontend.coefficients_deep`) into its generated module:
``coefficients(p, T)`` runs their recurrences in t, every row a vector over s, and returns each as a (T, T) array
(row t, column s; 0 for s > t), and each one-time coefficient as a (T,) array.  The recurrences read the
parameters only, so the function is JAX-traceable in them and its rows for t < T do not depend on T (the
propagator's structure checks call it on a shorter grid)."""
from __future__ import annotations

import sympy as sp

from dmftc.codegen.printer import ExprPrinter
from dmftc.frontend import ast
from dmftc.frontend.builtins import BUILTINS
from dmftc.frontend.coefficients_deep import step_offset
from dmftc.frontend.recurrence import time_offset

__all__ = ["coefficient_expr", "emit_coefficients"]

_T, _S = sp.Symbol("t"), sp.Symbol("s")


class _Code(ExprPrinter):
    def __init__(self, names):
        self.names = names

    def atom(self, e):
        return self.names.get(e)


def coefficient_expr(body, tv: str, s: str, names: dict):
    """SymPy form of a coefficient's right side; ``names`` collects placeholder symbol -> code."""
    c = lambda x: coefficient_expr(x, tv, s, names)  # noqa: E731
    if isinstance(body, ast.Num):
        v = body.value
        return sp.Integer(int(v)) if v == int(v) else sp.Float(v)
    if isinstance(body, ast.Name):
        if body.name == tv:
            return _T
        if body.name == s:
            return _S
        if body.name == "pi":
            return sp.pi
        sym = sp.Symbol(body.name)
        names[sym] = f"p[{body.name!r}]"
        return sym
    if isinstance(body, ast.BinOp):
        a, b = c(body.left), c(body.right)
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "^": a ** b}[body.op]
    if isinstance(body, ast.Neg):
        return -c(body.operand)
    if isinstance(body, ast.Indexed):                      # a per-step parameter at an earlier step
        k = step_offset(body.indices[0], tv)
        sym = sp.Symbol(f"{body.name}[{tv} - {-k}]")
        names[sym] = f"_per_step(p[{body.name!r}], t - {-k})"
        return sym
    if isinstance(body, ast.Call) and body.name in BUILTINS:
        return BUILTINS[body.name](*[c(a) for a in body.args])
    if isinstance(body, ast.Call):                         # another coefficient at (t - 1, s) or (t, s)
        k = time_offset(body.args[0], tv)
        at = f", {s})" if len(body.args) == 2 else ")"
        sym = sp.Symbol(f"{body.name}({tv} - 1{at}" if k else f"{body.name}({tv}{at}")
        names[sym] = f"{'prev' if k else 'cur'}[{body.name!r}]"
        return sym
    raise AssertionError(type(body))  # pragma: no cover - the checker admits nothing else


def emit_coefficients(w, coefficients, tv: str) -> None:
    """``coefficients(p, T)`` of the generated module (module doc); nothing when the spec has none."""
    if not coefficients:
        return
    w("\ndef _per_step(v, k):\n    \"\"\"A per-step parameter at step k (clipped to the values given).\"\"\"\n"
      "    v = jnp.atleast_1d(jnp.asarray(v, jnp.float64))\n    return v[min(max(k, 0), v.shape[0] - 1)]\n\n")
    doc = "; ".join(f"{c.name}({tv}{'' if c.one_time else ', s'}) = "
                    f"{sp.sstr(coefficient_expr(c.body, tv, c.time2, {}))}, "
                    f"{c.name}({'0' if c.one_time else 's, s'}) = {sp.sstr(coefficient_expr(c.init, tv, c.time2, {}))}"
                    for c in coefficients)
    ones = any(c.one_time for c in coefficients)
    w("\ndef coefficients(p, T):\n")
    w(f"    \"\"\"The time coefficients as (T, T) arrays, row t over s (0 for s > t), by their recurrences for t > s"
      f"{chr(10) + '    (one-time coefficients: (T,) arrays, for t > 0)' if ones else ''}:\n    {doc}\n    \"\"\"\n")
    w("    s = jnp.arange(T, dtype=jnp.float64)\n")
    names = [c.name for c in coefficients]
    w(f"    prev = {{{', '.join(f'{c.name!r}: ' + ('0.0' if c.one_time else 'jnp.zeros(T)') for c in coefficients)}}}\n")
    w(f"    rows = {{{', '.join(f'{n!r}: []' for n in names)}}}\n")
    w("    for t in range(T):\n        cur = {}\n")
    for c in coefficients:
        table = {_T: "t", _S: "s"}
        body = coefficient_expr(c.body, tv, c.time2, table)
        init_table = {_S: "s"}
        init = coefficient_expr(c.init, tv, c.time2, init_table)
        if c.one_time:
            w(f"        cur[{c.name!r}] = jnp.asarray({_Code(table)(body)} if t > 0 else {_Code(init_table)(init)}, "
              "jnp.float64)\n")
            continue
        w(f"        cur[{c.name!r}] = jnp.where(s < t, {_Code(table)(body)}, jnp.where(s == t, {_Code(init_table)(init)}, "
          "0.0))\n")
    w("        for k in rows:\n            rows[k].append(cur[k])\n        prev = cur\n")
    w("    return {k: jnp.stack(v) for k, v in rows.items()}\n\n")
