"""Architecture rules of issue 12 that can be checked on the source: the runtime knows no activation by name
(every activation reaches it as code generated from a spec's expression, :mod:`dmftc.derive.activation`), only the
tests use the reference package, and no module of dmftc is much over 600 lines."""
import io
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dmftc"
ACTIVATION_WORDS = ("tanh", "relu", "erf", "sigmoid", "softplus", "softsign", "gelu", "elu", "swish", "sin")


def _code_words(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every name and string literal that is code, not a comment or a docstring."""
    words, prev = [], tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                                     tokenize.DEDENT, tokenize.COLON):
            pass                                                   # a docstring (a statement of its own)
        elif tok.type in (tokenize.NAME, tokenize.STRING):
            for w in tok.string.lower().replace("'", " ").replace('"', " ").replace("_", " ").split():
                words.append((tok.start[0], w.strip(".,()[]:=")))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type if tok.type != tokenize.OP or tok.string != ":" else tokenize.COLON
    return words


def test_runtime_names_no_activation():
    hits = [f"{p.relative_to(PKG)}:{line}: {w}" for p in sorted((PKG / "runtime").glob("*.py"))
            for line, w in _code_words(p) if w in ACTIVATION_WORDS]
    assert not hits, "activation names in runtime code:\n" + "\n".join(hits)


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text('"""tanh in a docstring is fine."""\n# relu in a comment too\nACT = "tanh"\ndef f(x):\n'
                   '    """erf here too."""\n    return jnp.erf(x)\n')
    assert [w for _, w in _code_words(bad) if w in ACTIVATION_WORDS] == ["tanh", "erf"]


def test_no_module_over_about_600_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 620}
    assert not long, long


def _imports_reference(path: Path) -> list[int]:
    """Lines of ``path`` that import from dmftc.reference (at module level or inside a function)."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        if any(n == "dmftc.reference" or n.startswith("dmftc.reference.") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_tests_use_the_reference_package(tmp_path):
    """The hand-written solvers of dmftc/reference are the tests' oracles: no other module of dmftc imports them
    (a hand-built DeepModel brings its own march, DeepModel.march)."""
    hits = [f"{p.relative_to(PKG)}:{line}" for p in sorted(PKG.rglob("*.py"))
            if "reference" not in p.relative_to(PKG).parts for line in _imports_reference(p)]
    assert not hits, "dmftc modules importing dmftc.reference:\n" + "\n".join(hits)
    bad = tmp_path / "m.py"                                  # the check can fail
    bad.write_text("import numpy\ndef f():\n    from dmftc.reference.structured_march import ModelKernels\n")
    assert _imports_reference(bad) == [3]
