"""Stage 3: the intermediate representation (:mod:`dmftc.ir.nodes`) that every checked spec lowers to."""
from __future__ import annotations

from dmftc.ir.nodes import Axis, Boundary, Field, ModelIR, OrderParameter, RunningSum, Source


def lower(model) -> ModelIR:
    """The IR of a checked model (two-layer :class:`~dmftc.frontend.check.Model` or deep
    :class:`~dmftc.frontend.check_deep.DeepModel`)."""
    from dmftc.frontend.check_deep import DeepModel

    if isinstance(model, DeepModel):
        from dmftc.ir.deep import lower_deep
        return lower_deep(model)
    from dmftc.ir.two_layer import lower_two_layer
    return lower_two_layer(model)


__all__ = ["lower", "ModelIR", "Axis", "Boundary", "Field", "OrderParameter", "RunningSum", "Source"]
