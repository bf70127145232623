"""Monte Carlo paths sharded over JAX devices (the solve option ``devices``, dmftc.runtime.numerics.devices).

JAX fixes its device count when it is imported, so the check runs in a subprocess with XLA_FLAGS asking the
host platform for 4 devices: the two-layer solve with devices=4 equals the one-device solve on the same draws
(to round-off: the sums over paths are reduced across devices in another order), and its normals really are
laid out over 4 devices."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmftc.errors import ParameterError
from dmftc.runtime.problem.options import SolveOptions

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np
import jax
from dmftc.compiler import load

assert len(jax.devices()) == 4, jax.devices()
m = load(sys.argv[1])
kw = dict(T=8, samples=4096, groups=8, seed=3, correction=True)
one = m.solve(**kw)
four = m.solve(devices=4, **kw)
every = m.solve(devices="all", **dict(kw, samples=4090))    # groups of 511 / 512 paths: padded to 512
# the march compiled for paths laid out over the devices reduces across them (all-reduce), gathering nothing
import jax.numpy as jnp
from dmftc.runtime.numerics.devices import path_mesh, place_paths
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.engines.site_engine import normals_of
from dmftc.runtime.march.site_march import site_march
from dmftc.runtime.engines.site_solve import sample_draws
mod = m.module
p, sz, T = resolve_params(mod, {"T": 8}, dirac_width=0.1)
nm, w = place_paths((normals_of(mod, sample_draws(mod, p, sz, 512, 0)), jnp.full(512, 1 / 512)), path_mesh(4))
pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
march = jax.jit(lambda nm, w, pj: site_march(mod, (), 1, T, {}, w, pj, direct=True, width=0.1, normals=nm,
                                             sizes=dict(sz))[1])
hlo = march.lower(nm, w, pj).compile().as_text()
rel = lambda a, b: float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))
out = {"mean": max(rel(four.mean(n), one.mean(n)) for n in one.names),
       "var": max(rel(four.var(n), one.var(n)) for n in one.names),
       "var_se": max(rel(four.var_stderr(n), one.var_stderr(n)) for n in one.names),
       "m1": max(rel(four.mean_correction(n), one.mean_correction(n)) for n in one.names),
       "devices": four.info["devices"], "devices_all": every.info["devices"],
       "one_has_devices": "devices" in one.info,
       "all_reduce": hlo.count("all-reduce"), "all_gather": hlo.count("all-gather"),
       "finite_all": bool(all(np.isfinite(every.var(n)).all() for n in every.names))}
print("RESULT " + json.dumps(out))
"""


def test_two_layer_paths_sharded_over_four_devices_agree_with_one():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "specs" / "two_layer.dmft")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert out["mean"] < 1e-10 and out["var"] < 1e-10 and out["var_se"] < 1e-8 and out["m1"] < 1e-10, out
    assert out["devices"]["count"] == 4 and out["devices"]["normals_sharded_over"] == 4, out
    assert out["devices_all"]["normals_sharded_over"] == 4 and out["finite_all"], out
    assert not out["one_has_devices"]
    assert out["all_reduce"] > 0 and out["all_gather"] == 0, out                 # data-parallel: no gathering


def test_devices_option_checked():
    for bad in (0, -1, "some", 1.5, True):
        with pytest.raises(ParameterError, match="devices"):
            SolveOptions(devices=bad)
    assert SolveOptions(devices="all").devices == "all"
    with pytest.raises(ParameterError, match="two-layer specs only"):
        SolveOptions(devices=2).for_kind("deep")


def test_more_devices_than_visible_is_a_clear_error():
    from dmftc.runtime.numerics.devices import path_mesh
    import jax

    assert path_mesh(None) is None and path_mesh(1) is None
    with pytest.raises(ParameterError, match="xla_force_host_platform_device_count"):
        path_mesh(len(jax.devices()) + 1)
