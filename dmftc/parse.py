"""Stage 1: parse .dmft text into the syntax tree of :mod:`dmftc.ast`.

Lark (LALR(1), contextual lexer, ``propagate_positions``) does the parsing; a
small post-lexer decides which newlines separate statements; a Transformer
builds frozen dataclasses.  Grammar errors become :class:`SyntaxSpecError` with
the location, the expected tokens in words, and a hint for known mistakes.
"""
from __future__ import annotations

import functools
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from . import ast
from .errors import Pos, SpecError, SyntaxSpecError

GRAMMAR_PATH = Path(__file__).resolve().parent.parent / "grammars" / "dmft.lark"

# Tokens after which a newline never ends a statement, and tokens before which
# a newline is a line continuation.
_CONTINUE_AFTER = {"PLUS", "MINUS", "STAR", "SLASH", "CIRCUMFLEX", "EQUAL", "TILDE", "COMMA", "COLON",
                   "LPAR", "LSQB"}
_CONTINUE_BEFORE = {"PLUS", "MINUS", "STAR", "SLASH", "CIRCUMFLEX", "RPAR", "RSQB"}

_TOKEN_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a quoted description",
    "_NL": "end of statement", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "EQUAL": "'='", "COLON": "':'", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'",
    "SLASH": "'/'", "CIRCUMFLEX": "'^'", "TILDE": "'~'", "CMP": "a comparison such as '<'",
    "$END": "end of file", "QUOTE": "\"'\"",
}


class _StatementPostLexer:
    """Drop newlines inside brackets, after operators and before continuation lines."""

    always_accept = ("_NL",)

    def process(self, stream):
        depth = 0
        prev = None
        pending = None  # a newline waiting to see the next token
        for tok in stream:
            if tok.type == "_NL":
                if depth == 0 and prev is not None and prev.type not in _CONTINUE_AFTER:
                    pending = pending or tok
                continue
            if pending is not None:
                if tok.type not in _CONTINUE_BEFORE:
                    yield pending
                pending = None
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RSQB"):
                depth = max(0, depth - 1)
            prev = tok
            yield tok
        # a trailing newline is optional; drop it


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR_PATH.read_text(), parser="lalr", lexer="basic",
                postlex=_StatementPostLexer(), propagate_positions=True, maybe_placeholders=False)


def _pos(meta_or_token) -> Pos:
    m = meta_or_token
    return Pos(m.line, m.column, getattr(m, "end_line", None), getattr(m, "end_column", None))


def _integer(tok: Token) -> int:
    value = float(tok)
    if value != int(value) or "." in str(tok) or "e" in str(tok).lower():
        raise SyntaxSpecError(f"expected an integer, found {str(tok)!r}", _pos(tok),
                              hint="the number of steps and index ranges must be integers, "
                                   "e.g. 'T = 100 steps of eta = 0.02'")
    return int(value)


def _idx(children) -> tuple[str, ...]:
    return tuple(str(c) for c in children)


