"""Command line rough edges: output paths and matplotlib are checked before the solve, a missing spec file is a
bad argument (exit 2), arrays on --set are documented and work, docs/cli.md covers every option."""
import os
import sys
from pathlib import Path

import pytest

import dmftc.compiler
from dmftc import cli

ROOT = Path(__file__).resolve().parent.parent
EOS = str(ROOT / "specs" / "eos.dmft")


@pytest.fixture
def no_solve(monkeypatch):
    """Any compile or solve is a test failure: the argument checks must come first."""
    def load(*args, **kwargs):
        raise AssertionError("the solve started before the arguments were checked")
    monkeypatch.setattr(dmftc.compiler, "load", load)


@pytest.mark.parametrize("option, name", [("--plot", "fig.png"), ("--out", "res.npz"), ("--out", "res.nc")])
def test_output_in_a_missing_directory_exits_2_before_the_solve(tmp_path, capsys, no_solve, option, name):
    target = tmp_path / "missing_dir" / name
    assert cli.main(["run", EOS, option, str(target)]) == 2
    err = capsys.readouterr().err
    assert f"dmftc: error: {option} {target}: directory {target.parent} does not exist" in err
    assert f"hint: mkdir -p {target.parent}" in err
    assert not target.parent.exists()               # not created silently


@pytest.mark.parametrize("option, name, allowed", [("--plot", "fig.jpg", ".png, .pdf or .svg"),
                                                   ("--plot", "fig", ".png, .pdf or .svg"),
                                                   ("--out", "res.csv", ".npz or .nc")])
def test_output_suffix_is_checked_before_the_solve(tmp_path, capsys, no_solve, option, name, allowed):
    assert cli.main(["run", EOS, option, str(tmp_path / name)]) == 2
    assert f"must end in {allowed}" in capsys.readouterr().err


def test_output_directory_must_be_a_writable_directory(tmp_path, capsys, no_solve):
    (tmp_path / "file").write_text("")
    assert cli.main(["run", EOS, "--out", str(tmp_path / "file" / "r.npz")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "d.png").mkdir()
    assert cli.main(["run", EOS, "--plot", str(tmp_path / "d.png")]) == 2
    assert "is a directory" in capsys.readouterr().err
    if os.geteuid() == 0:
        return                                      # root writes anywhere: no unwritable directory to test
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert cli.main(["run", EOS, "--out", str(locked / "r.npz")]) == 2
        assert "is not writable" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)


def test_plot_without_matplotlib_exits_2_before_the_solve(tmp_path, capsys, monkeypatch, no_solve):
    monkeypatch.setitem(sys.modules, "matplotlib", None)           # import matplotlib now raises ImportError
    assert cli.main(["run", EOS, "--plot", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    assert 'dmftc: error: --plot needs matplotlib: pip install "dmftc[plot]"' in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["run"], ["derive"], ["derive", "--latex"], ["derive", "--ir"], ["compile"],
                                  ["compile", "--check"], ["compile", EOS]])
def test_missing_spec_file_exits_2(tmp_path, capsys, no_solve, argv):
    missing = tmp_path / "nope.dmft"
    assert cli.main([*argv, str(missing)]) == 2
    assert f"dmftc: error: no such spec file: {missing}" in capsys.readouterr().err
    assert not (tmp_path / "generated").exists()


def test_a_directory_is_not_a_spec_file(tmp_path, capsys):
    assert cli.main(["derive", str(tmp_path)]) == 2
    assert "not a spec file" in capsys.readouterr().err


def test_set_help_documents_arrays():
    run = cli.build_parser()._subparsers._group_actions[0].choices["run"]
    text = " ".join(run.format_help().split())
    assert '--set "Kx=[[1, 0.5], [0.5, 1]]"' in text and "nested list" in text and "quote" in text


