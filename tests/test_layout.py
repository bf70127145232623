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
    hits = [f"{p.relative_to(PKG)}:{line}: {w}" for p in sorted((PKG / "runtime").rglob("*.py"))
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


# --- the import graph: no cycles, no private names across modules -------------------------------------------------
# Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING`` (simplest, and a
# TYPE_CHECKING import that closes a cycle is a layering smell even if it does not run).  Importing ``p.q.m`` also
# runs the __init__ of ``p`` and ``p.q``: the graph has an edge to such a package only when its __init__ imports a
# module of the package while it runs (at module level, not inside a function or under TYPE_CHECKING: those run only
# when a caller uses the __init__'s names, which is an explicit import of the package, an edge of its own), and never
# to a package that contains the importing module (that __init__ ran before the importer did).
# ``from p import name`` where ``name`` is not a submodule is an edge to ``p``.

import ast as _ast  # noqa: E402
import functools  # noqa: E402

# Edges allowed to close a cycle, each with its reason (none today); test_known_exceptions_are_still_needed
# fails once one is gone, so the list only shrinks.
KNOWN_EDGES: set[tuple[str, str]] = set()
# Private names allowed across modules, with their reason (none today).
KNOWN_PRIVATE: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=None)
def _parsed(path: str, stamp: tuple) -> _ast.Module:
    return _ast.parse(Path(path).read_text())


def _tree(path: Path) -> _ast.Module:
    """The file's syntax tree, parsed once per version of the file."""
    st = path.stat()
    return _parsed(str(path), (st.st_mtime_ns, st.st_size))


def _modules(root: Path) -> dict[str, Path]:
    """Module name -> file for every .py under the package directory ``root`` (its name is the top package)."""
    mods = {}
    for p in sorted(root.rglob("*.py")):
        parts = (root.name,) + p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _resolve(mod: str, is_pkg: bool, node: _ast.ImportFrom) -> str:
    """The absolute module named by a (possibly relative) ``from ... import``."""
    if not node.level:
        return node.module or ""
    base = mod.split(".")
    base = base[:len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _import_nodes(path: Path):
    """(line, imported module, [(name, alias)] or None for ``import m``) of every import in the file."""
    for node in _ast.walk(_tree(path)):
        if isinstance(node, _ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None, a.asname
        elif isinstance(node, _ast.ImportFrom):
            yield node.lineno, node, [(a.name, a.asname) for a in node.names], None


def _runs_imports(path: Path, top: str) -> bool:
    """Whether running the file imports a module of the package ``top`` (imports in functions and under
    ``if TYPE_CHECKING`` do not run)."""
    todo = list(_tree(path).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.Lambda)):
            continue
        if isinstance(node, _ast.If) and "TYPE_CHECKING" in _ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, _ast.Import) and any(a.name.split(".")[0] == top for a in node.names):
            return True
        if isinstance(node, _ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == top):
            return True
        todo.extend(_ast.iter_child_nodes(node))
    return False


