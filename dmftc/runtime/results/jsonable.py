"""JSON-safe values: numpy arrays and scalars as lists and Python numbers (results files, netCDF attributes)."""
from __future__ import annotations

import numpy as np

__all__ = ["jsonable"]


def jsonable(v):
    """``v`` with numpy arrays and scalars as lists and Python numbers (for JSON)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.bool_):
        return bool(v)
    return v
