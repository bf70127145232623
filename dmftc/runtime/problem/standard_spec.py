"""The standard deep network of the Python API (:func:`dmftc.deep.solve_deep` without a spec) as a compiled spec.

The network is the one ``specs/deep_tanh.dmft`` writes down (L hidden layers, one training point, mean-field
parameterisation, gradient descent); for another activation its ``activation`` line is replaced, and its
``model`` line names the result ``standard_deep``.  That text is compiled like any spec (into a directory of
this process, removed at exit), so the API runs the same generated single-site program, the same march and the
same propagator as a user's spec: there is one definition of the network (the spec file) and one march
(:mod:`dmftc.runtime.march.site_march`).  Compiling takes about 2 s per activation (L = 2 tanh: 1.8 s); the module is
kept for the process, and also on disk beside JAX's compilation cache (:func:`dmftc.jax_setup.cache_dir`,
``standard-<key>/``), keyed by the spec text and by the compiler's own sources (``dmftc/frontend``, ``ir``,
``derive``, ``codegen``, ``build.py``, the grammar, and the versions of dmftc, SymPy and Lark), so that a
fresh process imports what an earlier one generated unless the spec or the compiler changed since.  ``DMFTC_JAX_CACHE=0`` turns that off as well.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dmftc.errors import ParameterError, SpecError

if TYPE_CHECKING:
    from dmftc.runtime.problem.deep_model import DeepModel

__all__ = ["STANDARD_SPEC", "standard_text", "standard_module", "standard_program", "standard",
           "as_model", "model_and_activation"]

STANDARD_SPEC = Path(__file__).resolve().parents[3] / "specs" / "deep_tanh.dmft"      # the repository's specs/
_ACTIVATION = re.compile(r"^activation phi\(h\) = .*$", re.M)
_MODEL = re.compile(r"^model \S+ \".*\"$", re.M)
_MODULES: dict = {}
_DIR: list = []


def standard_text(expression: str) -> str:
    """The spec text of the standard deep network with activation phi(h) = ``expression`` (DSL syntax)."""
    text = STANDARD_SPEC.read_text()
    if len(_ACTIVATION.findall(text)) != 1 or len(_MODEL.findall(text)) != 1:  # pragma: no cover - shipped spec
        raise RuntimeError(f"{STANDARD_SPEC} no longer has one 'model' and one 'activation phi(h) = ...' line")
    expression = " ".join(expression.split())
    text = _MODEL.sub(f'model standard_deep "standard deep network, L hidden layers, one training point, '
                      f'phi(h) = {expression}"'.replace("\\", "\\\\"), text)
    return _ACTIVATION.sub(f"activation phi(h) = {expression}".replace("\\", "\\\\"), text)


def dsl_expression(text: str) -> str:
    """An activation given to the Python API (an expression in h, Python or DSL syntax, or a shorthand) as the
    DSL writes it."""
    from dmftc.frontend.builtins import SHORTHANDS

    src = SHORTHANDS.get(text.strip(), text)
    return re.sub(r"\bx\b", "h", src.replace("**", "^"))


def standard_module(activation: str):
    """The generated module of the standard deep network with ``activation`` (a string as
    :func:`dmftc.runtime.problem.activation.as_activation` takes it), compiled once per process."""
    expression = dsl_expression(activation)
    if expression not in _MODULES:
        if not _DIR:
            _DIR.append(Path(tempfile.mkdtemp(prefix="dmftc-standard-")))
            atexit.register(shutil.rmtree, _DIR[0], True)
        name = "standard_deep_" + hashlib.sha256(expression.encode()).hexdigest()[:12]
        text = standard_text(expression)
        cached = _cached(name, text)
        if cached is not None and (cached / f"{name}.py").exists():
            from dmftc.build import import_generated

            _MODULES[expression] = import_generated(cached / f"{name}.py", cached / f"{name}.dmft")
            return _MODULES[expression]
        path = _DIR[0] / f"{name}.dmft"
        path.write_text(text)
        from dmftc.build import build_module

        try:
            _MODULES[expression] = build_module(path, _DIR[0] / "generated")
        except SpecError as err:
            raise ParameterError(f"the activation {activation!r} does not compile as phi(h) = {expression} of the "
                                 f"standard deep network ({STANDARD_SPEC.name}): {err}") from None
        if cached is not None:
            _store(cached, name, text, (_DIR[0] / "generated" / f"{name}.py").read_text())
    return _MODULES[expression]


_COMPILER_SOURCES = ("frontend", "ir", "derive", "codegen", "build.py")


@functools.cache
def _compiler_key() -> bytes:
    """What the generated text depends on besides the spec: the compiler's sources, the grammar and the versions
    of dmftc, SymPy (which prints the code) and Lark (computed once per process)."""
    import lark
    import sympy

    from dmftc.version import __version__

    digest = hashlib.sha256(f"{__version__} {sympy.__version__} {lark.__version__}".encode())
    package = Path(__file__).resolve().parents[2]                      # dmftc/
    files = [package.parent / "grammars" / "dmft.lark"]
    for part in _COMPILER_SOURCES:
        where = package / part
        files += sorted(where.rglob("*.py")) if where.is_dir() else [where]
    for f in files:
        digest.update(str(f.relative_to(package.parent)).encode() + b"\0" + f.read_bytes())
    return digest.digest()


def _cached(name: str, text: str) -> Path | None:
    """The cache folder of the module generated from spec ``text`` by this compiler (None: no cache)."""
    from dmftc.jax_setup import cache_dir

    root = cache_dir()
    if root is None:
        return None
    key = hashlib.sha256(_compiler_key() + text.encode()).hexdigest()[:24]
    return root.parent / f"standard-{key}"


def _store(folder: Path, name: str, text: str, code: str) -> None:
    """Keep the spec and its generated module in ``folder`` (atomic writes; a failure only skips the cache)."""
    from dmftc.build import atomic_write

    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(folder / f"{name}.dmft", text)
        atomic_write(folder / f"{name}.py", code)       # written last: its presence marks a complete entry
    except OSError:
        pass


def standard_program():
    """The generated module of the standard network as the spec file writes it: its single-site program, in which
    the activation enters through ``E.act`` only, is the program of every activation given without a spec
    (:func:`dmftc.runtime.sensitivities.site_local.local_map`)."""
    line = _ACTIVATION.search(STANDARD_SPEC.read_text()).group(0)
    return standard_module(line.split("=", 1)[1].strip())


def standard(activation: str, *, L, T, gamma, y, eta, width):
    """The standard network with ``activation`` as its compiled spec (:func:`standard_module`):
    (SpecKernels, parameter values, DeepModel, the spec's activation) for the march and the propagator."""
    from dmftc.runtime.problem.options import check_integer, check_number
    from dmftc.runtime.problem.spec_kernels import SpecKernels
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.problem.params import resolve_deep_params

    given = {"L": check_integer("L (number of hidden layers)", L, 1), "T": check_integer("T (number of steps)", T, 1),
             "gamma": check_number("gamma", gamma, low=0.0, strict=True), "y": check_number("y", y),
             "eta": check_number("eta", eta, low=0.0)}
    width = check_number("dirac_width", width, low=0.0)
    mod = standard_module(activation)
    p, _, _ = resolve_deep_params(mod, given)
    spec = SpecKernels(mod)

    label = f"phi(h) = {dsl_expression(activation)}"

    def site(w):                                   # the spec's activation, labelled by its expression
        return dataclasses.replace(spec.site_activation(p, w), label=label, rewidth=site)

    return spec, p, from_spec(mod, p), site(width)


def as_model(model=None, gamma=None, y=None, eta=None, *, L=None) -> DeepModel:
    """The model of an action: ``model`` when given, else the standard network with (gamma, y, eta) at depth L,
    read from its compiled spec (``specs/deep_tanh.dmft``, :func:`standard`; its activation
    does not enter the model); the network written out by hand is an oracle of the tests
    (:mod:`dmftc.reference.standard_model`)."""
    from dmftc.runtime.problem.deep_model import DeepModel

    if model is not None:
        if not isinstance(model, DeepModel):
            raise ParameterError(f"model must be a dmftc.runtime.problem.deep_model.DeepModel, got {type(model).__name__}")
        return model
    return _standard("linear", gamma, y, eta, L, 0.0)[0]


def model_and_activation(model, activation, gamma=None, y=None, eta=None, *, L=None, width: float = 0.1):
    """(model, site activation) as the march, the estimators and the propagator take them.  Without ``model`` and
    with ``activation`` given as text (an expression in h or a shorthand), the standard network of that activation
    compiled from its spec (:func:`standard`) with the spec's own activation, so that the runtime marches the
    spec's program; otherwise :func:`as_model` and the activation as given (a hand-built
    model brings its own march, ``DeepModel.march``)."""
    from dmftc.runtime.problem.activation import as_activation

    if model is not None or not isinstance(activation, str):
        return as_model(model, gamma, y, eta, L=L), as_activation(activation, width)
    as_activation(activation, width)                 # the API's own messages for a bad expression, before compiling
    return _standard(activation, gamma, y, eta, L, width)


def _standard(activation: str, gamma, y, eta, L, width):
    """(DeepModel, site activation) of the standard network compiled with ``activation``, cached per values."""
    import jax

    from dmftc.runtime.problem.options import check_integer, check_number

    if gamma is None or y is None or eta is None or L is None:
        raise ParameterError("give either model= or the standard network's gamma, y, eta and L")
    key = (activation, check_integer("L (number of hidden layers)", L, 1),
           check_number("gamma", gamma, low=0.0, strict=True), check_number("y", y),
           check_number("eta", eta, low=0.0), check_number("dirac_width", width, low=0.0))
    if key not in _STANDARD:                          # (checked before they key the cache)
        with jax.ensure_compile_time_eval():         # also when called inside a traced function
            _, _, model, site = standard(activation, L=key[1], T=1, gamma=key[2], y=key[3], eta=key[4],
                                         width=key[5])
        _STANDARD[key] = model, site
    return _STANDARD[key]


_STANDARD: dict = {}
