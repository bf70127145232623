"""The deep march read from the spec's IR (dmftc.runtime.march.site_march) against the structured march of
dmftc.reference.structured_march (the spec's couplings in a fixed h / z / g template), on the same source paths.

Both are the exact saddle of the Monte Carlo action of the paths (direct readout), so they agree to round-off.
The march amplifies round-off exponentially once the kernels become nearly singular (a relative change of
1e-15 in the sources moves the template's own responses by 4e-5 at T = 30, L = 2, 4000 paths), so the
comparison is at T <= 8 (measured differences 4e-12 to 4e-11 of each peak, asserted 1e-9; single paths 1e-9,
asserted 1e-8).  The oracle is called explicitly: the solve path's own march (deep_dmft.compiled_march) is the site
march for every compiled spec."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from models import structured
from dmftc.errors import ParameterError
from dmftc.reference.structured_march import TemplateKernels, structured_paths
from dmftc.runtime.march.deep_dmft import SpecKernels
from dmftc.runtime.engines.deep_spec import resolve_deep_params
from dmftc.runtime.march.site_march import schedule, site_march

ROOT = Path(__file__).resolve().parent.parent
TANH = (ROOT / "specs" / "deep_tanh.dmft").read_text()
VARIANTS = {
    "deep_tanh": (TANH, dict(L=2, T=8, gamma=1.3, eta=0.1)),
    # not the standard network: the z coupling carries 2 gamma, and the activation is one dmftc never names
    "other_action": (TANH.replace("+ gamma * integral(Delta(s) G[l+1](t, s) phi(h[l](s)), s < t)",
                                  "+ 2 * gamma * integral(Delta(s) G[l+1](t, s) phi(h[l](s)), s < t)")
                     .replace("activation phi(h) = tanh(h)", "activation phi(h) = sin(h) + 0.3 * h"),
                     dict(L=3, T=7, gamma=0.8, y=-0.6, eta=0.12)),
    "deep_linear": ((ROOT / "specs" / "deep_linear.dmft").read_text(), dict(L=2, T=8, gamma=1.1, eta=0.1)),
}


def _both(name, tmp_path, S=256, seed=0, direct=True):
    text, given = VARIANTS[name]
    spec = tmp_path / f"{name}.dmft"
    spec.write_text(text)
    mod = dmftc.load(spec, tmp_path / "gen").module
    p, L, T = resolve_deep_params(mod, given)
    xiu, xir = np.random.default_rng(seed).standard_normal((2, L, S, T))
    prm = dict(p, **{"dirac width": 0.1})
    # the oracle: the structured march of the spec's h / z / g template (direct: the readout as a plain mean over
    # the paths, as each propagator group's saddle; else by Stein's lemma, as the means)
    ref = structured_paths(TemplateKernels(mod), prm, xiu, xir, direct=direct)
    pj = {k: jnp.asarray(float(v)) for k, v in p.items()}
    act = [lambda x, k=k: mod.activation(x, pj, 0.1)[k] for k in range(3)]
    u, r = (n for n, _, _ in sorted(mod.SITE["sources"], key=lambda x: x[2]))     # offsets -1, +1
    rows, q1, hist, avg, _ = site_march(mod, act, L, T, {u: jnp.asarray(xiu), r: jnp.asarray(xir)},
                                        jnp.full(S, 1 / S), pj, direct=direct)
    return mod, L, ref, rows, q1, hist, avg


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "stein"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_site_march_equals_the_structured_march(name, direct, tmp_path):
    """Kernels, responses, the error signal and (direct readout) every path; with the Stein readout the readout
    average itself (the structured march's 'f', from its derived formula) and the direct one ('fdir')."""
    mod, L, ref, rows, q1, hist, avg = _both(name, tmp_path, direct=direct)
    roles = mod.ROLES
    for mine, theirs in (("Phi", "Phi"), ("G", "G"), ("A", "Rphi"), ("B", "Rg")):
        for l in range(1, L + 1):
            a, b = np.asarray(rows[(roles[mine], l)]), ref[theirs][l - 1]
            assert np.abs(b).max() > 1e-3, (mine, l)                       # every quantity is exercised
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-9 * np.abs(b).max(), err_msg=f"{mine}[{l}]")
    np.testing.assert_allclose(np.asarray(q1[mod.ERROR_SIGNAL]), ref["Delta"], rtol=0, atol=1e-9)
    (sym,) = [k[1] for k in avg if k[0] == "stein"]
    np.testing.assert_allclose(np.asarray(avg[("direct", sym)]), ref["fdir"], rtol=0, atol=1e-9)
    if direct:
        for f, key in ((roles["h"], "h"), (roles["z"], "z")):
            for l in range(1, L + 1):
                np.testing.assert_allclose(np.asarray(hist[(f, l)]), ref[key][l - 1], rtol=0, atol=1e-8)
    else:
        np.testing.assert_allclose(np.asarray(avg[("stein", sym)]), ref["f"], rtol=0, atol=1e-9)
        assert np.abs(ref["f"] - ref["fdir"]).max() > 1e-6           # the two estimators differ on these paths


