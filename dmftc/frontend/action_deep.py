"""Deep specs written as actions: the saddle-point equations derived from the action's terms.

A deep spec may state its discrete-time DMFT action (paper App. "Review of DMFT: deriving the action") instead
of the order parameters' averages.  Per hidden layer ``l`` of the generic layer, the action is a sum of

* kernel pairs with their duals, ``sum(l = 1..L: integral(integral(hat Q[l](t, s) Q[l](t, s) + ..., s <= t), t))``;
* one ``ln Z_l`` per layer over that layer's single-site process (its fields and gp sources are the process
  section's), ``sum(l = 1..L: log E[exp(-integral(integral(hat Q[l](t, s) O_Q(t, s) + ..., s <= t), t))])``;
* the pairing of the response functions, ``- sum(l = a..b: trace(P[l], R[l+1]))``;
* deterministic constraints of one-time order parameters, ``integral(hat X(t) (X(t) - rest(t)), t)``, whose
  ``rest`` may hold layer sums of equal-time kernels and averages ``E[...]`` of the last layer's fields.

Stationarity gives, for every term (the result is what the direct form of a deep spec states):

* dS / d hat Q[l](t, s) = 0:   ``Q[l](t, s) = E[O_Q(t, s)]``;
* dS / d hat X(t) = 0:         ``X(t) = rest(t)``;
* dS / d P[l](t, s) = 0 for a pairing -Tr(P[m] R[m+1]): the kernel P enters a field F of layer l as
  ``sum(s: P[l-1](t, s) V(s))`` with gp source xi (F = xi + ...), so that d ln Z_l / d P[l-1](t, s) =
  ``E[d V(s) / d xi(t)]`` (the MSR response: the conjugate field pairs with the source), and
  ``R[l](t, s) = E[d V(t) / d xi[l](s)]``; likewise R enters a field F' of layer l as ``R[l+1](t, s) V'(s)``
  with source xi', giving ``P[l](t, s) = E[d V'(t) / d xi'[l](s)]``.

:func:`lower_deep_action` returns these equations as definition statements located at the action's terms,
which the deep checker then checks like written ones (a name defined twice, by the action and by an equation,
is a located error).  ``dmftc derive`` prints them.
"""
from __future__ import annotations

from dataclasses import replace

from dmftc.frontend import ast
from dmftc.errors import SpecError, StructureSpecError

__all__ = ["lower_deep_action", "expr_text"]


def _factors(e):
    if isinstance(e, ast.BinOp) and e.op == "*":
        return _factors(e.left) + _factors(e.right)
    return [e]


def _product(factors, pos):
    out = factors[0]
    for f in factors[1:]:
        out = ast.BinOp(pos, "*", out, f)
    return out


def _rename(e, old: str, new: str):
    """``e`` with the time name ``old`` replaced by ``new`` in every argument."""
    if isinstance(e, ast.Name):
        return replace(e, name=new) if e.name == old else e
    if isinstance(e, (ast.Call, ast.PrimeCall)):
        return replace(e, args=tuple(_rename(a, old, new) for a in e.args))
    if isinstance(e, ast.BinOp):
        return replace(e, left=_rename(e.left, old, new), right=_rename(e.right, old, new))
    if isinstance(e, ast.Neg):
        return replace(e, operand=_rename(e.operand, old, new))
    if isinstance(e, (ast.Expectation, ast.LayerSum, ast.IndexSum, ast.TimeSum, ast.Integral)):
        return replace(e, body=_rename(e.body, old, new))
    return e


