"""Progress bars: drawn when enabled, silent when disabled (--quiet), sparse in logs."""
import io

import numpy as np

from dmftc.validation.ensemble import simulate_two_layer
from dmftc.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_disabled_bar_writes_nothing():
    out = io.StringIO()
    with Progress("x", 5, enabled=False, stream=out) as bar:
        for _ in range(5):
            bar.advance()
    assert out.getvalue() == ""


def test_tty_bar_redraws_in_place_and_finishes():
    out = _Tty()
    with Progress("solve", 4, stream=out) as bar:
        for k in range(4):
            bar.advance(note=f"step {k}")
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n")
    assert "4/4" in text and "[" + "#" * 24 + "]" in text and "done" in text


def test_log_bar_prints_only_sparse_lines():
    out = io.StringIO()
    with Progress("solve", 100, stream=out, log_every=3600) as bar:
        for _ in range(100):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "100/100" in lines[0]


def test_ensemble_progress_counts_all_members(capsys):
    stats = simulate_two_layer(activation="tanh", Kx_all=np.eye(1), y=np.ones(1), gamma=1.0, eta=0.1,
                               T=3, N=8, E=6, batch=2, progress=True)
    assert stats.E == 6
    err = capsys.readouterr().err
    assert "ensemble N=8" in err and "6/6" in err


def test_quiet_run_prints_nothing(tmp_path, capsys):
    from dmftc.cli import main
    assert main(["run", "specs/linear_whitened.dmft", "--set", "T=5", "-q"]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == ""


def test_run_shows_progress_on_stderr(capsys):
    from dmftc.cli import main
    assert main(["run", "specs/two_layer.dmft", "--set", "T=6", "--samples", "400", "--backend", "mc"]) == 0
    cap = capsys.readouterr()
    assert "two_layer mc" in cap.err and "24/24" in cap.err
    assert "Delta" in cap.out
