"""Figures of a Solution (dmftc.runtime.results.plot): Monte Carlo error bands in every panel, symbols on the axes, the
solve's parameters in the title, the width-N spread labelled, a networks ensemble overlaid, and a clear error
without matplotlib."""
from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402

from dmftc.compiler import load  # noqa: E402
from dmftc.errors import ParameterError  # noqa: E402
from dmftc.runtime.results.plot import MC_BAND, plot_solution, symbol, width_band_label  # noqa: E402


@pytest.fixture(scope="module")
def two_layer():
    return load("specs/two_layer.dmft").solve(T=8, samples=2000, correction=True)


@pytest.fixture(scope="module")
def deep():
    # the smallest propagator the options allow: 2 groups (the deep engine's least) of 2 paths
    return load("specs/deep_tanh.dmft").solve(T=4, samples=2000, propagator_samples=4, propagator_groups=2)


def _bands(ax, label=None):
    return [c for c in ax.collections if isinstance(c, PolyCollection) and (label is None or c.get_label() == label)]


def _check_panels(fig, symbols):
    top, bottom = fig.axes[:len(fig.axes) // 2], fig.axes[len(fig.axes) // 2:]
    assert len(top) == len(symbols)
    for ax_m, ax_v, sym in zip(top, bottom, symbols):
        assert _bands(ax_m, MC_BAND) and _bands(ax_v, MC_BAND), sym     # +-2 s.e. on the mean and on N Var
        assert ax_m.get_ylabel() == f"mean {sym}" and ax_v.get_ylabel() == f"N Var {sym}"
        assert ax_v.get_xlabel() == "t"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert MC_BAND in legend and "N = ∞" in legend


def test_symbols():
    assert symbol("Delta") == r"$\Delta(t)$" and symbol("K") == "$K(t)$"
    assert symbol("Phi[1]", args="t,t") == r"$\Phi^{1}(t,t)$" and symbol("G[2]", args="t,t") == "$G^{2}(t,t)$"
    assert symbol("h_star") == r"$h_{\star}(t)$" and symbol("K_star") == r"$K_{\star}(t)$"
    assert symbol("loss_train") == r"$\mathrm{loss}_{\mathrm{train}}(t)$"
    assert symbol("Phi[1]", args="t,t", index=r"\ell") == r"$\Phi^{\ell}(t,t)$"
    assert symbol("Delta", args=None, component="2") == r"$\Delta_{2}$"
    assert symbol("weird-name") == r"$\mathrm{weird\_name}$"


def test_two_layer_figure(two_layer, tmp_path):
    path = tmp_path / "q.png"
    fig = plot_solution(two_layer, path, return_fig=True)
    assert path.stat().st_size > 0
    _check_panels(fig, [r"$\Delta(t)$", r"$f_{\star}(t)$", r"$K(t)$", r"$K_{\star}(t)$"])
    title = fig._suptitle.get_text()
    for part in ("two_layer", r"$\gamma$ = 1", r"$\eta$ = 0.02", "T = 8", "2000 samples"):
        assert part in title, title
    assert two_layer.plot(tmp_path / "again.png") == tmp_path / "again.png"       # by default: the path


def test_width_spread_is_labelled_beneath_the_infinite_width_curve(two_layer, tmp_path):
    fig = two_layer.plot(tmp_path / "w.png", width=64, return_fig=True)
    label = width_band_label(64)
    assert label == "width N = 64: ±2 sd over initialisations"
    top = fig.axes[:len(fig.axes) // 2]
    for ax in top:
        (band,) = _bands(ax, label)
        inf = [ln for ln in ax.get_lines() if ln.get_label() == "N = ∞"]
        assert inf and inf[0].get_zorder() > band.get_zorder()                        # N = inf on top
        assert max(ln.get_zorder() for ln in ax.get_lines() if ln.get_label().startswith("mean at N")) \
            < inf[0].get_zorder()
    # the band's half width is 2 sqrt(Sigma / N) about the width-N mean
    ax, name = top[2], "K"
    verts = _bands(ax, label)[0].get_paths()[0].vertices
    spread = 2 * np.sqrt(two_layer.var(name) / 64)
    hi = verts[1:9, 1] if np.allclose(verts[1:9, 0], two_layer.times) else None
    assert hi is not None and np.allclose(hi, two_layer.mean_at_width(name, 64) - spread)
    assert label in [t.get_text() for t in fig.legends[0].get_texts()]
    assert "width N = 64" in fig._suptitle.get_text()


def test_deep_figure(deep, tmp_path):
    fig = deep.plot(tmp_path / "d.png", return_fig=True)
    _check_panels(fig, [r"$\Delta(t)$", r"$K(t)$", r"$\Phi^{\ell}(t,t)$", r"$G^{\ell}(t,t)$"])
    title = fig._suptitle.get_text()
    for part in ("deep_tanh", "L = 2", r"$\gamma$ = 1", r"$\eta$ = 0.05", "T = 4", "2000 samples", "propagator 4"):
        assert part in title, title
    # the layers of a family: one legend entry each
    assert [t.get_text() for t in fig.axes[2].get_legend().get_texts()] == [r"$\Phi^{1}$", r"$\Phi^{2}$"]


class _Var:
    def __init__(self, values, dims):
        self.values, self.dims = np.asarray(values), dims


def test_ensemble_overlay_duck_typed(two_layer, tmp_path):
    table = {}
    for n in two_layer.observables:
        table[f"mean_{n}"] = _Var(two_layer.mean(n) + 0.01, ("t",))
        table[f"mean_se_{n}"] = _Var(np.full(8, 0.005), ("t",))
        table[f"var_{n}"] = _Var(two_layer.var(n) * 1.1, ("t",))
        table[f"var_se_{n}"] = _Var(np.full(8, 0.002), ("t",))
    fig = plot_solution(two_layer, None, ensemble=table, return_fig=True)
    for ax in fig.axes:
        (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert bars.get_label() == "networks ±2 s.e."
    class Attrs(dict):
        attrs = {"width": 128}
    assert plot_solution(two_layer, None, ensemble=Attrs(table), return_fig=True).axes[0].containers[0].get_label() \
        == "networks, N = 128: ±2 s.e."
    x, y = fig.axes[0].containers[0].lines[0].get_data()
    assert np.allclose(x, two_layer.times) and np.allclose(y, two_layer.mean("Delta") + 0.01)
    assert "networks ±2 s.e." in [t.get_text() for t in fig.legends[0].get_texts()]


def test_ensemble_overlay_xarray_layers(deep):
    xr = pytest.importorskip("xarray")
    T, L = deep.T, deep.depth
    data = {}
    for fam in ("Phi", "G"):
        diag = np.stack([np.diagonal(deep.mean(f"{fam}[{l}]")) for l in range(1, L + 1)])
        data[f"mean_{fam}"] = (("layer", "t"), diag)
        data[f"mean_se_{fam}"] = (("layer", "t"), np.full((L, T), 0.01))
    ds = xr.Dataset(data, coords={"layer": np.arange(1, L + 1), "t": deep.times})
    fig = plot_solution(deep, None, ensemble=ds, return_fig=True)
    bars = [c for c in fig.axes[2].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == L                                  # Phi[1] and Phi[2], each from its layer
    assert np.allclose(bars[1].lines[0].get_data()[1], np.diagonal(deep.mean("Phi[2]")))
    assert not [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]     # no Delta: skipped


def test_exact_and_means_only(two_layer):
    from dataclasses import replace

    exact = replace(two_layer, info=dict(two_layer.info, samples=None))
    fig = exact.plot(None, return_fig=True)
    assert all(_bands(ax) for ax in fig.axes)                                 # zero-width, but there
    assert MC_BAND not in [t.get_text() for t in fig.legends[0].get_texts()]   # and not called Monte Carlo
    assert "; exact" in fig._suptitle.get_text()
    means = replace(two_layer, blocks=None, blocks_error=ParameterError("no propagator"))
    fig = means.plot(None, return_fig=True)
    bottom = fig.axes[len(fig.axes) // 2:]
    assert all(ax.texts[0].get_text() == "N Var not available" and not ax.get_lines() for ax in bottom)
    assert all(ax.get_lines() for ax in fig.axes[:len(fig.axes) // 2])


def test_without_matplotlib_a_clear_error(two_layer, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ParameterError, match=r'--plot needs matplotlib: pip install "dmftc\[plot\]"'):
        plot_solution(two_layer, tmp_path / "x.png")
