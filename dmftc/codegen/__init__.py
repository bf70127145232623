"""Stages 4-5: array layout and the printers of the generated JAX modules.

:func:`emit` is the stage's one entry: the generated module's text for a derivation of any kind (a two-layer
module's metadata and constraint coefficients through its array layout, :mod:`dmftc.codegen.lower` and
:mod:`dmftc.codegen.two_layer`; a deep one's through :mod:`dmftc.codegen.deep`); every module ends with the
single-site program the runtime marches, :mod:`dmftc.codegen.site`."""
from __future__ import annotations

__all__ = ["emit"]


def emit(deriv, *, spec_path: str, spec_sha256: str) -> str:
    """The Python source of the generated module of ``deriv`` (:func:`dmftc.derive.derive`'s result)."""
    from dmftc.derive.two_layer import Derivation

    if isinstance(deriv, Derivation):
        from dmftc.codegen.lower import lower
        from dmftc.codegen.two_layer import emit as emit_two_layer
        return emit_two_layer(deriv, lower(deriv), spec_path=spec_path, spec_sha256=spec_sha256)
    from dmftc.codegen.deep import emit_deep
    return emit_deep(deriv, spec_path=spec_path, spec_sha256=spec_sha256)
