"""An activation as the numerical code runs it (:class:`SiteActivation`): phi and its four derivatives as a
jit-able function, from a compiled spec's generated module or, for the Python API without a spec, from an
expression (:func:`as_activation`: parsed and differentiated by :mod:`dmftc.derive.activation`, printed by
:mod:`dmftc.codegen.activation`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import sympy as sp

from dmftc.codegen.activation import activation_source
from dmftc.derive.activation import Activation
from dmftc.runtime.numerics import kernels as _k

__all__ = ["SiteActivation", "as_activation", "site_activation"]


@dataclass(frozen=True)
class SiteActivation:
    """What the numerical code needs of an activation: ``fn(h) -> (phi, phi', phi'', phi''', phi'''')``
    (jax.numpy, elementwise), a hashable ``key`` for compilation caches, a label for messages, the order of
    the first derivative holding a (mollified) delta function, whether phi(h) = h, and the coefficients of
    a deep network's gradient field (:meth:`gradient`)."""

    key: tuple
    label: str
    fn: object = field(compare=False, hash=False)
    kink_order: int | None = None
    linear: bool = False
    width: float = 0.1
    rewidth: object = field(default=None, compare=False, hash=False, repr=False)
    # the gradient field g = a(h) z + b(h) of a deep network: h -> its coefficients (gradient()); None is
    # gradient descent, a = phi' and b = 0 (a compiled deep spec supplies its generated gradient())
    grad: object = field(default=None, compare=False, hash=False, repr=False)
    standard_gradient: bool = True
    # (generated module, parameter values) of the compiled deep spec this activation came from: its single-site
    # program is what the propagator differentiates (dmftc.runtime.sensitivities.site_local); None: the standard network's
    program: object = field(default=None, compare=False, hash=False, repr=False)
    # h -> phi(h), ..., h -> phi''''(h), one function each (a compiled spec's generated phi, dphi, ...): a program
    # that reads one derivative traces that one only; None: the k-th output of fn
    parts: tuple | None = field(default=None, compare=False, hash=False, repr=False)

    def derivative(self, k: int):
        """h -> the k-th derivative of phi (k = 0..4)."""
        if self.parts is not None:
            return self.parts[k]
        return lambda h: self.fn(h)[k]

    def gradient(self, h):
        """(a, a', a'', a''', b, b', b'', b''') of the gradient field g = a(h) z + b(h) at h."""
        if self.grad is not None:
            return self.grad(h)
        _, d1, d2, d3, d4 = self.fn(h)
        zero = 0.0 * d1
        return d1, d2, d3, d4, zero, zero, zero, zero

    def at_width(self, width: float) -> "SiteActivation":
        """The same activation with delta functions of another width (for the extrapolation width -> 0)."""
        if self.rewidth is None:
            raise ValueError(f"activation {self.label} cannot change its delta width")
        return self.rewidth(width)

    def numpy(self, h):
        """fn on numpy arrays, numpy results."""
        import numpy as np

        return tuple(np.asarray(v) for v in self.fn(h))

    @property
    def smooth(self) -> bool:
        return self.kink_order is None


def site_activation(act: Activation, width: float = 0.1) -> SiteActivation:
    """The jit-able function h -> (phi, ..., phi'''') of ``act``, delta functions as Gaussians of width ``width``."""
    ns = {"jnp": jnp, "jax": jax, "_k": _k}
    exec(compile(activation_source(act), f"<activation {sp.sstr(act.expr)}>", "exec"), ns)
    fn = ns["activation"]
    w = float(width)
    parts = tuple((lambda h, f=ns[f"activation_{k}"]: f(h, w)) for k in range(5))
    return SiteActivation(key=("expr", sp.srepr(act.expr), w), label=act.text or sp.sstr(act.expr),
                          fn=lambda h: fn(h, w), kink_order=act.kink_order, linear=act.linear, width=w,
                          rewidth=partial(site_activation, act), parts=parts)


def as_activation(activation, width: float = 0.1) -> SiteActivation:
    """A SiteActivation from one, an :class:`Activation`, or an expression / shorthand string."""
    if isinstance(activation, SiteActivation):
        return activation
    if isinstance(activation, Activation):
        return site_activation(activation, width)
    return _parsed(activation, float(width))


@lru_cache(maxsize=64)
def _parsed(text, width):
    return site_activation(Activation.parse(text), width)
