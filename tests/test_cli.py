"""Command line: exit codes 0/1/2/3 and no Python tracebacks for bad input.

Most tests call the command line in this process (tests/cli_runner.py); the bad spec and the usage error run
the real entry point, ``python -m dmftc.cli``, in a subprocess."""
import subprocess
import sys
from pathlib import Path

from cli_runner import dmftc

ROOT = Path(__file__).resolve().parent.parent


def entry_point(*args, cwd=ROOT):
    """The real ``python -m dmftc.cli``, for the tests that exercise the entry point and the interpreter's exit."""
    return subprocess.run([sys.executable, "-m", "dmftc.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_bad_spec_exits_1_with_location(tmp_path):
    bad = tmp_path / "bad.dmft"
    text = (ROOT / "specs" / "two_layer.dmft").read_text()
    line = text[:text.index("s < t)\n")].count("\n") + 1
    bad.write_text(text.replace("s < t)\n", "s <= t)\n", 1))
    r = entry_point("compile", str(bad), "-o", str(tmp_path / "gen"))
    assert r.returncode == 1
    assert f"{bad}:{line}:" in r.stderr and "not strictly causal" in r.stderr and "hint: " in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "gen" / "bad.py").exists()


def test_missing_spec_file_is_a_clean_error(tmp_path):
    r = dmftc("derive", str(tmp_path / "nope.dmft"))        # a bad argument, not an error in a spec
    assert r.returncode == 2 and "no such spec file" in r.stderr and "Traceback" not in r.stderr


def test_bad_parameter_exits_2():
    r = dmftc("run", "specs/eos.dmft", "--set", "gama=2", "--samples", "100")
    assert r.returncode == 2 and "did you mean 'gamma'" in r.stderr and "Traceback" not in r.stderr
    r = dmftc("run", "specs/eos.dmft", "--set", "gamma=abc")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_usage_error_exits_2():
    r = entry_point("frobnicate")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_divergence_exits_3():
    r = dmftc("run", "specs/eos.dmft", "--set", "gamma=20", "--set", "eta=0.1", "--set", "T=60", "--samples", "200")
    assert r.returncode == 3 and "non-finite at step" in r.stderr and "Traceback" not in r.stderr


def test_run_prints_summary_and_check_passes(tmp_path):
    r = dmftc("run", "specs/eos.dmft", "--samples", "500", "--set", "T=10", "--plot", str(tmp_path / "f.png"))
    assert r.returncode == 0, r.stderr
    assert "model eos" in r.stdout and "peak N Var" in r.stdout and (tmp_path / "f.png").stat().st_size > 1000
    r = dmftc("compile", "--check", *sorted(str(p) for p in (ROOT / "specs").glob("*.dmft")))
    assert r.returncode == 0, r.stdout


def test_derive_prints_equations():
    r = dmftc("derive", "specs/two_layer.dmft")
    assert r.returncode == 0 and "U[K, Delta](t, s) = - D[K, Delta](t, s)" in r.stdout
    r = dmftc("derive", "specs/two_layer.dmft", "--latex")
    assert r.returncode == 0 and r.stdout.count(r"\begin{align*}") >= 3 and "Sum(" not in r.stdout


def dmftc_module():
    import dmftc as module
    return module


def test_run_at_width_reports_the_corrected_mean_and_loss(tmp_path):
    r = dmftc("run", "specs/two_layer.dmft", "--set", "T=8", "--samples", "2000", "--width", "64",
              "--out", str(tmp_path / "r.npz"))
    assert r.returncode == 0, r.stderr
    assert "at width N = 64" in r.stdout and "expected loss" in r.stdout and "shift" in r.stdout
    assert dmftc_module().Solution.load(tmp_path / "r.npz").mean_correction("K").shape == (8,)
    r = dmftc("run", "specs/two_layer.dmft", "--set", "T=8", "--width", "0")
    assert r.returncode == 2 and "--width" in r.stderr and "Traceback" not in r.stderr