def _raw_imports(mods: dict[str, Path]) -> dict[str, list[tuple[str, int, bool]]]:
    """Module -> [(target module, line, explicit)] for imports of modules of the package, resolved."""
    top = next(iter(mods)).split(".")[0]
    out = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        edges = []
        for line, what, names, _ in _import_nodes(path):
            if names is None:                                       # import a.b.c
                targets = [what]
            else:
                base = _resolve(mod, is_pkg, what)
                targets = [f"{base}.{n}" if f"{base}.{n}" in mods else base for n, _ in names]
            for t in targets:
                if t == top or t.startswith(top + "."):
                    while t not in mods and "." in t:                  # import of a name below a module
                        t = t.rsplit(".", 1)[0]
                    edges.append((t, line, True))
        out[mod] = edges
    return out


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {imported module: line of the first import making the edge}, package __init__ edges included."""
    mods = _modules(root)
    raw = _raw_imports(mods)
    top = next(iter(mods)).split(".")[0]
    busy_init = {m for m, p in mods.items() if p.name == "__init__.py" and _runs_imports(p, top)}
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, edges in raw.items():
        own = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)} | {mod}
        for t, line, _ in edges:
            parts = t.split(".")
            for i in range(1, len(parts)):                          # the packages the import initialises
                pkg = ".".join(parts[:i])
                if pkg in busy_init and pkg not in own:
                    graph[mod].setdefault(pkg, line)
            if t != mod:
                graph[mod].setdefault(t, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (or a module importing itself)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_cycles(root: Path, known: set[tuple[str, str]] = frozenset()) -> list[str]:
    """One description per cycle: its modules and the imports (file:line -> module) between them."""
    graph = {m: {t: n for t, n in es.items() if (m, t) not in known} for m, es in import_graph(root).items()}
    mods = _modules(root)
    found = []
    for comp in strongly_connected(graph):
        inside = set(comp)
        lines = [f"  {mods[m].relative_to(root.parent)}:{n} -> {t}" for m in comp
                 for t, n in sorted(graph[m].items()) if t in inside]
        found.append("cycle " + " <-> ".join(comp) + "\n" + "\n".join(lines))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path) -> list[tuple[str, int, str]]:
    """(module, line, what) of every private name of another module of the package that a module imports
    (``from p.m import _x``) or reads off an imported module (``import p.m as m; m._x``)."""
    mods = _modules(root)
    top = root.name
    found = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        aliases = {}
        for line, what, names, asname in _import_nodes(path):
            if names is None:
                if what.startswith(top + ".") or what == top:
                    if any(_private(p) for p in what.split(".")):
                        found.append((mod, line, what))
                    if asname:
                        aliases[asname] = what
                continue
            base = _resolve(mod, is_pkg, what)
            if not (base == top or base.startswith(top + ".")):
                continue
            for n, a in names:
                if f"{base}.{n}" in mods:
                    aliases[a or n] = f"{base}.{n}"
                if _private(n) and base != mod:
                    found.append((mod, line, f"{base}.{n}"))
        for node in _ast.walk(_tree(path)):
            if (isinstance(node, _ast.Attribute) and _private(node.attr) and isinstance(node.value, _ast.Name)
                    and aliases.get(node.value.id, mod) != mod):
                found.append((mod, node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
    return sorted(set(found))


def test_no_import_cycles():
    cycles = import_cycles(PKG, KNOWN_EDGES)
    assert not cycles, "import cycles in dmftc:\n" + "\n".join(cycles)


def test_known_exceptions_are_still_needed():
    graph = import_graph(PKG)
    gone = [edge for edge in KNOWN_EDGES if edge[1] not in graph.get(edge[0], {})]
    found = {(m, what) for m, _, what in private_imports(PKG)}
    assert not gone and KNOWN_PRIVATE <= found, f"drop from the allow-lists: {gone} {KNOWN_PRIVATE - found}"


def test_no_private_names_across_modules():
    hits = [f"{m}:{n}: {what}" for m, n, what in private_imports(PKG) if (m, what) not in KNOWN_PRIVATE]
    assert not hits, "private names imported across modules:\n" + "\n".join(hits)


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_planted_cycle_is_found(tmp_path):
    """a -> b (module level) -> c (relative) -> a (inside a function): one cycle of three, with its lines."""
    root = _plant(tmp_path, {"__init__.py": "", "sub/__init__.py": "",
                             "a.py": "import os\nfrom pkg.sub import b\n",
                             "sub/b.py": "from . import c\n",
                             "sub/c.py": "def f():\n    from pkg.a import thing\n    return thing\n",
                             "d.py": "from pkg.a import x\n"})
    (cycle,) = import_cycles(root)
    assert cycle.startswith("cycle pkg.a <-> pkg.sub.b <-> pkg.sub.c"), cycle
    assert "pkg/sub/c.py:2 -> pkg.a" in cycle and "pkg/a.py:2 -> pkg.sub.b" in cycle
    assert import_cycles(root, {("pkg.sub.c", "pkg.a")}) == []


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """Importing pkg.sub.b runs pkg/sub/__init__, which imports pkg.a: a cycle when pkg.a imports pkg.sub.b.
    An empty __init__, or one of the importer's own packages, makes no edge."""
    root = _plant(tmp_path, {"__init__.py": "from pkg.a import x\n", "sub/__init__.py": "from pkg import a\n",
                             "a.py": "import pkg.sub.b\n", "sub/b.py": "x = 1\n"})
    (cycle,) = import_cycles(root)
    assert "pkg.a <-> pkg.sub" in cycle, cycle
    (root / "sub/__init__.py").write_text('"""Nothing here."""\nif TYPE_CHECKING:\n    from pkg import a\n'
                                          'def f():\n    from pkg import a\n')
    assert import_cycles(root) == []


def test_planted_private_imports_are_found(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "a.py": "_x = 1\n__version__ = '1'\n",
                             "b.py": "from pkg.a import _x, __version__\nfrom . import a\nimport pkg.a as al\n"
                                     "def f():\n    return a._x + al._x + a.__name__\n",
                             "c.py": "_y = 2\nfrom pkg.c import _y\n"})
    assert private_imports(root) == [("pkg.b", 1, "pkg.a._x"), ("pkg.b", 5, "pkg.a._x")]


# The compile stages in order: a module of a stage may import its own stage and the stages before it (and dmftc,
# dmftc.errors, dmftc.version), nothing after it and nothing of the runtime, in any function or at module level.
STAGES = ("frontend", "ir", "derive", "codegen")


