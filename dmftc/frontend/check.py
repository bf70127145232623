"""Stage 2: semantic checks on the syntax tree, for either kind of spec.

A spec with a ``layers`` declaration (a deep network) is checked by :mod:`dmftc.frontend.check_deep` and gives a
:class:`dmftc.frontend.check_deep.DeepModel`; every other spec by :mod:`dmftc.frontend.check_two_layer`, which gives
a :class:`Model`.  Every problem is a located :class:`dmftc.errors.SpecError` with a hint.
"""
from __future__ import annotations

from dmftc.errors import StructureSpecError
from dmftc.frontend import ast
from dmftc.frontend.check_deep import check_deep
from dmftc.frontend.check_two_layer import Checker, Model

__all__ = ["check", "Model"]


def check(spec: ast.Spec):
    """Check a parsed spec; raise a located :class:`SpecError` on the first problem.

    Specs with a ``layers`` declaration (deep networks) are checked by :mod:`dmftc.frontend.check_deep` and give a
    :class:`dmftc.frontend.check_deep.DeepModel`; all others a :class:`Model`.
    """
    ones = {f.name for f in spec.fields if not f.indices and f.time2 is None}     # one-time coefficients' names
    bad = [i for i in spec.initials if i.name not in ones] if spec.layers else ()
    if bad:
        raise StructureSpecError("fields in recurrence form (with an initial value) are available in two-layer "
                                 "specs only", bad[0].pos, hint="write the deep field with causal sums",
                                 source=spec.source, filename=spec.filename)
    if spec.layers:
        return check_deep(spec)
    return Checker(spec).run()
