"""The compiler driver: spec file -> generated module (:mod:`dmftc.build`), and loading it.

    parse (dmftc.frontend.parse)    text -> syntax tree with positions
    check (dmftc.frontend.check)    names, arity, causality -> Model (deep: DeepModel)
    lower (dmftc.ir)                the IR: order parameters and their defining averages or constraints,
                                    sources, causal fields, running sums, boundaries (SymPy)
    derive (dmftc.derive)           SymPy: kappa/D/U structure, tangents (deep: roles, couplings, readout)
    layout (dmftc.codegen.lower)    array layout for the kernels
    emit (dmftc.codegen)            Python/JAX source text

Generated files are written atomically (temporary file + rename) and carry the
spec's sha256 and the dmftc version, so a stale module is detected and rebuilt.
"""
from __future__ import annotations

from dmftc.build import (DEFAULT_OUT, REPO_ROOT, atomic_write, compile_spec, display_path, front_end,  # noqa: F401
                         front_end_ir, generate, import_generated, is_stale, output_path)
from dmftc.version import __version__


def load(spec_path, out_dir=None):
    """Compile ``spec_path`` if its generated module is missing or stale, import it, wrap it
    (:func:`dmftc.runtime.model.load_model`)."""
    from dmftc.runtime.model import load_model

    return load_model(spec_path, out_dir)


__all__ = ["compile_spec", "load", "import_generated", "generate", "is_stale", "__version__"]