def test_schedule_orders_one_step_by_its_same_time_reads(tmp_path):
    """Per step: layer l's forward field after the kernel of layer l-1 (its source's covariance row t); the
    backward field after layer l+1's kernel and response rows; the error signal last (not a node)."""
    spec = tmp_path / "t.dmft"
    spec.write_text(TANH)
    mod = dmftc.load(spec, tmp_path / "gen").module
    order = schedule(mod.SITE, 3, mod.LAYER, mod.DEPTH)
    at = {n: k for k, n in enumerate(order)}
    for l in (2, 3):
        assert at[("row", "Phi", l - 1)] < at[("source", "u", l)] < at[("field", "h", l)]
    for l in (1, 2):
        assert at[("row", "G", l + 1)] < at[("source", "r", l)] < at[("field", "z", l)]
        assert at[("row", "B", l + 1)] < at[("field", "z", l)]
    assert all(at[("field", "h", l)] < at[("field", "g", l)] for l in (1, 2, 3))


def test_derive_prints_what_the_march_runs():
    """`dmftc derive` on a deep spec shows the merged field equations, their same-time reads and the readout's
    Stein plan, which the generated module carries (SITE)."""
    from dmftc.compiler import front_end
    from dmftc.derive.report import format_derivation

    text = format_derivation(front_end(ROOT / "specs" / "deep_tanh.dmft")[1])
    march = text[text.index("the saddle-point march"):]
    assert "tangents over time for h, g" in march
    z = march[march.index("z[l](t) ="):]
    assert "[s<t]*eta*gamma*Delta(s)*G[l+1](t, s) + B[l+1](t, s)" in z.splitlines()[0]
    assert {"B[l+1]", "G[l+1]", "r[l]", "h[l]"} <= set(z.splitlines()[1].split("after:")[1].replace(",", " ").split())
    assert "E_1 by Stein's lemma" in march and "Y = dX/dz(t) = phi(h[L](t))" in march and "E_2 = E_1 at t = 0" in march
    mod = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").module
    assert mod.SITE["history"] == ("h", "g") and mod.SITE["stein"] == (("E_1", "z", "r"),)


def test_solution_says_which_march_gave_its_means():
    """A compiled deep spec's Monte Carlo means come from its own program, and so do the Python API's (the standard
    network is a compiled spec); only a DeepModel given without a spec runs the reference structured march."""
    from dmftc.deep import solve_deep
    from dmftc.reference.standard_model import standard

    kw = dict(L=1, T=4, samples=64, groups=2)
    assert "site_march" in dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(**kw).info["march"]
    assert "site_march" in solve_deep(activation="sin(h)", gamma=1.0, y=1.0, eta=0.05, **kw).info["march"]
    model = standard(gamma=1.0, y=1.0, eta=0.05)
    assert "structured" in solve_deep(activation="tanh", model=model, **kw).info["march"]


@pytest.mark.parametrize("name", ["deep_tanh", "other_action"])
def test_propagator_groups_march_the_spec_program(name, tmp_path):
    """A compiled spec's propagator groups take their saddle (and the paths ln Z_l is estimated on) from the
    spec's own program; on the same paths the propagator equals the one built on the reference structured march
    (the saddle is stationary in both: the Monte Carlo action's gradient vanishes to round-off).  A model the
    runtime has no program for is refused."""
    import dataclasses

    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.engines.deep_propagator import group_propagator

    text, given = VARIANTS[name]
    spec = tmp_path / f"{name}.dmft"
    spec.write_text(text)
    mod = dmftc.load(spec, tmp_path / "gen").module
    p, L, T = resolve_deep_params(mod, dict(given, T=5))
    model = from_spec(mod, p)
    act = SpecKernels(mod).site_activation(p, 0.1)
    xiu, xir = np.random.default_rng(3).standard_normal((2, L, 128, T))
    site = group_propagator(activation=act, L=L, T=T, xiu=xiu, xir=xir, model=model)
    ref = group_propagator(activation=act, L=L, T=T, xiu=xiu, xir=xir,
                           model=dataclasses.replace(model, module=None, march=structured))
    assert site.diagnostics["march"] == "site program" and ref.diagnostics["march"] == "structured"
    assert site.diagnostics["stationarity"] < 1e-12
    for a in site.sigma:
        x, y = np.diag(site.sigma[a][a]), np.diag(ref.sigma[a][a])
        assert np.max(np.abs(x - y)) <= 1e-9 * np.max(np.abs(y)), a
    # another activation than the spec's has no program in the runtime (the structured march is a test oracle)
    with pytest.raises(ParameterError, match="no single-site program to march: the activation .* is not that of"):
        group_propagator(activation="tanh", L=L, T=T, xiu=xiu, xir=xir, model=model)
    with pytest.raises(ParameterError, match="not compiled from a spec"):
        group_propagator(activation=act, L=L, T=T, xiu=xiu, xir=xir, model=dataclasses.replace(model, module=None))


def test_sums_read_path_factors_kept_once_per_step():
    """A field's causal sums read their path factors at s (phi(h[l](s)), g[l](s)) as quantities of their own,
    computed once per step with their tangents, not re-evaluated over the fields' histories; each factor is
    computed after the fields it reads and before a field that reads it at the same time."""
    import inspect

    mod = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").module
    assert mod.SITE["terms"] == ("g[l](s)", "phi(h[l](s))")
    for name in ("h", "z"):
        code = inspect.getsource(getattr(mod, f"site_field_{name}"))
        body = code.split("\n", 2)[2]                          # after the def line and the one-line docstring
        assert "E.term(" in body and "E.field(" not in body, code   # (h and z read no field at t either)
    order = schedule(mod.SITE, 2, mod.LAYER, mod.DEPTH)
    at = {n: k for k, n in enumerate(order)}
    for l in (1, 2):
        assert at[("field", "h", l)] < at[("term", "phi(h[l](s))", l)] < at[("field", "z", l)]
        assert at[("field", "g", l)] < at[("term", "g[l](s)", l)]