def stage_violations(root: Path) -> list[str]:
    """'module:line -> target' for every import of a compile-stage module that reaches a later stage or a
    package outside the compile stages (except the top package's errors and version)."""
    top = root.name
    graph = import_graph(root)
    allowed_outside = {top, f"{top}.errors", f"{top}.version"}
    found = []
    for mod, edges in sorted(graph.items()):
        parts = mod.split(".")
        if len(parts) < 2 or parts[1] not in STAGES:
            continue
        rank = STAGES.index(parts[1])
        for t, line in sorted(edges.items()):
            tp = t.split(".")
            if t in allowed_outside:
                continue
            if len(tp) < 2 or tp[1] not in STAGES or STAGES.index(tp[1]) > rank:
                found.append(f"{mod}:{line} -> {t}")
    return found


def test_compile_stages_import_one_way():
    hits = stage_violations(PKG)
    assert not hits, "compile-stage imports against the stage order (frontend, ir, derive, codegen):\n" + \
        "\n".join(hits)


def test_a_stage_violation_is_found(tmp_path):
    """An IR module importing the derivation inside a function, and a derivation module importing the runtime."""
    root = _plant(tmp_path, {"__init__.py": "", "errors.py": "", "frontend/__init__.py": "", "ir/__init__.py": "",
                             "derive/__init__.py": "", "codegen/__init__.py": "", "runtime/__init__.py": "",
                             "frontend/a.py": "from pkg import errors\n",
                             "ir/b.py": "from pkg.frontend import a\ndef f():\n    from pkg.derive import c\n",
                             "derive/c.py": "import pkg.runtime.d\n", "runtime/d.py": "",
                             "codegen/e.py": "from pkg.derive import c\nfrom pkg.ir import b\n"})
    assert stage_violations(root) == ["pkg.derive.c:1 -> pkg.runtime.d", "pkg.ir.b:3 -> pkg.derive.c"]


# The runtime's sub-packages by role, lowest first: a module may import runtime modules of its own package or of a
# lower rank only (the modules directly in runtime/, the entry points solve and model, rank above all).
RUNTIME_ROLES = {"numerics": 0, "results": 0, "problem": 1, "march": 2, "solvers": 2, "sensitivities": 3,
                 "adjoint": 4, "matrix_free": 4, "engines": 4}


def runtime_role_violations(root: Path) -> list[str]:
    """'module:line -> target' for every import inside the runtime that reaches a package of the same or a higher
    rank than the importer's own (RUNTIME_ROLES), or a runtime module that belongs to no role package."""
    top = f"{root.name}.runtime"
    top_rank = max(RUNTIME_ROLES.values()) + 1

    def rank(mod):
        parts = mod.split(".")
        if len(parts) < 3 or parts[2] not in RUNTIME_ROLES:
            return parts[2] if len(parts) >= 3 else None, top_rank
        return parts[2], RUNTIME_ROLES[parts[2]]

    found = []
    for mod, edges in sorted(import_graph(root).items()):
        if not mod.startswith(top + "."):
            continue
        own, r = rank(mod)
        for t, line in sorted(edges.items()):
            if not t.startswith(top + ".") or t.split(".")[2] == own:
                continue
            _, rt = rank(t)
            if rt >= r and not (rt == r == top_rank):        # the entry points may import each other
                found.append(f"{mod}:{line} -> {t}")
    return found


def test_runtime_roles_import_one_way():
    hits = runtime_role_violations(PKG)
    assert not hits, "runtime imports against the roles' order (numerics, results < problem < march, solvers < " \
        "sensitivities < engines and prototypes < solve, model):\n" + "\n".join(hits)
    loose = sorted(p.name for p in (PKG / "runtime").glob("*.py"))
    assert loose == ["__init__.py", "model.py", "solve.py"], loose


def test_a_runtime_role_violation_is_found(tmp_path):
    """A march module importing an engine inside a function, and a problem module importing the march."""
    files = {"__init__.py": "", "runtime/__init__.py": "", "runtime/solve.py": "from pkg.runtime.engines import e\n"}
    for p in RUNTIME_ROLES:
        files[f"runtime/{p}/__init__.py"] = ""
    files |= {"runtime/march/m.py": "def f():\n    from pkg.runtime.engines import e\n",
              "runtime/problem/p.py": "import pkg.runtime.march.m\n",
              "runtime/engines/e.py": "from pkg.runtime.problem import p\nfrom pkg.runtime.numerics import n\n",
              "runtime/numerics/n.py": ""}
    root = _plant(tmp_path, files)
    assert runtime_role_violations(root) == ["pkg.runtime.march.m:2 -> pkg.runtime.engines.e",
                                             "pkg.runtime.problem.p:1 -> pkg.runtime.march.m"]
