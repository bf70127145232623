"""The intermediate representation: every spec, two-layer or deep, lowers to one ModelIR that the derivation
reads and ``dmftc derive --ir`` prints."""
from pathlib import Path

import pytest
import sympy as sp

from cli_runner import dmftc  # tests/cli_runner.py: the command line in this process
from dmftc.compiler import front_end_ir
from dmftc.derive import derive
from dmftc.frontend.check import check
from dmftc.frontend.parse import parse
from dmftc.ir import ModelIR, lower
from dmftc.ir.text import format_ir

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "specs").glob("*.dmft"))


def _ir(path) -> ModelIR:
    return front_end_ir(Path(path))[1]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_spec_lowers_and_prints(path):
    ir = _ir(path)
    r = dmftc("derive", "--ir", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == format_ir(ir)
    for o in ir.orders:
        assert o.kind in ("average", "constraint", "response")
        assert f"\n  {o.name}" in r.stdout
    assert ir.kind == ("deep" if path.stem.startswith("deep") else "two_layer")


def test_two_layer_ir_contents():
    shipped = {o.name: o.kind for o in _ir(ROOT / "specs" / "two_layer.dmft").orders}
    assert shipped == {"Delta": "average", "f_star": "average", "K": "average", "K_star": "average"}
    ir = _ir(ROOT / "tests" / "specs" / "two_layer_ntk.dmft")      # errors updated through the NTK
    kinds = {o.name: o.kind for o in ir.orders}
    assert kinds == {"Delta": "constraint", "f_star": "constraint", "K": "average", "K_star": "average"}
    assert all(o.times == 1 and o.layer is None for o in ir.orders)
    assert all(s.process == "normal" and s.depends_on == () for s in ir.sources)   # constant covariances
    assert [f.name for f in ir.fields] == ["h", "h_star", "z", "g", "g_star"]
    # Delta(t) = y - eta sum_{s<t} Delta(s) K(s): a running sum of order parameters
    (dsum,) = [s for s in ir.order_sums if s.increment == sp.Symbol("Delta", real=True) * sp.Symbol("K", real=True)]
    assert ir.order("Delta").rest.has(sp.Symbol(dsum.name, real=True))
    assert ir.order("K").observable is not None and ir.order("Delta").observable is None


def test_deep_ir_contents():
    ir = _ir(ROOT / "specs" / "deep_tanh.dmft")
    by = {o.name: o for o in ir.orders}
    assert {n: (o.kind, o.times, o.layer) for n, o in by.items()} == {
        "Delta": ("constraint", 1, None), "K": ("constraint", 1, None), "Phi": ("average", 2, "l"),
        "G": ("average", 2, "l"), "A": ("response", 2, "l"), "B": ("response", 2, "l")}
    assert (by["A"].wrt, by["B"].wrt) == ("r", "u")
    assert len(by["Delta"].averages) == 2                      # the readout E[z[L] phi(h[L])] at t and at 0
    src = {s.targets[0][0]: s for s in ir.sources}
    assert (src["u"].process, src["u"].depends_on, src["u"].layer_offset) == ("gp", ("Phi",), -1)
    assert (src["r"].depends_on, src["r"].layer_offset) == (("G",), 1)
    assert {(b.name, b.layer) for b in ir.boundaries} == {("Phi", "0"), ("G", "L+1"), ("A", "0"), ("B", "L+1")}
    assert ir.axes[0].kind == "layer" and ir.axes[0].size == "L"


def test_action_and_direct_deep_specs_lower_to_the_same_ir():
    """The deep action (kernel pairs, -Tr(A B), one log E per layer) gives the same order-parameter definitions
    as writing them out directly."""
    a = _ir(ROOT / "specs" / "deep_tanh.dmft")
    d = _ir(ROOT / "tests" / "specs" / "deep_tanh_direct.dmft")
    assert format_ir(a) == format_ir(d)
    strip = lambda ir: [(o.name, o.kind, o.coeff, o.rest, o.observable, o.wrt) for o in ir.orders]  # noqa: E731
    assert strip(a) == strip(d) and a.fields == d.fields and a.sources == d.sources


def test_a_changed_activation_changes_only_the_activation():
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    base = lower(check(parse(text, "a.dmft")))
    other = lower(check(parse(text.replace("activation phi(h) = tanh(h)", "activation phi(h) = sin(h)"), "b.dmft")))
    assert other.activations[0][2] == sp.sin(other.activations[0][1])
    assert other.orders == base.orders and other.fields == base.fields


def test_derivation_reads_the_ir():
    """derive(IR) and derive(checked model) agree, and the derivation keeps the IR it was made from."""
    path = ROOT / "specs" / "two_layer_multi.dmft"
    model = check(parse(path.read_text(), str(path)))
    ir = lower(model)
    a, b = derive(ir), derive(model)
    assert a.ir is ir and a.saddles == ir.orders and a.fields == ir.fields
    assert (a.field_tangents, a.observable_tangents, a.past_terms) == (b.field_tangents, b.observable_tangents,
                                                                       b.past_terms)
