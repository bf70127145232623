"""Shapes of order parameters, tangents and their place in the flattened propagator."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Geometry:
    """Shapes of the order parameters and their place in the flattened propagator."""

    mod: object
    sz: dict

    def __post_init__(self):
        m = self.mod
        self.comp_shape = {n: tuple(self.sz[m.AXIS_SIZE[m.AXES[a - 1]]] for a in m.STORED_AXES[n]) for n, _ in m.ORDERS}
        self.offset, off = {}, 0
        for n, _ in m.ORDERS:
            self.offset[n] = off
            off += int(np.prod(self.comp_shape[n], dtype=int))
        self.m = off
        self.single_site = tuple(n for n, _ in m.ORDERS if n in m.SINGLE_SITE)

    def size(self, name):
        return int(np.prod(self.comp_shape[name], dtype=int))

    def shape(self, name, lead=1, s=1):
        m = self.mod
        axes = m.STORED_AXES[name]
        dims = [self.sz[m.AXIS_SIZE[a]] if (i + 1) in axes else 1 for i, a in enumerate(m.AXES)]
        return (lead, *dims, s)


def tangent_shape(mod, geo, name, driver, B, T):
    base = list(geo.shape(name, B, T))
    for a in mod.PRIMED_AXES[driver]:
        base[a] = geo.sz[mod.AXIS_SIZE[mod.AXES[a - 1]]]
    return tuple(base)


def source_factors(mod, p, sz) -> list:
    """Square-root factors L (L L^T = covariance) of each source group, PSD-safe (eigendecomposition)."""
    out = []
    for c in mod.source_covariances(p, sz):
        w, v = np.linalg.eigh(np.asarray(c, dtype=float))
        out.append(v * np.sqrt(np.clip(w, 0.0, None)))
    return out


def place_sources(mod, x_by_group):
    """Uniform-layout source arrays from per-group values x (leading axis: samples or points)."""
    import jax.numpy as jnp

    from dmftc.runtime import kernels as _k

    out = {}
    for group, x in zip(mod.SOURCES, x_by_group):
        lead = x.shape[0]
        if len(group) == 1 and group[0][1]:
            name = group[0][0]
            out[name] = _k.place(jnp.asarray(x), (0,) + mod.STORED_AXES[name], mod.RANK)
        else:
            for j, (name, _) in enumerate(group):
                out[name] = jnp.reshape(jnp.asarray(x[:, j]), (lead,) + (1,) * (mod.RANK - 1))
    return out
