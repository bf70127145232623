"""The names of a spec: the DSL's built-in functions, the names a spec may not define, and what a name denotes
(:class:`Symbol`), shared by the checks of two-layer and deep specs (:mod:`dmftc.frontend.check_two_layer`,
:mod:`dmftc.frontend.check_deep`)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from dmftc.frontend.builtins import ARITY
from dmftc.errors import Pos, ShapeSpecError

BUILTIN_FUNCTIONS = dict(ARITY)      # the DSL's functions and their arities (one table: dmftc.frontend.builtins)
# Names that may be used as activations directly, e.g. ``phi'`` of a builtin.
DEFAULT_FUNCTIONS = {"eye": 1, "ones": 1, "zeros": 1, "sqrt": 1, "exp": 1, "log": 1}
RESERVED = set(BUILTIN_FUNCTIONS) | {"pi", "eye", "ones", "zeros"}
# the options of a solve (dmftc.runtime.problem.options.SolveOptions; tests/test_options.py keeps the two equal): solve(**kw)
# takes the options and the model parameters together, so a parameter of one of these names could never be set
SOLVE_OPTIONS = ("samples", "seed", "groups", "dirac_width", "backend", "sampler", "progress", "correction", "batch",
                 "propagator_samples", "propagator_groups", "propagator_feature_samples", "memory_limit", "devices")
DEEP_HINT = "deep-network specs declare a layer index first, e.g. 'layers l = 1..L'"
KIND_WORDS = {"param": "a parameter", "index": "an index", "activation": "an activation",
               "order": "an order parameter", "source": "a source", "field": "a field", "time": "the time variable",
               "layer": "the layer index", "family": "an order parameter", "response": "a response function",
               "coefficient": "a time coefficient"}


@dataclass(frozen=True)
class Symbol:
    """What a name in the spec denotes."""

    kind: str  # param | size | index | activation | order | source | field | time | builtin
    name: str
    indices: tuple[str, ...]
    pos: Pos | None


def check_function_call(err, e, rec):
    """An activation or built-in function call: no indices, its number of arguments; ``rec`` checks each."""
    if e.indices:
        raise err(ShapeSpecError, f"function '{e.name}' takes no indices", e.pos)
    want = BUILTIN_FUNCTIONS.get(e.name, 1)
    if len(e.args) != want:
        raise err(ShapeSpecError, f"'{e.name}' takes {want} argument(s), got {len(e.args)}", e.pos)
    for a in e.args:
        rec(a)


def kind_word(sym: Symbol) -> str:
    """'order parameter', 'field', ...: the kind of a symbol in words."""
    return KIND_WORDS[sym.kind].split(" ", 1)[1] if sym.kind in KIND_WORDS else sym.kind


def suggest(name: str, candidates) -> str | None:
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None
