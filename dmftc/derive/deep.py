"""Stage 4 for deep networks: symbolic derivation (SymPy) from the IR of a deep spec (:mod:`dmftc.ir.deep`).

What is derived, for the generic hidden layer ``l`` (time arguments explicit, ``t`` the current step):

* the roles of the spec's names: the forward field ``h`` (its source ``u ~ gp(0, Phi[l-1])``), the backward
  field ``z`` (source ``r ~ gp(0, G[l+1])``), the gradient field ``g = a(h) z + b(h)`` (gradient descent:
  ``a = phi'``, ``b = 0``; other a and b, e.g. a surrogate derivative, are derived alike), the kernels
  ``Phi[l] = <phi(h) phi(h)>`` and ``G[l] = <g g>`` and the responses ``A[l] = <d phi(h(t)) / d r(s)>``,
  ``B[l] = <d g(t) / d u(s)>`` (the names are the user's);
* the coupling kernels: ``h(t) = u(t) + sum_{s<t} c_h(t, s) g(s)`` and
  ``z(t) = r(t) + sum_{s<=t} c_z0(t, s) phi(h(s)) + sum_{s<t} c_z(t, s) phi(h(s))`` with the coefficients as
  SymPy expressions of the adjacent layer's order parameters and responses (``integral(x, s < t)`` is
  ``eta * sum_{s<t} x``);
* the readout: every average ``E[z[L](t1) phi(h[L](t1))]`` in a scalar order parameter is reduced by
  Stein's lemma for the Gaussian source ``r[L]`` to order parameters and responses,
  ``sum_{s<t1} G[L+1](t1, s) A[L](t1, s) + sum_{s<=t1} c_z0 Phi[L] + sum_{s<t1} c_z Phi[L]``;
* scalar order parameters given by layer sums of equal-time kernels (``K``);
* the Hessian structure (printed by ``dmftc derive``): field sensitivities obtained by differentiating the
  field equations, the Price-theorem term of kernels that are source covariances, kappa and D blocks, the
  response blocks and their Schur complement.  :func:`unroll` builds the field equations at explicit
  times for small T, on which the same derivatives are exact SymPy expressions (used by the tests).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from dmftc.derive.activation import derivatives as act_derivatives
from dmftc.frontend.builtins import BUILTINS
from dmftc.frontend.check_deep import DeepModel
from dmftc.ir.deep import DeepLowering, layer_ref, activation_functions, lower_deep
from dmftc.ir.nodes import ModelIR
from dmftc.errors import SpecError, StructureSpecError

_BUILTINS = BUILTINS


@dataclass(frozen=True)
class Couplings:
    """Coefficients of the causal sums of the forward and backward field equations (functions of t, s)."""

    h_past: sp.Expr          # coefficient of g(s), s < t, in h(t)
    z_upto: sp.Expr          # coefficient of phi(h(s)), s <= t, in z(t)
    z_past: sp.Expr          # coefficient of phi(h(s)), s < t, in z(t)


@dataclass(frozen=True)
class ScalarDef:
    """A one-time order parameter: ``expr`` of parameters, ``X[k]`` placeholders and layer sums."""

    name: str
    expr: sp.Expr
    averages: tuple            # ((placeholder symbol, time text 't' or '0'), ...): E[z[L](t1) phi(h[L](t1))]
    in_march: bool             # used by the field equations (computed during the march)

    @property
    def affine(self) -> bool:
        """Affine in its readout averages (the squared loss, with any per-point weights); otherwise another loss,
        which the propagator linearises at each saddle and the O(1/N) mean correction refuses."""
        syms = [ph for ph, _ in self.averages]
        return all(sp.simplify(sp.diff(self.expr, a, b)) == 0 for a in syms for b in syms)


@dataclass(frozen=True)
class DeepDerivation:
    model: DeepModel
    t: sp.Symbol
    s: sp.Symbol
    act_arg: sp.Symbol
    phi: tuple                  # (phi, phi', ..., phi'''') of act_arg, concrete SymPy (dmftc.derive.activation)
    roles: dict                 # role -> spec name: h z g u r Phi G A B
    couplings: Couplings
    boundaries: dict            # family -> ((LayerRef, constant SymPy expr), ...)
    scalars: tuple              # ScalarDef, declaration order
    readout_stein: sp.Expr      # E[z[L](t) phi(h[L](t))] reduced to order parameters (printing)
    params: tuple               # scalar parameter names (declaration order), then steps, step
    positions: tuple = ()       # ((what, Pos), ...): spec text of 'h', 'z', each scalar, each boundary 'Phi[0]'
    site: object = None         # the single-site program (dmftc.derive.site.SiteProgram), printed for the site march
    grad: tuple = ()            # (a, a', a'', a''', b, b', b'', b''') of g = a(h) z + b(h), concrete, in act_arg
    grad_abstract: tuple = ()   # (a, b) with the activation's derivatives as abstract functions (printing)
    scale: sp.Expr = sp.Integer(1)   # k(t) of the activation's argument k(t) h(t): one-time coefficients, or 1

    @property
    def standard_gradient(self) -> bool:
        """g = phi'(h) z: the gradient field of gradient descent."""
        return sp.simplify(self.grad[0] - self.phi[1]) == 0 and sp.simplify(self.grad[4]) == 0

    @property
    def linear(self) -> bool:
        """phi(h) = h and g = z exactly: every field is Gaussian, and the network is the deep linear one."""
        return sp.simplify(self.phi[0] - self.act_arg) == 0 and self.standard_gradient and self.scale == 1

    @property
    def kink_order(self):
        """The lowest derivative order holding a delta function: phi^(k), or a^(k-1), b^(k-1) of the gradient
        field (one derivative of phi further along); None when smooth through that order."""
        orders = [k for k, e in enumerate(self.phi) if e.has(sp.DiracDelta)]
        orders += [k % 4 + 1 for k, e in enumerate(self.grad) if e.has(sp.DiracDelta)]
        return min(orders, default=None)

    @property
    def readout_affine(self) -> bool:
        """The error signal is affine in the readout averages (:attr:`ScalarDef.affine`)."""
        return next(sc for sc in self.scalars if sc.in_march).affine

    def rowname(self, family: str, ref: str) -> str:
        return f"{family}[{ref}]"