@v_args(meta=True)
class _Build(Transformer):
    # ---------------------------------------------------------- expressions
    def number(self, meta, c):
        return ast.Num(_pos(meta), float(c[0]))

    def name(self, meta, c):
        return ast.Name(_pos(meta), str(c[0]))

    def idx(self, meta, c):
        return _idx(c)

    def indexed(self, meta, c):
        return ast.Indexed(_pos(meta), str(c[0]), c[1])

    def arguments(self, meta, c):
        return tuple(c)

    def call(self, meta, c):
        indices = c[1] if len(c) == 3 else ()
        return ast.Call(_pos(meta), str(c[0]), indices, c[-1])

    def prime_call(self, meta, c):
        return ast.PrimeCall(_pos(meta), str(c[0]), c[-1])

    def hat(self, meta, c):
        indices = c[1] if len(c) == 3 else ()
        return ast.Hat(_pos(meta), str(c[0]), indices, str(c[-1]))

    def _bin(op):  # noqa: N805 - helper factory
        def f(self, meta, c):
            return ast.BinOp(_pos(meta), op, c[0], c[1])
        return f

    add, sub, mul, div, pow = _bin("+"), _bin("-"), _bin("*"), _bin("/"), _bin("^")

    def neg(self, meta, c):
        return ast.Neg(_pos(meta), c[0])

    def integral(self, meta, c):
        if len(c) == 2:
            return ast.Integral(_pos(meta), c[0], str(c[1]), None, None)
        return ast.Integral(_pos(meta), c[0], str(c[1]), str(c[2]), str(c[3]))

    def index_sum(self, meta, c):
        return ast.IndexSum(_pos(meta), tuple(str(x) for x in c[:-1]), c[-1])

    def expectation(self, meta, c):
        return ast.Expectation(_pos(meta), c[0], False)

    def log_expectation(self, meta, c):
        return ast.Expectation(_pos(meta), c[0], True)

    def log_call(self, meta, c):
        return ast.Call(_pos(meta), "log", (), c[0])

    def matrix(self, meta, c):
        return ast.Matrix(_pos(meta), c[0])

    # ---------------------------------------------------------- statements
    def model(self, meta, c):
        desc = str(c[1])[1:-1] if len(c) > 1 else ""
        return ast.ModelDecl(_pos(meta), str(c[0]), desc)

    def dims(self, meta, c):
        return _idx(c)

    def param(self, meta, c):
        name = str(c[0])
        rest = list(c[1:])
        dims = rest.pop(0) if rest and isinstance(rest[0], tuple) else ()
        default = rest.pop(0)
        desc = str(rest[0])[1:-1] if rest else ""
        return ast.ParamDecl(_pos(meta), name, dims, default, desc)

    def time(self, meta, c):
        return ast.TimeDecl(_pos(meta), str(c[0]), str(c[1]), _integer(c[2]), str(c[3]), c[4])

    def index(self, meta, c):
        names = tuple(str(x) for x in c[:-2])
        return ast.IndexDecl(_pos(meta), names, _integer(c[-2]), str(c[-1]))

    def activation(self, meta, c):
        return ast.ActivationDecl(_pos(meta), str(c[0]), str(c[1]), c[2])

    def order_decl(self, meta, c):
        indices = c[1] if len(c) == 3 else ()
        return ast.OrderDecl(_pos(meta), str(c[0]), indices, str(c[-1]))

    def order(self, meta, c):
        return list(c)

    def source_target(self, meta, c):
        return ast.SourceTarget(_pos(meta), str(c[0]), c[1] if len(c) == 2 else ())

    def source(self, meta, c):
        return ast.SourceDecl(_pos(meta), tuple(c[:-2]), c[-2], c[-1])

    def field(self, meta, c):
        indices = c[1] if len(c) == 4 else ()
        return ast.FieldDecl(_pos(meta), str(c[0]), indices, str(c[-2]), c[-1])

    def process(self, meta, c):
        return ("process", _pos(meta), c[0])

    def action(self, meta, c):
        return ast.ActionDecl(_pos(meta), c[0])

    def start(self, meta, c):
        return list(c)


def _expected_words(expected) -> str:
    words = sorted({_TOKEN_WORDS.get(e, f"'{e.lower()}'" if e.isupper() else e) for e in expected})
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def _hint_for(err: UnexpectedInput, source: str) -> str | None:
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else ""
        if ch == "'":
            return "strings use double quotes; a prime is only allowed right after an activation name, as in phi'(h)"
        if ch in "{}":
            return "use '(' and ')' to group expressions and '[' ']' for indices and matrices"
        if ch == "=":
            return "comparisons other than <, <=, >, >= are not part of the language"
        return None
    tok = getattr(err, "token", None)
    if tok is None:
        return None
    if tok.type == "_NL" or tok.type == "$END":
        return "the statement ends too early: is a bracket or an operand missing?"
    if tok.type == "LPAR" and "EQUAL" in err.expected:
        return "only field equations have a time argument; parameters are declared as 'param name = value'"
    if tok.type == "NAME" and "_NL" in err.expected:
        return "separate statements with a newline or ';'"
    return None


