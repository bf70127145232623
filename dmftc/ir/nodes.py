"""The intermediate representation every spec lowers to (two-layer and deep alike).

A :class:`ModelIR` is the spec's action reduced to the objects the DMFT is made of:

* **order parameters** with one time index (``Delta[mu](t)``) or two (``Phi[l](t, s)``), optional sample axes
  and an optional layer axis, each defined by ``coeff * q + rest = <observable>`` (an average over the
  single-site process), by a deterministic constraint (no observable), or as a **response** ``<d of / d wrt>``;
* **sources**: Gaussian variables or processes whose covariance is a constant or an order parameter;
* **causal fields**: the single-site process, one equation per field, causal in time;
* **running sums** ``I(t) = eta * sum_{s<t} increment(s)`` found in fields and constraints;
* **boundaries** of layered order parameters (input kernel, readout gradient kernel, ...).

Expressions are SymPy (as produced by lowering); source covariances stay syntax trees, evaluated at run time.
The derivation stage (:mod:`dmftc.derive`) reads only this representation and the checked model's positions
(for located errors).  ``dmftc derive --ir SPEC`` prints it (:func:`dmftc.ir.text.format_ir`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from dmftc.frontend import ast


@dataclass(frozen=True)
class Axis:
    """An index of the model: ``mu in 1..P`` (kind 'sample') or ``l = 1..L`` (kind 'layer')."""

    name: str
    size: str
    kind: str


@dataclass(frozen=True)
class OrderParameter:
    """``coeff * q + rest = <observable>`` (kind 'average'); ``coeff * q + rest = 0`` ('constraint'); or the
    response ``q(t, s) = <d observable(t) / d wrt(s)>`` ('response').

    ``indices``: sample axes; ``layer``: the layer axis (deep families, responses); ``times``: 1 or 2.
    ``averages``: single-site averages a constraint reads (:class:`Average`).  ``same_time``: the order
    parameters declared earlier whose value at the same time ``rest`` reads (a derived order parameter such as
    r(t) = -log(Delta(t) / y), or a softmax error signal of the outputs f[mu, d](t)); the march evaluates them
    first and U gets their same-time partials."""

    name: str
    indices: tuple[str, ...]
    coeff: sp.Expr
    rest: sp.Expr
    observable: sp.Expr | None
    kind: str = "average"
    times: int = 1
    layer: str | None = None
    wrt: str | None = None
    averages: tuple = ()
    same_time: tuple[str, ...] = ()


@dataclass(frozen=True)
class Average:
    """``symbol = <expr>``: a single-site average read by a constraint (e.g. a deep net's readout)."""

    symbol: sp.Symbol
    expr: sp.Expr
    pos: object = field(default=None, compare=False)


@dataclass(frozen=True)
class Source:
    """Jointly Gaussian ``targets`` with covariance ``cov`` (a syntax tree); ``process`` 'normal' (constant in
    time) or 'gp' (a Gaussian process over time).  ``depends_on``: order parameters in the covariance (empty:
    a constant covariance); ``layer_offset``: a deep source's covariance is that kernel at layer l + offset."""

    targets: tuple[tuple[str, tuple[str, ...]], ...]
    cov: ast.Expr
    process: str = "normal"
    depends_on: tuple[str, ...] = ()
    layer_offset: int | None = None


@dataclass(frozen=True)
class Field:
    """A field of the single-site process: ``name[indices](t) = expr`` (running sums appear as quantities)."""

    name: str
    indices: tuple[str, ...]
    expr: sp.Expr
    layer: str | None = None
    sum_pos: tuple = field(default=(), compare=False)   # ((causal Sum, its position in the spec), ...)


@dataclass(frozen=True)
class RunningSum:
    """``name(t) = eta * sum_{s<t} increment(s)``; scope 'sample' (per trajectory) or 'order'."""

    name: str
    indices: tuple[str, ...]
    increment: sp.Expr
    scope: str


@dataclass(frozen=True)
class Boundary:
    """A layered order parameter fixed at one layer, ``name[layer](t, s) = value`` (e.g. ``Phi[0] = 1``)."""

    name: str
    layer: str
    value: sp.Expr


@dataclass(frozen=True)
class ModelIR:
    """A lowered spec.  ``kind``: 'two_layer' (one hidden layer: neurons coupled only through the order
    parameters) or 'deep' (a layer axis; adjacent layers coupled through kernels and responses)."""

    model: object                              # the checked model (positions and source text for errors)
    kind: str
    params: tuple[str, ...]
    time: tuple[str, str, str]                 # (time variable, number of steps, step size) names
    axes: tuple[Axis, ...]
    activations: tuple[tuple[str, sp.Symbol, sp.Expr], ...]   # (name, argument, body)
    orders: tuple[OrderParameter, ...]
    sources: tuple[Source, ...]
    fields: tuple[Field, ...]
    sample_sums: tuple[RunningSum, ...] = ()
    order_sums: tuple[RunningSum, ...] = ()
    boundaries: tuple[Boundary, ...] = ()
    index_size: dict = field(default_factory=dict, compare=False)   # index symbol -> size parameter
    fresh: int = 0                             # fresh-index counter reached by lowering
    sum_pos: dict = field(default_factory=dict, compare=False)      # running sum -> its first integral's position

    def order(self, name: str) -> OrderParameter:
        return next(o for o in self.orders if o.name == name)
