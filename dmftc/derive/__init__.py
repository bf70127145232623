"""Stage 4: symbolic derivation with SymPy (saddle-point and sensitivity equations, Hessian blocks), the
activation and its distributional derivatives, and the text `dmftc derive` prints.

:func:`derive` is the stage's one entry: it takes a checked model or its IR (:mod:`dmftc.ir`) of any kind and
gives a two-layer :class:`~dmftc.derive.two_layer.Derivation` or a deep
:class:`~dmftc.derive.deep.DeepDerivation`; :func:`dmftc.derive.report.format_derivation` prints either."""
from __future__ import annotations

__all__ = ["derive"]


def derive(model):
    """The derivation of a checked model (two-layer :class:`~dmftc.frontend.check.Model` or deep
    :class:`~dmftc.frontend.check_deep.DeepModel`) or of its :class:`~dmftc.ir.ModelIR`."""
    from dmftc.frontend.check_deep import DeepModel
    from dmftc.ir import ModelIR

    if isinstance(model, DeepModel) or (isinstance(model, ModelIR) and model.kind == "deep"):
        from dmftc.derive.deep import derive_deep
        return derive_deep(model)
    from dmftc.derive.two_layer import derive_two_layer
    return derive_two_layer(model)