def test_docs_cover_every_command_option_and_exit_code():
    doc = (ROOT / "docs" / "cli.md").read_text()
    sub = cli.build_parser()._subparsers._group_actions[0].choices
    for name, parser in sub.items():
        assert f"dmftc {name}" in doc
        for action in parser._actions:
            for flag in [] if "-h" in action.option_strings else action.option_strings:
                assert f"`{flag}" in doc or f"{flag}`" in doc or f"`{flag} " in doc, (name, flag)
    for code, meaning in (("0", "success"), ("1", "spec"), ("2", "bad argument"), ("3", "numerical")):
        assert any(line.startswith(f"| {code} ") and meaning in line for line in doc.splitlines()), code
    assert "Kx=[[" in doc and "hint:" in doc and "^" in doc


def test_arrays_on_set_work_end_to_end(tmp_path):
    out = tmp_path / "m.npz"
    argv = ["run", str(ROOT / "specs" / "two_layer_multi.dmft"), "--set", "Kx=[[1,0.3],[0.3,1]]",
            "--set", "y=[1,-0.5]", "--set", "T=5", "--samples", "2000", "-q", "--out", str(out)]
    assert cli.main(argv) == 0
    sol = dmftc.Solution.load(out)
    assert sol.mean("Delta").shape == (2, 5) and sol.params["P"] == 2
    assert sol.params["Kx"].tolist() == [[1, 0.3], [0.3, 1]] and sol.mean("Delta")[:, 0].tolist() == [1, -0.5]


# ------------------------------------------------------------------------------ dmftc derive: plain and LaTeX

SPECS = sorted((ROOT / "specs").glob("*.dmft"))


@pytest.fixture(scope="module")
def derived():
    from dmftc.compiler import front_end, front_end_ir
    from dmftc.derive.report import format_derivation
    from dmftc.ir.text import format_ir

    out = {}
    for spec in SPECS:
        _, d = front_end(spec)
        out[spec.stem] = {"plain": format_derivation(d), "latex": format_derivation(d, latex=True),
                          "ir": format_ir(front_end_ir(spec)[1])}
    return out


def latex_structure_errors(text: str) -> list[str]:
    """Braces, environments and \\left/\\right balanced (comments and escaped braces aside)."""
    import re

    errors, stack = [], []
    body = "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in text.splitlines())
    depth = 0
    for m in re.finditer(r"\\[{}]|[{}]|\\begin\{(\w+\*?)\}|\\end\{(\w+\*?)\}", body):
        tok = m.group(0)
        if tok in ("{", "}"):
            depth += 1 if tok == "{" else -1
            if depth < 0:
                errors.append("unbalanced }")
                depth = 0
        if m.group(1):
            stack.append(m.group(1))
        if m.group(2):
            if not stack or stack.pop() != m.group(2):
                errors.append(f"\\end{{{m.group(2)}}} does not close its environment")
    if depth:
        errors.append(f"{depth} unclosed braces")
    if stack:
        errors.append(f"unclosed environments {stack}")
    if len(re.findall(r"\\left\b", body)) != len(re.findall(r"\\right\b", body)):
        errors.append("\\left and \\right do not pair")
    if re.search(r"\\operatorname\{[^}]*[\[/'\]]", body):
        errors.append("a quantity's name printed as an operator name")
    return errors


@pytest.mark.parametrize("spec", [s.stem for s in SPECS])
def test_derive_prints_the_spec_notation_and_valid_latex(derived, spec):
    out = derived[spec]
    for kind in ("plain", "ir"):
        for raw in ("Sum(", "**", "Derivative(", "#", "__"):
            assert raw not in out[kind], (kind, raw, [x for x in out[kind].splitlines() if raw in x][:2])
    latex = out["latex"]
    for raw in ("Sum(", "**", "Derivative(", "∫", "#", "__", r"\mathrm{per}", r"\mathrm{step}"):
        assert raw not in latex, (raw, [x for x in latex.splitlines() if raw in x][:2])
    assert latex_structure_errors(latex) == []
    assert latex.count(r"\begin{align*}") >= 3
    for line in latex.splitlines():   # every line is a comment, a heading, an environment, a row or empty
        assert line == "" or line.startswith(("%", r"\medskip", r"\begin{", r"\end{", "  ")), line


