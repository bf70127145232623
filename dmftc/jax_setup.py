"""JAX settings every numerical module of dmftc relies on, applied once when dmftc is imported (before anything is
compiled):

* 64-bit floats (``jax_enable_x64``): the saddle-point marches and the propagator's solves need them;
* a persistent compilation cache, so that another process solving the same spec (a second ``dmftc run``, a
  parameter sweep in fresh processes, the test suite's workers) loads the compiled kernels instead of compiling
  them again (``dmftc run specs/two_layer.dmft -q`` on 2 cores: 9.2 s without the cache, 6.7 s when it holds the
  kernels of an earlier run).  JAX keys each entry by the program, its shapes, the backend and the JAX
  version, so an entry is only ever reused for the same computation: the cache changes no result.

Where: ``$JAX_COMPILATION_CACHE_DIR`` when set (JAX's own setting wins); else ``$DMFTC_CACHE_DIR/jax-<machine>``,
``$XDG_CACHE_HOME/dmftc/jax-<machine>`` or ``~/.cache/dmftc/jax-<machine>``, created private to the user (a
compilation cache is trusted code: never point it at a directory others can write).  ``DMFTC_JAX_CACHE=0`` turns
it off; if the directory cannot be created, dmftc runs without it.  Programs that compile in under 0.1 s are not
cached.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

import jax

MIN_COMPILE_SECONDS = 0.1


def cache_dir() -> Path | None:
    """The directory dmftc gives JAX's compilation cache (None: off, or left to JAX's own setting)."""
    if os.environ.get("DMFTC_JAX_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    base = os.environ.get("DMFTC_CACHE_DIR")
    if base:
        root = Path(base)
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dmftc"
    return root / f"jax-{platform.machine() or 'unknown'}"


def configure() -> Path | None:
    """Apply the settings (idempotent); returns the cache directory in use by dmftc's choice, else None."""
    jax.config.update("jax_enable_x64", True)
    path = cache_dir()
    if path is None:
        return None
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    return path


CACHE_DIR = configure()
