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
