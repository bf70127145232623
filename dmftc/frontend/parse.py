"""Stage 1: parse .dmft text into the syntax tree of :mod:`dmftc.frontend.ast`.

Lark (LALR(1), contextual lexer, ``propagate_positions``) does the parsing; a
small post-lexer decides which newlines separate statements; a Transformer
builds frozen dataclasses.  Grammar errors become :class:`SyntaxSpecError` with
the location, the expected tokens in words, and a hint for known mistakes.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError

from dmftc.frontend import ast
from dmftc.errors import Pos, SpecError, SyntaxSpecError

GRAMMAR_PATH = Path(__file__).resolve().parents[2] / "grammars" / "dmft.lark"     # the repository's grammars/

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
    "$END": "end of file", "QUOTE": "\"'\"", "DIFF": "'d' (derivative)",
}


class _StatementPostLexer:
    """Drop newlines inside brackets, after operators and before continuation lines."""

    always_accept = ("_NL",)

    def process(self, stream):
        depth = 0
        prev = before = None
        diff_depths = []  # bracket depths of open E[d ... / d ...] response averages
        pending = None  # a newline waiting to see the next token
        for tok in stream:
            if tok.type == "NAME" and tok.value == "d" and prev is not None:
                # 'd' is the derivative sign right after 'E[' and after the '/' of such an average
                if prev.type == "LSQB" and before is not None and before.value == "E" and before.type != "NAME":
                    diff_depths.append(depth)
                    tok = Token.new_borrow_pos("DIFF", "d", tok)
                elif prev.type == "SLASH" and diff_depths and diff_depths[-1] == depth:
                    tok = Token.new_borrow_pos("DIFF", "d", tok)
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
                if diff_depths and diff_depths[-1] == depth:
                    diff_depths.pop()
                depth = max(0, depth - 1)
            before, prev = prev, tok
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
    if not str(tok).isdigit():
        raise SyntaxSpecError(f"expected an integer, found {str(tok)!r}", _pos(tok),
                              hint="the number of steps and index ranges must be integers, "
                                   "e.g. 'T = 100 steps of eta = 0.02'")
    return int(str(tok))


def _idx(children) -> tuple[str, ...]:
    return tuple(str(c) for c in children)


def _shifted(children, op) -> str:
    """Text of a shifted layer index, 'l-1' or 'L+1' (offsets are integers)."""
    name, num = children
    _integer(num)
    return f"{name}{op}{int(str(num))}"


@v_args(meta=True)
class _Build(Transformer):
    # ---------------------------------------------------------- expressions
    def number(self, meta, c):
        value = float(c[0])
        if not math.isfinite(value):
            raise SyntaxSpecError(f"the number {str(c[0])!r} is too large", _pos(meta),
                                  hint="numbers must be finite double-precision values (below about 1.8e308)")
        return ast.Num(_pos(meta), value)

    def name(self, meta, c):
        return ast.Name(_pos(meta), str(c[0]))

    def idx(self, meta, c):
        return _idx(c)

    def idx_plus(self, meta, c):
        return _shifted(c, "+")

    def idx_minus(self, meta, c):
        return _shifted(c, "-")

    def time_sum(self, meta, c):
        return ast.TimeSum(_pos(meta), str(c[0]), str(c[1]), str(c[2]), c[3])

    def layer_sum(self, meta, c):
        return ast.LayerSum(_pos(meta), str(c[0]), str(c[1]), str(c[2]), c[3])

    def response(self, meta, c):
        atoms = [x for x in c if not isinstance(x, Token)]
        return ast.Response(_pos(meta), atoms[0], atoms[1])

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
        indices = next((x for x in c if isinstance(x, tuple)), ())
        names = [str(x) for x in c if not isinstance(x, tuple)]
        return ast.Hat(_pos(meta), names[0], indices, names[1], names[2] if len(names) > 2 else None)

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
        indices = c[1] if len(c) > 1 and isinstance(c[1], tuple) else ()
        times = [str(x) for x in c[1 + bool(indices):]]
        return ast.OrderDecl(_pos(meta), str(c[0]), indices, times[0], times[1] if len(times) > 1 else None)

    def layers(self, meta, c):
        desc = str(c[3])[1:-1] if len(c) > 3 else ""
        return ast.LayersDecl(_pos(meta), str(c[0]), _integer(c[1]), str(c[2]), desc)

    def order(self, meta, c):
        return list(c)

    def source_target(self, meta, c):
        return ast.SourceTarget(_pos(meta), str(c[0]), c[1] if len(c) == 2 else ())

    def source(self, meta, c):
        return ast.SourceDecl(_pos(meta), tuple(c[:-2]), c[-2], c[-1])

    def gp_source(self, meta, c):
        return ast.SourceDecl(_pos(meta), tuple(c[:-2]), c[-2], c[-1], "gp")

    def field(self, meta, c):
        has_idx = isinstance(c[1], tuple)
        indices = c[1] if has_idx else ()
        times = [str(x) for x in c[1 + has_idx:-1]]
        return ast.FieldDecl(_pos(meta), str(c[0]), indices, times[0], c[-1], times[1] if len(times) > 1 else None)

    def initial(self, meta, c):
        return ast.InitialDecl(_pos(meta), str(c[0]), _integer(c[1]), c[-1])

    def initial_neg(self, meta, c):
        return ast.InitialDecl(_pos(meta), str(c[0]), -_integer(c[1]), c[-1])

    def process(self, meta, c):
        return ("process", _pos(meta), c[0])

    def action(self, meta, c):
        return ast.ActionDecl(_pos(meta), c[0])

    def start(self, meta, c):
        return list(c)


@functools.lru_cache(maxsize=1)
def _keywords() -> dict[str, str]:
    """Terminal name -> its literal text, for the fixed-string tokens ('E', 'hat', '..', ...)."""
    return {t.name: t.pattern.value for t in _parser().terminals if t.pattern.type == "str"}


def _word(name: str) -> str:
    if name in _TOKEN_WORDS:
        return _TOKEN_WORDS[name]
    lit = _keywords().get(name)
    return f"'{lit}'" if lit is not None else name


def _expected_words(expected) -> str:
    words = sorted({_word(e) for e in expected})
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def _tokens_before(source: str, line: int, col: int) -> list[Token]:
    """The tokens (as the parser sees them, after the post-lexer) that start before ``line:col``."""
    toks = []
    try:
        for tok in _parser().lex(source):
            if (tok.line, tok.column) >= (line, col):
                break
            toks.append(tok)
    except UnexpectedInput:
        pass
    return toks


def _open_brackets(toks: list[Token]) -> list[Token]:
    stack = []
    for t in toks:
        if t.type in ("LPAR", "LSQB"):
            stack.append(t)
        elif t.type in ("RPAR", "RSQB") and stack:
            stack.pop()
    return stack


_CLOSER = {"LPAR": "RPAR", "LSQB": "RSQB"}


def _opened_at(tok: Token) -> str:
    return f"the '{tok}' at line {tok.line}, column {tok.column} is not closed"


def _hint_for(err: UnexpectedInput, source: str, toks: list[Token]) -> str | None:
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
    expected = err.expected or set()
    if tok.type == "_NL" or tok.type == "$END":
        return "the statement ends too early: is a bracket or an operand missing?"
    if "MODEL" in expected:
        return "a spec starts with a line 'model <name>'"
    if toks and toks[-1].type == "_NL" and "ACTION" in expected:
        return (f"'{tok}' cannot start a statement; to continue the expression of the previous line, "
                "start this line with an operator such as '+'")
    if tok.type in _keywords() and tok.value.isidentifier() and "NAME" in expected:
        return f"'{tok}' is a keyword and cannot be used as a name"
    if tok.type == "LPAR" and "EQUAL" in expected:
        return "only field equations have a time argument; parameters are declared as 'param name = value'"
    if tok.type == "QUOTE":
        return "strings use double quotes; a prime is only allowed right after an activation name, as in phi'(h)"
    if tok.type == "STRING":
        return "a quoted description is only allowed at the end of 'model' and 'param' lines"
    if tok.type == "NAME" and "_NL" in expected:
        if "COMMA" in expected:
            return "separate list items with ',' and statements with a newline or ';'"
        return "separate statements with a newline or ';'"
    return None


def _statement_start(toks: list[Token]) -> Token | None:
    """If ``toks`` ends with ``name[idx](var)`` (a field equation read as part of an expression), the token to
    report: the name, or the operator ending the previous line that made it a continuation."""
    i = len(toks) - 1
    types = [t.type for t in toks]
    if i < 3 or types[i] != "RPAR" or types[i - 1] != "NAME" or types[i - 2] != "LPAR":
        return None
    i -= 3
    if types[i] == "RSQB":
        while i >= 0 and types[i] != "LSQB":
            if types[i] not in ("RSQB", "NAME", "COMMA"):
                return None
            i -= 1
        i -= 1
    if i < 1 or types[i] != "NAME" or types[i - 1] in ("_NL", "COLON"):
        return None
    return toks[i - 1] if types[i - 1] in _CONTINUE_AFTER and toks[i - 1].end_line < toks[i].line else toks[i]


def _convert(err: UnexpectedInput, source: str, filename: str) -> SyntaxSpecError:
    line, col = getattr(err, "line", None), getattr(err, "column", None)
    tok = getattr(err, "token", None)
    at_eof = isinstance(err, UnexpectedEOF) or line in (None, -1) or (isinstance(tok, Token) and tok.type == "$END")
    toks = _tokens_before(source, *((line, col) if not at_eof else (len(source) + 2, 0)))
    real = [t for t in toks if t.type != "_NL"]
    if at_eof:
        if real:
            line, col = real[-1].end_line, real[-1].end_column
        else:
            lines = source.rstrip("\n").splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
        msg = "unexpected end of file"
        expected = getattr(err, "expected", None)
        if expected:
            msg += f"; expected {_expected_words(expected)}"
        opened = _open_brackets(toks)
        hint = (_opened_at(opened[-1]) + "; the spec ends in the middle of a statement" if opened
                else "a spec starts with a line 'model <name>'" if not real
                else "the spec ends in the middle of a statement")
        return SyntaxSpecError(msg, Pos(line, col), hint=hint, source=source, filename=filename)
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else "?"
        msg = f"unexpected character {ch!r}"
    else:
        shown = "end of statement" if tok.type == "_NL" else repr(str(tok))
        msg = f"unexpected {shown}"
        if err.expected:
            msg += f"; expected {_expected_words(err.expected)}"
        opened = _open_brackets(toks)
        prev = real[-1] if real else None
        if tok.type == "_NL" and prev is not None:  # report right after the last token, not after a comment
            line, col = prev.end_line, prev.end_column
        closer = _CLOSER[opened[-1].type] if opened else None
        if closer in err.expected and prev is not None and prev.end_line < tok.line:
            # inside brackets newlines do not end statements: the missing bracket belongs at the end of the line
            return SyntaxSpecError(f"expected {_word(closer)} before the end of the line; {_opened_at(opened[-1])}",
                                   Pos(prev.end_line, prev.end_column), source=source, filename=filename,
                                   hint="inside brackets a newline does not end the statement, so the next "
                                        f"line was read as part of this one (it starts with '{tok}')")
        start = _statement_start(real) if tok.type == "EQUAL" else None
        if start is not None and start.type != "NAME":
            return SyntaxSpecError(f"'{start}' at the end of the line has no right operand", _pos(start),
                                   source=source, filename=filename,
                                   hint="a line that ends with an operator continues on the next line; "
                                        "remove the operator or complete the expression")
        if start is not None:
            return SyntaxSpecError(f"expected a newline or ';' before '{start}'", _pos(start), source=source,
                                   filename=filename,
                                   hint=f"'{start}' starts a new equation; separate statements with a newline or ';'")
    end_col = None
    if isinstance(tok, Token) and tok.type != "_NL" and tok.end_column:
        end_col = tok.end_column
    return SyntaxSpecError(msg, Pos(line, col, line, end_col), hint=_hint_for(err, source, toks),
                           source=source, filename=filename)


# Deepest expression nesting accepted (levels of the parse tree; the shipped specs use 16).  Later stages
# (the checker, SymPy, the printer) recurse over expressions, so deeper input would exhaust the stack.
MAX_DEPTH = 100


def _check_depth(tree, source: str, filename: str) -> None:
    stack = [(tree, 0, None)]
    while stack:
        node, depth, meta = stack.pop()
        if not getattr(node.meta, "empty", True):
            meta = node.meta
        if depth > MAX_DEPTH:
            raise SyntaxSpecError(f"expression nested too deeply (more than {MAX_DEPTH} levels)",
                                  _pos(meta) if meta is not None else Pos(1, 1), source=source, filename=filename,
                                  hint="split it into several fields, terms or parameters")
        stack.extend((c, depth + 1, meta) for c in node.children if isinstance(c, Tree))


def parse(source: str, filename: str = "<spec>") -> ast.Spec:
    """Parse spec text; raise :class:`SyntaxSpecError` (with location) on bad input."""
    try:
        tree = _parser().parse(source)
        _check_depth(tree, source, filename)
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
    params, indices, acts, orders, sources, fields, actions, layers = [], [], [], [], [], [], [], []
    initials = []
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
        elif isinstance(it, ast.LayersDecl):
            layers.append(it)
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
            _process_list(it[2], sources, fields, initials).append(it[2])
        elif isinstance(it, (ast.SourceDecl, ast.FieldDecl, ast.InitialDecl)):
            if process_pos is None:
                raise SyntaxSpecError("sources and fields belong in the 'process:' section", it.pos,
                                      hint="start the single-site process with a line 'process:'",
                                      source=source, filename=filename)
            _process_list(it, sources, fields, initials).append(it)
        elif isinstance(it, ast.ActionDecl):
            actions.append(it)
    return ast.Spec(filename, source, model, tuple(params), time, tuple(indices), tuple(acts),
                    tuple(orders), tuple(sources), tuple(fields), tuple(actions), process_pos, tuple(layers),
                    tuple(initials))


def _process_list(it, sources, fields, initials):
    """The list a statement of the process section belongs to."""
    return sources if isinstance(it, ast.SourceDecl) else initials if isinstance(it, ast.InitialDecl) else fields


def parse_file(path: str | Path) -> ast.Spec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(f"cannot read spec: {err.strerror}", None, filename=str(path)) from None
    return parse(text, str(path))