class _Deriver(DeepLowering):
    # ------------------------------------------------------------ structure
    def __init__(self, ir: ModelIR):
        super().__init__(ir.model)
        self.ir = ir

    def run(self) -> DeepDerivation:
        """The deep structure, read from the IR (positions for errors from the checked model)."""
        m, t, s, ir = self.m, self.t, self.s, self.ir
        decl = {g.name: g.decl for g in m.sources}
        by_offset = {}
        for g in ir.sources:
            by_offset.setdefault(g.layer_offset, []).append(g)
        fwd, bwd = (by_offset.get(k, [None])[0] for k in (-1, +1))
        if fwd is None or bwd is None or len(ir.sources) != 2:
            pos = m.sources[0].decl.pos if m.sources else m.spec.model.pos
            raise self.err("a deep spec has two gp sources: one with the covariance of layer l-1 (forward) and one "
                           "with that of layer l+1 (backward)", pos,
                           hint="write u[l] ~ gp(0, Phi[l-1]) and r[l] ~ gp(0, G[l+1])")
        fwd_name, bwd_name = fwd.targets[0][0], bwd.targets[0][0]
        fwd_cov, bwd_cov = fwd.depends_on[0], bwd.depends_on[0]
        eqs = {f.name: f for f in m.fields}
        parsed = {f.name: _placeholders(f, t) for f in ir.fields}
        src = lambda name: sp.Function(f"{name}[{m.layer_var}]")(t)  # noqa: E731
        h = next((n for n, (e, _) in parsed.items() if e.has(src(fwd_name))), None)
        z = next((n for n, (e, _) in parsed.items() if e.has(src(bwd_name))), None)
        if h is None or z is None or h == z or len(m.fields) != 3:
            raise self.err("a deep spec has three per-layer fields: a forward field with the forward source, a "
                           "backward field with the backward source, and the gradient field g = a(h) z + b(h) (phi'(h) z for "
                           "gradient descent)",
                           m.fields[0].pos if m.fields else m.spec.model.pos)
        g = next(n for n in eqs if n not in (h, z))
        lv = m.layer_var
        F = lambda n, arg: sp.Function(f"{n}[{lv}]")(arg)  # noqa: E731
        phi = self.phi_f[0]
        # the activation's argument: k(t) h(t), k a product of one-time coefficients (1 without any)
        k = self.activation_scale(parsed[z], F(h, s), eqs[z])
        kt = k.subs(s, t)
        # gradient field
        if k == 1:
            grad_abstract = self.gradient_field(parsed[g], F(h, t), F(z, t), eqs[g], g, h, z)
        else:
            grad_abstract = self.scaled_gradient(parsed[g], F(h, t), F(z, t), kt, eqs[g], g)
        h_past, h_upto = self.split(h, parsed[h], src(fwd_name), F(g, s), eqs[h])
        if h_upto != 0:  # pragma: no cover - a same-time cycle, rejected by the checker
            raise self.err("the forward field cannot use the gradient field at the same time", eqs[h].body.pos)
        z_past, z_upto = self.split(z, parsed[z], src(bwd_name), phi(k * F(h, s)), eqs[z])
        # families and responses
        if fwd_cov == bwd_cov:
            raise self.err("the forward and backward sources need different kernels", decl[bwd_name].cov.pos)
        want = {fwd_cov: phi(kt * F(h, t)) * phi(k * F(h, s)), bwd_cov: F(g, t) * F(g, s)}
        for o in (o for o in ir.orders if o.kind == "average" and o.times == 2):
            name, eq = o.name, m.definitions[o.name]
            if name not in want:
                raise self.err(f"order parameter '{name}' is not a source covariance; the deep runtime supports the "
                               "two kernels that are", eq.pos, hint="remove it or use it as a gp covariance")
            if sp.simplify(o.observable - want[name]) != 0:
                raise self.err(f"'{name}[{lv}]' must be the average {want[name]} (the covariance its source needs)",
                               eq.body.pos)
        roles = {"h": h, "z": z, "g": g, "u": fwd_name, "r": bwd_name, "Phi": fwd_cov, "G": bwd_cov}
        for o in (o for o in ir.orders if o.kind == "response"):
            name, eq, of = o.name, m.definitions[o.name], o.observable
            if o.wrt == bwd_name and of == phi(kt * F(h, t)):
                roles["A"] = name
            elif o.wrt == fwd_name and of == F(g, t):
                roles["B"] = name
            else:
                raise self.err(f"response '{name}' must be E[d {self.act.name}({h}[{lv}](t)) / d {bwd_name}[{lv}](s)] "
                               f"or E[d {g}[{lv}](t) / d {fwd_name}[{lv}](s)]", eq.body.pos)
        for role in ("A", "B"):
            if role not in roles:
                raise self.err("a deep spec defines both response functions (of phi(h) to the backward source and of "
                               "g to the forward source)", m.spec.model.pos)
        # which adjacent-layer quantities each coupling may use
        allowed_h = {f"{roles['Phi']}[{lv}-1]", f"{roles['A']}[{lv}-1]"}
        allowed_z = {f"{roles['G']}[{lv}+1]", f"{roles['B']}[{lv}+1]"}
        self.restrict(h_past, allowed_h, eqs[h], "forward")
        self.restrict(z_past + z_upto, allowed_z, eqs[z], "backward")
        # boundaries
        bounds = {}
        for b in ir.boundaries:
            bounds.setdefault(b.name, []).append((layer_ref(b.layer, m), b.value))
        bounds = {k: tuple(v) for k, v in bounds.items()}
        # scalar order parameters
        scalars = []
        used = {str(a.func) for f in ir.fields for a in f.expr.atoms(sp.Function)}
        for o in (o for o in ir.orders if o.times == 1):
            placeholders = tuple((a.symbol, self.readout_average(a, roles, k)) for a in o.averages)
            scalars.append(ScalarDef(o.name, -o.rest / o.coeff, placeholders, o.name in used))
        march = [sc for sc in scalars if sc.in_march]
        for sc in scalars:
            if sc.in_march and not sc.averages:
                raise self.err(f"'{sc.name}' is used by the field equations but is not a readout of the last layer",
                               m.definitions[sc.name].pos,
                               hint="the deep runtime computes one such order parameter during the march")
        if len(march) != 1:
            raise self.err("the field equations must use exactly one scalar order parameter (the error signal)",
                           m.fields[0].pos)
        for sc in scalars:
            if not sc.in_march and sc.averages:
                raise self.err(f"'{sc.name}' uses averages but is not used by the field equations", 
                               m.definitions[sc.name].pos)
            if not sc.in_march and any(isinstance(f, sp.Function) and str(f.func) in {o.name for o in ir.orders if o.times == 1}
                                       for f in sc.expr.atoms(sp.Function)):
                raise self.err(f"'{sc.name}' may use kernels and parameters only", m.definitions[sc.name].pos)
        Lp1 = {"G": f"{roles['G']}[{m.depth}+1]", "B": f"{roles['B']}[{m.depth}+1]"}
        stein = kt * (sp.Sum(sp.Function(Lp1["G"])(t, s) * sp.Function(f"{roles['A']}[{m.depth}]")(t, s), (s, 0, t - 1))
                 + sp.Sum(z_upto.subs(_layer_subs(z_upto, lv, m.depth)) * sp.Function(f"{roles['Phi']}[{m.depth}]")(t, s),
                          (s, 0, t))
                 + sp.Sum(z_past.subs(_layer_subs(z_past, lv, m.depth)) * sp.Function(f"{roles['Phi']}[{m.depth}]")(t, s),
                          (s, 0, t - 1)))
        params = tuple(p.name for p in m.spec.params) + (m.spec.time.steps_name, m.spec.time.step_name)
        try:
            phis = act_derivatives(self.concrete_phi(0))
        except (ValueError, TypeError, NotImplementedError) as err:
            raise self.err(f"cannot differentiate the activation four times: {err}", self.act.body.pos,
                           hint="use elementwise functions of h; kinks from abs, max, min of expressions in h")
        positions = [("h", eqs[h].body.pos), ("z", eqs[z].body.pos)]
        positions += [(sc.name, m.definitions[sc.name].pos) for sc in scalars]
        positions += [(f"{name}[{ref.text()}]", eq.pos) for name, bs in m.boundaries.items() for ref, eq in bs]
        from dmftc.derive.site_lowering import site_program

        grad = self.gradient_derivatives(grad_abstract, phis, eqs[g])
        return DeepDerivation(m, t, s, self.x, phis, roles, Couplings(h_past, z_upto, z_past), bounds,
                              tuple(scalars), stein, params, tuple((w, p) for w, p in positions if p is not None),
                              site_program(self.ir), grad, grad_abstract, kt)

    # ------------------------------------------------------------ a scaled activation argument
    def activation_scale(self, parsed, H, eq):
        """k(s) of the activation's argument k(s) h(s) in the backward field's sums: 1, or a product of one-time
        coefficients at s (a weight decay, specs/deep_sgd.dmft); a located error for anything else."""
        ones = {c.name for c in self.m.coefficients if c.one_time}
        args = {a.args[0] for _, (_, body, _) in parsed[1].items() for a in body.atoms(self.phi_f[0])}
        if not args:
            return sp.Integer(1)              # (the split of the field reports a driver it does not find)
        if len(args) > 1:
            raise self.err(f"the activation's argument differs between the sums of the backward field: "
                           f"{', '.join(sorted(map(str, args)))}", eq.body.pos,
                           hint=f"write {self.act.name}({H}) (or a one-time coefficient at s times it) in every sum")
        k = sp.simplify(next(iter(args)) / H)
        fs = k.atoms(sp.Function)
        if k == 1 or (fs and not k.free_symbols - {self.s} and k.is_Mul in (True, False) and all(
                str(f.func) in ones and f.args == (self.s,) for f in fs) and all(
                isinstance(x, sp.Function) for x in sp.Mul.make_args(k))):
            return k
        raise self.err(f"the activation's argument must be {H} or a one-time coefficient at s times it, "
                       f"not {next(iter(args))}", eq.body.pos,
                       hint="one-time coefficients a(t) = ...; a(0) = ... scale the activation's argument")

    def scaled_gradient(self, parsed, H, Z, kt, eq, g):
        """With the activation's argument k(t) h(t), the gradient field of gradient descent is the derivative of
        phi(k h) in h times z, k(t) phi'(k(t) h(t)) z(t): (a, b) = (phi'(x), 0) at the argument x = k h."""
        gexpr, gsums = parsed
        if gsums or sp.simplify(gexpr - kt * self.phi_f[1](kt * H) * Z) != 0:
            lv, tv = self.m.layer_var, self.m.time_var
            raise self.err(f"with the activation's argument {kt * H}, the gradient field must be "
                           f"{g}[{lv}]({tv}) = {kt} * {self.act.name}'({kt * H}) * {Z}", eq.body.pos,
                           hint="the derivative of phi(k h) in h, times z (gradient descent)")
        return self.phi_f[1](self.x), sp.Integer(0)

    # ------------------------------------------------------------ the gradient field
    def gradient_field(self, parsed, H, Z, eq, g, h, z):
        """(a, b) of the gradient field g(t) = a(h(t)) z(t) + b(h(t)), as expressions in the activation's
        argument x (the activation's derivatives as the abstract functions phi', phi'', ...); a located error
        for any other form."""
        m, lv, tv = self.m, self.m.layer_var, self.m.time_var
        gexpr, gsums = parsed
        form = f"{g}[{lv}]({tv}) = a({h}[{lv}]({tv})) * {z}[{lv}]({tv}) + b({h}[{lv}]({tv}))"
        hint = (f"gradient descent is {g}[{lv}]({tv}) = {self.act.name}'({h}[{lv}]({tv})) * {z}[{lv}]({tv}); a "
                f"surrogate derivative replaces {self.act.name}' by another function of {h}[{lv}]({tv})")
        x, undef = self.x, sp.core.function.AppliedUndef
        a = sp.simplify(sp.expand(sp.diff(gexpr, Z)).subs(H, x))
        b = sp.simplify(sp.expand(gexpr.subs(Z, 0)).subs(H, x))
        others = {str(f) for e in (a, b) for f in e.atoms(undef)}          # fields and sources of any layer
        syms = {str(v) for e in (a, b) for v in e.xreplace({f: sp.Integer(1) for f in e.atoms(undef)}).free_symbols}
        syms -= {p.name for p in m.spec.params} | {str(x)}
        if gsums or a.has(Z) or others or syms or a == 0:
            if gsums:
                what = "a sum over time"
            elif a.has(Z):
                what = f"a term nonlinear in {z}[{lv}]({tv})"
            elif others or syms:
                what = ", ".join(sorted(others | syms))
            else:
                what = f"no {z}[{lv}]({tv})"
            raise self.err(f"the gradient field must be {form}, with functions a and b of the same layer's "
                           f"{h}[{lv}]({tv}) only; this one has {what}", eq.body.pos, hint=hint)
        return a, b

    def gradient_derivatives(self, ab, phis, eq):
        """(a, a', a'', a''', b, b', b'', b''') in the activation's argument, concrete (the spec's phi, whose
        derivatives ``phis`` are distributions); derivatives in the sense of distributions, as for the activation
        (:mod:`dmftc.derive.activation`)."""
        def concrete(e):
            return e.xreplace({f: phis[self.phi_f.index(type(f))].subs(self.x, f.args[0])
                               for f in e.atoms(sp.Function) if type(f) in self.phi_f})

        if ab[0] == self.phi_f[1](self.x) and ab[1] == 0:           # gradient descent: phi' and its derivatives
            return tuple(phis[1:5]) + (sp.Integer(0),) * 4
        out = []
        for e in ab:
            try:
                out.extend(act_derivatives(concrete(e), 3))
            except (ValueError, TypeError, NotImplementedError) as err:
                raise self.err(f"cannot differentiate the gradient field three times: {err}", eq.body.pos) from None
        return tuple(out)

    def split(self, name, parsed, source, driver, eq):
        """expr = source + sum_{s<t} c_past * driver + sum_{s<=t} c_upto * driver: return (c_past, c_upto)."""
        expr, sums = parsed
        local = expr.subs({ph: 0 for ph in sums})
        if sp.simplify(local - source) != 0:
            raise self.err(f"the field '{name}' must be its source plus causal sums: {source} + sum(...)",
                           eq.body.pos, hint="fields of a deep spec are driven by their own source at the "
                                             "current time and by sums over earlier times")
        out = {"<": sp.Integer(0), "<=": sp.Integer(0)}
        for ph, (cmp, body, pos) in sums.items():
            coeff = sp.diff(expr, ph)
            if coeff.free_symbols & set(sums):
                raise self.err("sums over time must enter the field equation linearly", pos)
            term = sp.expand(coeff * body)
            c = sp.simplify(term / driver)
            if c.has(driver) or any(c.has(sp.Function(f"{f.name}[{self.m.layer_var}]")) for f in self.m.fields) \
                    or c.has(self.phi_f[0]):
                raise self.err(f"the sum must be linear in {driver} (the deep runtime's {name}-equation form)",
                               pos, hint=f"write sum(s < t: coefficient(t, s) * {driver})")
            out[cmp] += c
        return sp.simplify(out["<"]), sp.simplify(out["<="])

    def restrict(self, coeff, allowed, eq, which):
        scal = {o.name for o in self.ir.orders if o.times == 1} | {c.name for c in self.m.coefficients}
        for f in coeff.atoms(sp.Function):
            n = str(f.func)
            if n in allowed or n in scal:
                continue
            if isinstance(f, sp.core.function.AppliedUndef):
                raise self.err(f"the {which} field's coupling uses {f}; the deep runtime supports the adjacent "
                               f"layer's {' and '.join(sorted(allowed))} and the error signal", eq.body.pos)

    def readout_average(self, avg, roles, k=sp.Integer(1)):
        """The time ('t' or '0') of a readout average E[z[L](t1) phi(h[L](t1))] (E[k z phi(k h)] with the
        activation's argument k(t1) h(t1)); anything else is an error."""
        m = self.m
        for t1 in (self.t, sp.Integer(0)):
            z = sp.Function(f"{roles['z']}[{m.depth}]")(t1)
            h = sp.Function(f"{roles['h']}[{m.depth}]")(t1)
            k1 = k.subs(self.s, t1)
            if sp.simplify(avg.expr - k1 * z * self.phi_f[0](k1 * h)) == 0:
                return str(t1)
        if not (isinstance(avg.expr, sp.Mul) and len(avg.expr.args) == 2):
            raise self.err(f"averages in '{avg.symbol}' must be E[{roles['z']}[{m.depth}](t) {self.act.name}("
                           f"{roles['h']}[{m.depth}](t))]", avg.pos)
        kt = "" if k == 1 else f"{k.subs(self.s, self.t)} "
        raise self.err(f"the deep runtime reads the output from E[{kt}{roles['z']}[{m.depth}](t) {self.act.name}("
                       f"{kt}{roles['h']}[{m.depth}](t))] (and the same at time 0)", avg.pos,
                       hint="the network output is the last layer's readout average")


