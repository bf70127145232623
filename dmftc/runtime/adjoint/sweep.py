"""The march as a function of the perturbations of its averages and of its path weights; W and V by one
reverse-mode sweep (:mod:`dmftc.runtime.adjoint`)."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from dmftc.errors import StructureSpecError
from dmftc.runtime.march.site_march import adjoint_march

__all__ = ["Program", "output_names", "output_vector", "reverse_sweep", "kappa_part"]


@dataclass(frozen=True)
class Program:
    """A deep spec's generated module with what its march needs: the activation's derivatives ``act``, the
    parameter values ``p`` (traced), depth ``L``, steps ``T`` and the delta width."""
    mod: object
    act: tuple
    p: dict
    L: int
    T: int
    width: float = 0.0

    @property
    def responses(self) -> dict:
        """{response name: the source it differentiates by}."""
        return dict(self.mod.SITE["responses"])

    @property
    def sources(self) -> tuple:
        """The sources that responses differentiate by, sorted."""
        return tuple(sorted(set(self.responses.values())))

    def march(self, xi, wts, **kw) -> dict:
        return adjoint_march(self.mod, self.act, self.L, self.T, xi, wts, self.p, width=self.width, **kw)

    def zero_shift(self) -> dict:
        """The perturbations eps of every average, zero: kernel and response rows per layer, direct readouts."""
        site = self.mod.SITE
        fixed = {sym for sym, _, _ in site["fixed"]}
        out = {("row", n, l): jnp.zeros((self.T, self.T)) for n in site["kernels"] + tuple(self.responses)
               for l in range(1, self.L + 1)}
        out.update({("avg", sym): jnp.zeros(self.T) for _, syms in site["readouts"] for sym in syms
                    if sym not in fixed})
        return out

    def measured(self, c: dict) -> dict:
        """The averages a march state ``c`` computed, keyed as :meth:`zero_shift`."""
        return {k: (c["rows"][(k[1], k[2])] if k[0] == "row" else c["avg"][("direct", k[1])])
                for k in self.zero_shift()}


def output_names(prog: Program) -> list:
    """The outputs, in their order: the time diagonals of the order parameters (``mod.ORDERS``), two-time ones per
    layer."""
    return [f"{name}[{l}]" if times == 2 else name for name, times in prog.mod.ORDERS
            for l in (range(1, prog.L + 1) if times == 2 else (None,))]


def output_vector(prog: Program, c: dict):
    """The outputs of a march state ``c``, stacked in the order of :func:`output_names` (len(names) T,)."""
    mod, L, T = prog.mod, prog.L, prog.T
    rows, q1 = c["rows"], c["q1"]
    bounds = mod.boundaries(prog.p) if hasattr(mod, "boundaries") else {}

    def diag(name, layer):
        if 1 <= layer <= L:
            return jnp.diagonal(rows[(name, layer)])
        label = "0" if layer == 0 else "L+1" if layer == L + 1 else None
        if (name, label) not in bounds:
            raise StructureSpecError(f"{mod.SPEC_PATH}: no constant boundary value of {name} at layer {label}; the "
                                     "adjoint prototype reads constant boundaries only")
        return jnp.full(T, bounds[(name, label)], dtype=jnp.float64)

    parts = []
    for name, times in mod.ORDERS:
        if times == 2:
            parts.extend(diag(name, l) for l in range(1, L + 1))
        elif name in q1:
            parts.append(jnp.reshape(q1[name], (T,)))
        elif name in getattr(mod, "SCALARS", ()):
            parts.append(getattr(mod, f"scalar_{name}")(diag, prog.p))
        else:
            raise StructureSpecError(f"{mod.SPEC_PATH}: the order parameter {name} is neither a readout, a scalar "
                                     "nor a kernel; the adjoint prototype cannot output it")
    return jnp.concatenate(parts)


def reverse_sweep(prog: Program, xi: dict, wts):
    """(outputs, W, V, state): W = d outputs / d eps ({key of :meth:`Program.zero_shift`: (R, ...)}),
    V = d outputs / d wts (R, S), by one vjp of the march vectorised over the R outputs' cotangents, and the
    saddle's march state."""
    def run(shift, w):
        c = prog.march(xi, w, shift=shift)
        return output_vector(prog, c), {"rows": c["rows"], "q1": c["q1"]}

    out, vjp, state = jax.vjp(run, prog.zero_shift(), wts, has_aux=True)
    W, V = jax.vmap(vjp)(jnp.eye(out.shape[0], dtype=out.dtype))
    return out, W, V, state


def kappa_part(V, wts):
    """W kappa W^T: the weighted covariance over the paths of V_p = W O_p (R, R)."""
    mean = V @ wts
    Vc = V - mean[:, None]
    return (Vc * wts[None, :]) @ Vc.T
