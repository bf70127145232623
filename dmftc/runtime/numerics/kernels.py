"""Array helpers called by generated modules (see :mod:`dmftc.codegen.lower` for the layout).

All helpers are pure ``jax.numpy`` functions of arrays and static Python
integers, so generated code stays jit/vmap-able and device-agnostic.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def place(x, axes: tuple[int, ...], rank: int):
    """Put the dimensions of ``x`` (e.g. a (P, P) parameter) on ``axes`` of a rank-``rank`` array."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        return x
    y = jnp.reshape(x, x.shape + (1,) * (rank - x.ndim))
    return jnp.moveaxis(y, tuple(range(x.ndim)), axes)


def relabel(x, src: tuple[int, ...], dst: tuple[int, ...]):
    """Move the data axes ``src`` of a uniform-rank array to ``dst`` (other index axes are size 1)."""
    rank = x.ndim
    perm = [None] * rank
    perm[0], perm[-1] = 0, rank - 1
    for s, d in zip(src, dst):
        perm[d] = s
    spare = [a for a in range(1, rank - 1) if a not in src]
    for d in range(1, rank - 1):
        if perm[d] is None:
            perm[d] = spare.pop(0)
    return jnp.transpose(x, perm)


def path_dot(w, x, y):
    """sum_i w_i x_i y_i of two uniform-layout arrays over their leading path axis, as one contraction (a
    matrix product where the two carry different index axes) instead of a reduction of their broadcast product:
    (1, index axes, last) with the axes either carries.  Size-1 axes of both stay size 1."""
    x, y = jnp.asarray(x), jnp.asarray(y)
    rank = max(x.ndim, y.ndim)
    x = jnp.reshape(x, x.shape + (1,) * (rank - x.ndim)) if x.ndim < rank else x
    y = jnp.reshape(y, y.shape + (1,) * (rank - y.ndim)) if y.ndim < rank else y
    S = max(x.shape[0], y.shape[0])
    x, y = jnp.broadcast_to(x, (S,) + x.shape[1:]), jnp.broadcast_to(y, (S,) + y.shape[1:])
    letters = "abcdefghijklmnopqrstuvwxyz"
    keep_x = [k for k in range(1, rank) if x.shape[k] > 1]
    keep_y = [k for k in range(1, rank) if y.shape[k] > 1]
    both = sorted(set(keep_x) | set(keep_y))
    sub = lambda keep: "z" + "".join(letters[k] for k in keep)          # noqa: E731
    xs = jnp.reshape(x, (S,) + tuple(x.shape[k] for k in keep_x))
    ys = jnp.reshape(y, (S,) + tuple(y.shape[k] for k in keep_y))
    out = jnp.einsum(f"z,{sub(keep_x)},{sub(keep_y)}->{''.join(letters[k] for k in both)}", w, xs, ys)
    shape = tuple(max(x.shape[k], y.shape[k]) for k in range(1, rank))
    return jnp.reshape(out, (1,) + shape)


def kron(a: int, b: int, n: int, rank: int):
    """Kronecker delta between index axes ``a`` and ``b`` of size ``n``."""
    return place(jnp.eye(n), (a, b), rank)


def heaviside(x):
    return jnp.where(x > 0, 1.0, 0.0)


def _kinked(value, slope, name: str, doc: str):
    """``name``(x, width) = value(x), a ``jax.custom_jvp`` whose derivative is slope(x, width) dx: a kink's
    derivative with its delta functions mollified to width ``width`` (:func:`dirac`)."""
    fn = jax.custom_jvp(lambda x, width: value(x))

    @fn.defjvp
    def _jvp(primals, tangents):
        x, width = primals
        return fn(x, width), slope(x, width) * tangents[0]

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


step = _kinked(heaviside, lambda x, width: dirac(x, width), "step", """Heaviside(x) whose derivative is the
    mollified delta function ``dirac(x, width)`` (0 at width 0): what a two-layer spec's single-site program prints
    for Heaviside, so that autodiff of its march differentiates a kink as the two-layer engine's symbolic tangents
    do (dmftc.runtime.engines.site_engine).""")

kabs = _kinked(jnp.abs, lambda x, width: ksign(x, width), "kabs", """|x| whose derivative is :func:`ksign` (and
    its second 2 ``dirac(x, width)``): what a deep spec's single-site program prints for abs, so that its
    derivatives are the distributions of the symbolic derivation with the delta functions mollified (``width`` 0:
    pathwise, the delta functions dropped).""")

ksign = _kinked(jnp.sign, lambda x, width: 2.0 * dirac(x, width), "ksign",
                """sign(x) whose derivative is 2 ``dirac(x, width)`` (see :func:`kabs`).""")


@jax.custom_jvp
def kmax(a, b, width):
    """max(a, b) whose derivative is step(a - b) da + step(b - a) db with :func:`step` (see :func:`kabs`)."""
    return jnp.maximum(a, b)


@kmax.defjvp
def _kmax_jvp(primals, tangents):
    a, b, width = primals
    da, db, _ = tangents
    up = step(a - b, width)
    return kmax(a, b, width), up * da + (1.0 - up) * db


def kmin(a, b, width):
    """min(a, b) = -max(-a, -b), with the derivatives of :func:`kmax`."""
    return -kmax(-a, -b, width)


def dirac(x, width, order: int = 0):
    """DiracDelta(x) from the derivative of a non-smooth activation (e.g. phi'' of a ReLU).

    Pathwise sensitivities cannot sample a delta function; it is replaced by a
    Gaussian of standard deviation ``width`` (a mollifier whose bias is O(width^2)
    in smooth averages).  ``width = 0`` drops the term, which biases D in the rich
    regime.  The width is a solve option (``dirac_width``) recorded in the results.
    ``order`` > 0: the order-th derivative of that Gaussian, (-1)^k He_k(x / w) / w^k times it (for higher
    derivatives of a non-smooth activation, see :mod:`dmftc.derive.activation`).
    """
    safe = jnp.where(width > 0, width, 1.0)
    u = x / safe
    bump = jnp.exp(-0.5 * u ** 2) / (safe * jnp.sqrt(2.0 * jnp.pi))
    he0, he1 = jnp.ones_like(u), u                 # probabilists' Hermite polynomials He_k(u)
    for k in range(1, order):
        he0, he1 = he1, u * he1 - k * he0
    he = he0 if order == 0 else he1
    return jnp.where(width > 0, (-1) ** order * he * bump / safe ** order, 0.0)


def onehot(t, n: int, rank: int):
    """The indicator [s == t] on the trailing source-time axis."""
    return jnp.reshape(jnp.arange(n) == t, (1,) * (rank - 1) + (n,)).astype(jnp.float64)


def canonical(x, axes: tuple[int, ...], keep_batch: bool = True, keep_s: bool = False):
    """Extract the data of a uniform-rank array as (batch?, *index dims in ``axes`` order, s?)."""
    x = np.asarray(x)
    lead = [0] if keep_batch else []
    tail = [x.ndim - 1] if keep_s else []
    order = lead + list(axes) + tail
    rest = [a for a in range(x.ndim) if a not in order]
    y = np.transpose(x, order + rest)
    return y.reshape(y.shape[: len(order)])


def covariance(c, n: int):
    """Covariance of an indexed source: a scalar means c * identity(n)."""
    c = np.asarray(c, dtype=float)
    return c * np.eye(n) if c.ndim == 0 else c
