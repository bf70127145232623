"""dmftc.jax_setup: importing dmftc turns on 64-bit floats and JAX's persistent compilation cache in a private
per-user directory, so that a second process finds the programs the first one compiled; DMFTC_JAX_CACHE=0 turns
the cache off and JAX's own JAX_COMPILATION_CACHE_DIR wins.  Each case runs in a fresh interpreter (the settings
are made at import, before anything compiles)."""
import json
import os
import subprocess
import sys

PROBE = """
import json, sys, jax, jax.numpy as jnp, dmftc

def f(x):                       # unrolled: compiles for well over 0.1 s, so the cache keeps it
    for k in range(400):
        x = jnp.sin(x) * (1.0 + 1e-3 * k) + jnp.cos(x * x)
    return x

y = jax.jit(f)(jnp.arange(3.0))
print(json.dumps({"dir": None if dmftc.jax_cache_dir is None else str(dmftc.jax_cache_dir),
                  "jax_dir": jax.config.jax_compilation_cache_dir, "x64": bool(jax.config.jax_enable_x64),
                  "dtype": str(y.dtype)}))
"""


def _probe(**env):
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "DMFTC_JAX_CACHE")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=full, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _entries(path):
    """The cache entries of the probe's program f (other small programs may or may not pass the time threshold)."""
    return sorted(p for p in os.listdir(path) if p.startswith("jit_f-"))


def test_second_process_reuses_the_first_ones_compiled_programs(tmp_path):
    first = _probe(DMFTC_CACHE_DIR=str(tmp_path))
    assert first["dir"] == first["jax_dir"] and first["dir"].startswith(str(tmp_path))
    assert first["x64"] and first["dtype"] == "float64"
    assert os.stat(first["dir"]).st_mode & 0o777 == 0o700           # private: a compilation cache is trusted code
    stored = _entries(first["dir"])
    assert stored, "the first process stored nothing"
    second = _probe(DMFTC_CACHE_DIR=str(tmp_path))
    assert second["dir"] == first["dir"]
    assert _entries(second["dir"]) == stored                          # found, not compiled and stored again


def test_cache_can_be_turned_off_and_jax_own_setting_wins(tmp_path):
    off = _probe(DMFTC_CACHE_DIR=str(tmp_path / "a"), DMFTC_JAX_CACHE="0")
    assert off["dir"] is None and off["jax_dir"] is None and off["x64"]
    assert not (tmp_path / "a").exists()
    own = _probe(DMFTC_CACHE_DIR=str(tmp_path / "b"), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"))
    assert own["dir"] is None and own["jax_dir"] == str(tmp_path / "jax")
    assert not (tmp_path / "b").exists()


def test_make_room_drops_compiled_programs_only_when_crowded():
    """make_room (dmftc/jax_setup.py): below its fraction of vm.max_map_count nothing happens; above, JAX's
    compiled programs are dropped (the process's memory mappings fall) and a function still gives its result."""
    import jax
    import jax.numpy as jnp

    from dmftc import jax_setup

    maps = jax_setup.memory_maps()
    if maps is None:
        import pytest
        pytest.skip("no /proc/self/maps here")
    held, limit = maps
    assert 0 < held < limit and limit >= 1000
    fns = [jax.jit(lambda x, k=k: jnp.sin(x) * k + jnp.cos(x) ** (k % 4)) for k in range(40)]
    first = [float(f(jnp.arange(3.0 + k))[1]) for k, f in enumerate(fns)]
    before, count = jax_setup.memory_maps()[0], jax_setup.releases()
    assert not jax_setup.make_room(fraction=1.0) and jax_setup.releases() == count
    assert jax_setup.make_room(fraction=0.0) and jax_setup.releases() == count + 1
    after = jax_setup.memory_maps()[0]
    assert after < before - 100, (before, after)                       # 40 programs' mappings released
    again = range(0, 40, 8)                                            # a few recompiled: same values
    assert [float(fns[k](jnp.arange(3.0 + k))[1]) for k in again] == [first[k] for k in again]


def test_march_options_change_no_number():
    """The marches' compiler options (no YNNPACK fusions on the CPU: a speed setting) leave a march's results as
    they are: two_layer's saddle on 5000 paths (over the 4096 elements where XLA would use them)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dmftc
    from dmftc.jax_setup import march_options
    from dmftc.runtime.march.site_march import site_march

    opts = march_options()
    assert opts in ({}, {"xla_cpu_experimental_ynn_fusion_type": ""})
    if jax.default_backend() == "cpu" and tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 10):
        assert opts                                   # this jaxlib knows the option: it is used
    mod = dmftc.load("specs/two_layer.dmft").module
    S, T = 5000, 20
    rng = np.random.default_rng(0)
    normals = {n: jnp.asarray(rng.standard_normal(S)) for n in ("u", "u_star", "r")}
    p = {k: jnp.asarray(v, jnp.float64) for k, v in {"gamma": 1.0, "kx": 0.5, "y": 1.0, "eta": 0.1}.items()}
    wts = jnp.full(S, 1.0 / S)

    def saddle(nm, w, pj):
        return site_march(mod, (), 1, T, {}, w, pj, direct=True, width=0.0, normals=nm, sizes={})[1]

    plain = jax.jit(saddle)(normals, wts, p)
    ours = jax.jit(saddle, compiler_options=opts)(normals, wts, p)
    for k in plain:
        scale = float(jnp.abs(plain[k]).max())
        assert scale > 0 and float(jnp.abs(ours[k] - plain[k]).max()) <= 1e-13 * scale
