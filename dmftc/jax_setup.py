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

Compiled programs also live in memory, and on the CPU each one holds memory mappings of its machine code (4-6
for a small program here, far more for the marches).  JAX keeps every program it compiled for the life of the
process, so a long process that compiles many (the test suite's workers, a sweep over sizes) reaches Linux's
``vm.max_map_count`` (65530 by default); the next compilation's mapping then fails and XLA dies with a
segmentation fault (on 2026-11-28, three CI runs lost a worker this way, each in a compilation or a cache write
late in the worker's life; ``tests/test_solve.py`` alone, 32 tests in one process, reaches about 6100
mappings).  :func:`make_room`, called at the entry of every solve, drops JAX's compiled programs when the process
holds over half the limit; they are compiled again when next used, with the same results.

The site marches are compiled with :func:`march_options`: on the CPU, without XLA's YNNPACK fusions, which XLA
(jaxlib 0.10) uses for element-wise work on arrays of 4096 elements or more and which cost a fixed overhead per
call in a march's loop (two_layer's saddle march, T = 250: 1250 paths 3 ms, 4096 paths 86 ms, 12500 paths
0.26 s; without them 6 ms and 24 ms).  Programs that run long against their compilation (the validation ensembles'
training loops, the deep propagator's per-path sums over many paths of a long system) ask for XLA's default
optimisation with :func:`long_run_options`, even where ``XLA_FLAGS`` lowers it.
"""
from __future__ import annotations

import functools
import gc
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


MAP_FRACTION = 0.5          # make_room drops compiled programs above this fraction of vm.max_map_count
_ROOM = {"releases": 0}


def memory_maps() -> tuple[int, int] | None:
    """(memory mappings this process holds, the system's limit vm.max_map_count); None where Linux's /proc does
    not tell."""
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            limit = int(fh.read())
        with open("/proc/self/maps", "rb") as fh:
            held = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except (OSError, ValueError):
        return None
    return held, limit


def make_room(fraction: float = MAP_FRACTION) -> bool:
    """Drop every program JAX has compiled in this process (``jax.clear_caches``) when the process holds more than
    ``fraction`` of the memory mappings the system allows (module doc); True if it did.  Programs are compiled
    again on their next use; no result changes."""
    maps = memory_maps()
    if maps is None or maps[0] <= fraction * maps[1]:
        return False
    jax.clear_caches()
    gc.collect()
    _ROOM["releases"] += 1
    return True


# Python's cyclic garbage collector runs a young-generation pass every 700 net allocations by default.  Tracing a
# JAX program allocates tens of thousands of short-lived objects, so those passes (and the older generations' they
# trigger, over a heap as large as JAX's) took 20-40% of the tracing time: a deep_multi solve with its
# propagator (T = 4, a fresh process) traced in 1.83-2.08 s of CPU, and in 1.49-1.52 s at a threshold of 20000
# (1.38-1.46 s with the collector off).
GC_THRESHOLD = (20_000, 10, 10)


def fewer_collections() -> None:
    """Raise the garbage collector's young-generation threshold to ``GC_THRESHOLD`` (see the comment there): for
    processes that trace many programs and own their interpreter (the command line, the test suite).  Importing
    dmftc leaves the collector of a user's own process alone.  Nothing is freed later than at the next pass; no
    result changes."""
    gc.set_threshold(*GC_THRESHOLD)


def releases() -> int:
    """How many times :func:`make_room` dropped the compiled programs in this process."""
    return _ROOM["releases"]


_NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.lru_cache(maxsize=None)
def march_options() -> dict:
    """Compiler options for the jitted marches (module doc): XLA's YNNPACK fusions off on the CPU where this
    jaxlib knows the option, else none (an accelerator, or a jaxlib that predates YNNPACK)."""
    if jax.default_backend() != "cpu":
        return {}
    try:
        jax.jit(lambda x: x + 1.0, compiler_options=_NO_YNN)(1.0)
    except Exception:             # an unknown option: this jaxlib has no YNNPACK fusions to turn off
        return {}
    return dict(_NO_YNN)


_OPTIMISED = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False}


def long_run_options() -> dict:
    """Compiler options for a program that runs long against its compilation (the validation ensembles' training
    loops): XLA's own default optimisation (backend level 3, LLVM's expensive passes on), whatever ``XLA_FLAGS``
    asks.  The test suite lowers both for its many short programs (tests/conftest.py); the optax ensembles of
    tests/test_deep_sgd_spec.py (16000 networks, 8 steps) then trained in 11.8 s instead of 4.5 s."""
    return dict(_OPTIMISED)