def _convert(err: UnexpectedInput, source: str, filename: str) -> SyntaxSpecError:
    line, col = getattr(err, "line", None), getattr(err, "column", None)
    if isinstance(err, UnexpectedEOF) or line in (None, -1):
        lines = source.rstrip("\n").splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        msg = "unexpected end of file"
        expected = getattr(err, "expected", None)
        if expected:
            msg += f"; expected {_expected_words(expected)}"
        return SyntaxSpecError(msg, Pos(line, col), hint="the spec ends in the middle of a statement",
                               source=source, filename=filename)
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else "?"
        msg = f"unexpected character {ch!r}"
    else:
        tok = err.token
        shown = "end of statement" if tok.type == "_NL" else ("end of file" if tok.type == "$END" else repr(str(tok)))
        msg = f"unexpected {shown}"
        if err.expected:
            msg += f"; expected {_expected_words(err.expected)}"
    end_col = None
    tok = getattr(err, "token", None)
    if isinstance(tok, Token) and tok.type not in ("_NL", "$END") and tok.end_column:
        end_col = tok.end_column
    return SyntaxSpecError(msg, Pos(line, col, line, end_col), hint=_hint_for(err, source),
                           source=source, filename=filename)


def parse(source: str, filename: str = "<spec>") -> ast.Spec:
    """Parse spec text; raise :class:`SyntaxSpecError` (with location) on bad input."""
    try:
        tree = _parser().parse(source)
        items = _Build().transform(tree)
    except UnexpectedInput as err:
        raise _convert(err, source, filename) from None
    except VisitError as err:
        if isinstance(err.orig_exc, SpecError):
            raise err.orig_exc.located(source, filename) from None
        raise SpecError(f"internal error while reading the spec: {err.orig_exc}", None,
                        source=source, filename=filename) from err
    return _assemble(items, source, filename)


def _assemble(items, source: str, filename: str) -> ast.Spec:
    model = items[0]
    params, indices, acts, orders, sources, fields, actions = [], [], [], [], [], [], []
    time = None
    process_pos = None
    for it in items[1:]:
        if isinstance(it, ast.ParamDecl):
            params.append(it)
        elif isinstance(it, ast.TimeDecl):
            if time is not None:
                raise SyntaxSpecError("a second time grid is declared", it.pos,
                                      hint="a model has one time axis; remove one 'time' line",
                                      source=source, filename=filename)
            time = it
        elif isinstance(it, ast.IndexDecl):
            indices.append(it)
        elif isinstance(it, ast.ActivationDecl):
            acts.append(it)
        elif isinstance(it, list):
            orders.extend(it)
        elif isinstance(it, tuple) and it[0] == "process":
            if process_pos is not None:
                raise SyntaxSpecError("a second 'process:' section", it[1],
                                      hint="put all sources and fields in one process section",
                                      source=source, filename=filename)
            process_pos = it[1]
            (sources if isinstance(it[2], ast.SourceDecl) else fields).append(it[2])
        elif isinstance(it, (ast.SourceDecl, ast.FieldDecl)):
            if process_pos is None:
                raise SyntaxSpecError("sources and fields belong in the 'process:' section", it.pos,
                                      hint="start the single-site process with a line 'process:'",
                                      source=source, filename=filename)
            (sources if isinstance(it, ast.SourceDecl) else fields).append(it)
        elif isinstance(it, ast.ActionDecl):
            actions.append(it)
    return ast.Spec(filename, source, model, tuple(params), time, tuple(indices), tuple(acts),
                    tuple(orders), tuple(sources), tuple(fields), tuple(actions), process_pos)


def parse_file(path: str | Path) -> ast.Spec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"cannot read spec: {err.strerror}", None, filename=str(path)) from None
    return parse(text, str(path))