def _placeholders(f, t):
    """A field's expression with each causal sum replaced by a placeholder symbol, and the sums
    ``{placeholder: (cmp, body, pos)}`` (cmp '<' or '<=')."""
    pos = dict(f.sum_pos)
    sums, rep = {}, {}
    for k, sm in enumerate(sorted(f.expr.atoms(sp.Sum), key=sp.default_sort_key)):
        ph = sp.Symbol(f"__sum{k}")
        (_, _, hi), = sm.limits
        sums[ph] = ("<=" if hi == t else "<", sm.function, pos.get(sm))
        rep[sm] = ph
    return f.expr.xreplace(rep), sums


def _layer_subs(expr, lv, depth):
    """Rename kernels of layer l+k to layer depth+k (couplings of the last layer)."""
    rep = {}
    for f in expr.atoms(sp.Function):
        n = str(f.func)
        if "[" in n and n.endswith("]"):
            base, ix = n[:-1].split("[", 1)
            if ix.startswith(lv):
                rep[f.func] = sp.Function(f"{base}[{depth}{ix[len(lv):]}]")
    return {a: rep[a.func](*a.args) for a in expr.atoms(sp.Function) if a.func in rep}


def derive_deep(model) -> DeepDerivation:
    """Derive the deep spec's structure from its IR (or a checked model, lowered first); raise a located
    SpecError if the runtime cannot solve it."""
    ir = model if isinstance(model, ModelIR) else lower_deep(model)
    model = ir.model
    try:
        return _Deriver(ir).run()
    except SpecError:
        raise
    except (TypeError, ValueError, ZeroDivisionError) as err:  # pragma: no cover - SymPy surprises
        raise StructureSpecError(f"cannot derive this deep spec: {err}", None, source=model.spec.source,
                                 filename=model.spec.filename) from None


__all__ = ["DeepDerivation", "derive_deep", "activation_functions", "Couplings", "ScalarDef"]