class _Lowering:
    def __init__(self, spec: ast.Spec, err):
        self.spec, self.err = spec, err
        lay = spec.layers[0]
        self.lv, self.depth, self.tv = lay.var, lay.depth, spec.time.var
        self.pairs, self.obs, self.scalars, self.pairings = {}, {}, {}, []
        self.deferred = []          # errors to raise only if the checker finds nothing more basic

    # ------------------------------------------------------------------ the action's terms
    def run(self) -> tuple:
        for act in self.spec.actions:
            for sign, term in ast.signed_terms(act.body):
                self.term(sign, term)
        return self.definitions(), tuple(self.deferred)

    def term(self, sign, e):
        lv, tv = self.lv, self.tv
        if isinstance(e, ast.LayerSum):
            body = e.body
            if isinstance(body, ast.Call) and body.name == "trace":
                return self.trace(sign, e, body)
            if isinstance(body, ast.Expectation) and body.log:
                self.layer_range(e, "1", self.depth)
                return self.log_z(sign, body)
            if isinstance(body, ast.Integral):
                self.layer_range(e, "1", self.depth)
                return self.kernel_pairs(sign, body)
            raise self.err(StructureSpecError, "a layer sum in a deep action holds kernel pairs, a log E[...] per layer "
                           "or a trace pairing of responses", body.pos,
                           hint=f"e.g. sum({lv} = 1..{self.depth}: integral(integral(hat Q[{lv}]({tv}, s) "
                                f"Q[{lv}]({tv}, s), s <= {tv}), {tv}))")
        if isinstance(e, ast.Integral) and e.var == tv and e.cmp is None:
            return self.constraint(sign, e)
        raise self.err(StructureSpecError, "this term of a deep action is not one dmftc can derive", e.pos,
                       hint=f"deep actions hold layer sums (kernel pairs, log E[...], trace pairings) and "
                            f"constraints integral(hat X({tv}) (X({tv}) - ...), {tv})")

    def layer_range(self, e, lo, hi):
        if (e.lo, e.hi) != (lo, hi) or e.var != self.lv:
            raise self.err(StructureSpecError, f"this layer sum must run over the hidden layers, "
                           f"{self.lv} = {lo}..{hi}", e.pos,
                           hint=f"write sum({self.lv} = {lo}..{hi}: ...)")

    def double_integral(self, e):
        """integral(integral(body, s <= t), t) -> (body, s)."""
        tv = self.tv
        inner = e.body if isinstance(e, ast.Integral) and e.var == tv and e.cmp is None else None
        if not (isinstance(inner, ast.Integral) and inner.cmp == "<=" and inner.upper == tv):
            raise self.err(StructureSpecError, "two-time terms of a deep action are double integrals over s <= t",
                           e.pos, hint=f"write integral(integral(..., s <= {tv}), {tv})")
        return inner.body, inner.var

    def split_hat(self, e, two_times):
        """(hat node, the product of the other factors) of a product with exactly one dual variable."""
        fs = _factors(e)
        hats = [f for f in fs if isinstance(f, ast.Hat)]
        if len(hats) != 1 or any(not isinstance(f, ast.Hat) and any(isinstance(x, ast.Hat) for x in ast.walk(f))
                                 for f in fs):
            raise self.err(StructureSpecError, "each term here must be one dual variable times an expression "
                           "without duals", e.pos, hint="the action is linear in every dual variable")
        h = hats[0]
        if two_times and (h.indices != (self.lv,) or h.time2 is None):
            raise self.err(StructureSpecError, f"'hat {h.name}' here is the dual of a two-time kernel of layer "
                           f"{self.lv}", h.pos, hint=f"write hat {h.name}[{self.lv}]({self.tv}, s)")
        rest = [f for f in fs if f is not h]
        if not rest:
            raise self.err(StructureSpecError, f"'hat {h.name}' multiplies nothing", h.pos)
        return h, _product(rest, e.pos)

    def kernel_pairs(self, sign, e):
        body, s = self.double_integral(e)
        for sg, t in ast.signed_terms(body, sign):
            h, rest = self.split_hat(t, True)
            want = ast.Call(rest.pos, h.name, (self.lv,), (ast.Name(rest.pos, self.tv), ast.Name(rest.pos, s)))
            if sg < 0 or rest != want:
                raise self.err(StructureSpecError, f"the kernel pair of 'hat {h.name}' must be "
                               f"+hat {h.name}[{self.lv}]({self.tv}, {s}) {h.name}[{self.lv}]({self.tv}, {s})",
                               t.pos, hint="the dual multiplies its own kernel at the same layer and times")
            if h.name in self.pairs:
                raise self.err(SpecError, f"a second kernel pair for '{h.name}'", t.pos)
            self.pairs[h.name] = t.pos

    def log_z(self, sign, e):
        arg = e.body
        ok = sign > 0 and isinstance(arg, ast.Call) and arg.name == "exp" and len(arg.args) == 1
        if not ok:
            raise self.err(StructureSpecError, "a layer's log-partition function is "
                           "+log E[exp(-integral(integral(..., s <= t), t))]", e.pos,
                           hint="the dual variables enter the single-site weight as exp(-sum hat Q O_Q)")
        body, s = self.double_integral(arg.args[0].operand if isinstance(arg.args[0], ast.Neg)
                                       else arg.args[0])
        for sg, t in ast.signed_terms(body, 1 if isinstance(arg.args[0], ast.Neg) else -1):
            h, rest = self.split_hat(t, True)
            if h.name in self.obs:
                raise self.err(SpecError, f"'hat {h.name}' appears twice in the log-partition function", t.pos)
            self.obs[h.name] = (rest if sg > 0 else ast.Neg(rest.pos, rest), s, t.pos)

    def trace(self, sign, e, call):
        args = call.args
        refs = []
        for a in args:
            if not (isinstance(a, ast.Indexed) and len(a.indices) == 1):
                raise self.err(StructureSpecError, "trace pairs two response kernels of adjacent layers, "
                               f"trace(P[{self.lv}], R[{self.lv}+1])", a.pos)
            refs.append((a.name, self._offset(a.indices[0], a.pos)))
        if len(args) != 2 or sign > 0:
            raise self.err(StructureSpecError, "the response pairing enters the action as "
                           f"- sum({self.lv} = ..: trace(P[{self.lv}], R[{self.lv}+1]))", call.pos)
        (p, a), (r, b) = refs
        if b - a != 1:
            raise self.err(StructureSpecError, f"trace pairs a kernel with the next layer's: "
                           f"trace({p}[{self.lv}], {r}[{self.lv}+1])", call.pos)
        self.pairings.append((p, r, call.pos))

    def _offset(self, text, pos):
        t = text.replace(" ", "")
        if t == self.lv:
            return 0
        for op in "+-":
            if t.startswith(self.lv + op) and t[len(self.lv) + 1:].isdigit():
                return int(t[len(self.lv) + 1:]) * (1 if op == "+" else -1)
        raise self.err(StructureSpecError, f"layer reference '{text}' must be {self.lv}, {self.lv}+k or "
                       f"{self.lv}-k inside the layer sum", pos)

    def constraint(self, sign, e):
        h, rest = self.split_hat(e.body, False)
        tv = self.tv
        if h.time2 is not None or h.indices or h.time != tv:
            raise self.err(StructureSpecError, f"'hat {h.name}' of a constraint is the dual of a one-time order "
                           f"parameter at {tv}", h.pos, hint=f"write hat {h.name}({tv})")
        own = ast.Call(rest.pos, h.name, (), (ast.Name(rest.pos, tv),))
        parts = list(ast.signed_terms(rest))
        mine = [k for k, (sg, x) in enumerate(parts) if x == own]
        if len(mine) == 1 and parts[mine[0]][0] > 0 and len(parts) > 1:
            others = [(-sg, x) for k, (sg, x) in enumerate(parts) if k != mine[0]]   # X(t) = -(the others)
            value = others[0][1] if others[0][0] > 0 else ast.Neg(others[0][1].pos, others[0][1])
            for sg, x in others[1:]:
                value = ast.BinOp(x.pos, "+" if sg > 0 else "-", value, x)
        else:
            raise self.err(StructureSpecError, f"a constraint is integral(hat {h.name}({tv}) ({h.name}({tv}) - ...), "
                           f"{tv})", rest.pos, hint=f"write {h.name}({tv}) first; the saddle point is {h.name}({tv}) "
                                                 "= what follows the minus sign")
        if sign < 0:
            raise self.err(StructureSpecError, "constraints enter the action with a plus sign", e.pos)
        if h.name in self.scalars:
            raise self.err(SpecError, f"a second constraint for '{h.name}'", e.pos)
        self.scalars[h.name] = (value, e.pos)

    # ------------------------------------------------------------------ saddle-point equations
    def definitions(self) -> tuple:
        lv, tv = self.lv, self.tv
        out = []
        for name, pos in self.pairs.items():
            if name not in self.obs:
                raise self.err(StructureSpecError, f"'hat {name}' pairs with its kernel but enters no layer's "
                               "log-partition function", pos,
                               hint=f"add hat {name}[{lv}]({tv}, s) O({tv}, s) to the exponent of log E[...]")
            body, s, _ = self.obs[name]
            out.append(ast.FieldDecl(pos, name, (lv,), tv, ast.Expectation(body.pos, body, False), s))
        for name, (_, _, pos) in self.obs.items():
            if name not in self.pairs:
                raise self.err(StructureSpecError, f"'hat {name}' enters the log-partition function but has no "
                               "kernel pair", pos, hint=f"add integral(integral(hat {name}[{lv}]({tv}, s) "
                                                        f"{name}[{lv}]({tv}, s), s <= {tv}), {tv}) in a layer sum")
        for p, r, pos in self.pairings:
            out.append(self.response(r, p, 1, pos))       # P[l-1] in a field of layer l: defines R[l]
            out.append(self.response(p, r, -1, pos))      # R[l+1] in a field of layer l: defines P[l]
        for name, (value, pos) in self.scalars.items():
            out.append(ast.FieldDecl(pos, name, (), tv, value))
        return tuple(out)

    def response(self, defined, kernel, offset, pos):
        """``defined[l](t, s) = E[d V(t) / d xi[l](s)]`` from the field of layer l holding kernel[l - offset]."""
        lv, tv = self.lv, self.tv
        want = f"{lv}-1" if offset == 1 else f"{lv}+1"
        gp = {tg.name for src in self.spec.sources for tg in src.targets}
        for f in self.spec.fields:
            if f.time2 is not None or f.indices != (lv,):
                continue
            found = [e for e in ast.walk(f.body) if isinstance(e, ast.TimeSum)
                     and any(isinstance(x, ast.Call) and x.name == kernel for x in _factors(e.body))]
            if not found:
                continue
            ts = found[0]
            fs = _factors(ts.body)
            k = next(x for x in fs if isinstance(x, ast.Call) and x.name == kernel)
            if k.indices != (want,) or len(k.args) != 2:   # reported after the checker's own verdict
                self.deferred.append(self.err(StructureSpecError, f"the trace pairing needs "
                                              f"{kernel}[{want}]({tv}, {ts.var}) in the field '{f.name}' of layer "
                                              f"{lv}", k.pos))
            rest = [x for x in fs if x is not k]
            if not rest:
                raise self.err(StructureSpecError, f"{kernel} multiplies nothing in '{f.name}'", k.pos)
            src = [x for s_, x in ast.signed_terms(f.body) if s_ > 0 and isinstance(x, ast.Call) and x.name in gp]
            if len(src) != 1:
                raise self.err(StructureSpecError, f"the field '{f.name}' holding the response kernel {kernel} "
                               "needs one gp source added to it", f.pos, hint=f"write {f.name}[{lv}]({tv}) = "
                                                                               f"xi[{lv}]({tv}) + ...")
            v_t = _rename(_product(rest, ts.pos), ts.var, tv)
            wrt = ast.Call(pos, src[0].name, (lv,), (ast.Name(pos, "s"),))
            return ast.FieldDecl(pos, defined, (lv,), tv, ast.Response(pos, v_t, wrt), "s")
        raise self.err(StructureSpecError, f"the response kernel '{kernel}' of the trace pairing appears in no field "
                       f"of layer {lv}", pos, hint=f"a field of layer {lv} must hold sum(s < {tv}: "
                                                   f"{kernel}[{want}]({tv}, s) ...)")


def lower_deep_action(spec: ast.Spec, err) -> tuple:
    """(definitions, deferred errors): the definition statements (kernels, responses, one-time order parameters)
    the deep action implies (module doc), and located errors of response kernels at unexpected layers, which the
    caller raises only if its own checks of the field equations pass; ``err(cls, message, pos, hint=...)``
    builds a located error."""
    return _Lowering(spec, err).run()


expr_text = ast.to_text          # the printer of the derived equations (dmftc derive)