def test_derive_prints_recurrences_and_schedules_as_written(derived):
    """The optimiser's state in recurrence form (specs/two_layer_sgd.dmft): each recurrence as the spec writes it,
    the running sum that carries it with what it holds, the step eta cancelled in a recurrence's change, and the
    per-step factor lr[T] at the step it is read (lr[s] inside a sum over s < t, lr[t - 1] in a recurrence)."""
    sgd = derived["two_layer_sgd"]
    plain, latex = sgd["plain"], sgd["latex"]
    assert "recur   vh(t) = beta vh(t - 1) + Delta(t) g(t) - lam / gamma h(t);  vh(-1) = 0" in plain
    assert "recur   h(t) = h(t - 1) + eta gamma lr[t-1] vh(t - 1);  h(0) = u" in plain
    assert "Ivh(t) = vh(t - 1) = sum_{s<t} (beta*Ivh(s) + Delta(s)*g(s) - Ivh(s) - lam*h(s)/gamma)" in plain
    assert "Ih(t) = h(t) - u = eta * sum_{s<t} gamma*lr[s]*(beta*Ivh(s) + Delta(s)*g(s) - lam*h(s)/gamma)" in plain
    assert "dIvh(t)/dDelta(s') += [t=s']*g(t) + beta*dIvh/dDelta'(t)" in plain
    assert "_I3(t) + eta*gamma*lr[t]*(" in plain                                          # the site program
    assert "/eta" not in plain and "/eta" not in sgd["ir"] and "Ivh(t) = sum_{s<t} (beta*Ivh(s)" in sgd["ir"]
    assert r"\mathrm{lr}_{s}" in latex and r"\mathrm{lr}_{t-1}" in latex and r"\frac{1}{\eta}" not in latex


def test_latex_structure_check_can_fail():
    assert latex_structure_errors(r"\begin{align*} x &= \left( y \end{align*}") == ["\\left and \\right do not pair"]
    assert latex_structure_errors(r"\begin{align*} {x \end{align}") != []
    assert latex_structure_errors(r"\operatorname{dh/dDelta'}{\left(t \right)}") != []


@pytest.mark.skipif(__import__("shutil").which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_compiles(derived, tmp_path):
    import subprocess

    for spec, out in derived.items():
        doc = tmp_path / f"{spec}.tex"
        doc.write_text("\\documentclass{article}\n\\usepackage{amsmath}\n\\begin{document}\n" + out["latex"]
                       + "\n\\end{document}\n")
        r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (spec, r.stdout[-2000:])


def test_derive_reads_well_for_two_layer_and_deep(derived):
    two, deep = derived["two_layer"], derived["deep_tanh"]
    assert "g(t) = (1 - tanh(h(t))^2)*z(t)" in two["plain"]
    assert r"{h_{\star}\left(t\right)} &= \gamma\,\mathrm{kx}\,{I_{1}\left(t\right)} + u_{\star}" in two["latex"]
    assert r"\frac{\partial h_{\star}\left(t\right)}{\partial \Delta\left(s'\right)}" in two["latex"]
    assert "K(t) = sum(l = 0..L: G[l+1]*Phi[l])" in deep["plain"]
    assert "sum(s < t: A[L](t, s)*G[L+1](t, s)) + sum(s <= t: B[L+1](t, s)*Phi[L](t, s))" in deep["plain"]
    assert r"{K\left(t\right)} &= \sum_{l=0}^{L} {G_{l+1}}\,{\Phi_{l}}" in deep["latex"]
    assert "sum(nu: Delta[nu](s)*g[nu](s)*Kx[mu, nu])" in derived["two_layer_multi"]["plain"]
    assert "sum(mu2: Delta[mu2](t)*dg/dDelta'[mu2,mu'](t)*Kx[mu, mu2])" in derived["two_layer_multi"]["plain"]
    multi = derived["two_layer_multi"]["latex"]             # index sums over the spec's 1..P
    assert r"1 \leq \nu \leq P" in multi and r"\sum_{\mu_{2}=1}^{P}" in multi
