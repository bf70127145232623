"""Where the test suite's time goes, test by test: a pytest plugin and its report.

    PYTHONPATH=$PWD:$PWD/benchmarks SUITE_PROFILE=/tmp/prof python -m pytest -p suite_profile tests/test_x.py
    python benchmarks/suite_profile.py /tmp/prof [TOP]

The plugin appends one JSON line per test to ``$SUITE_PROFILE.<worker>`` (one file per xdist worker): the test's
wall and CPU seconds (CPU: this process's threads, so comparable on a loaded machine), and JAX's compile events
during it: the number of XLA compilations and their seconds, tracing and lowering seconds, persistent-cache hits,
and each compiled program's name and seconds.  Programs a test compiles that another has already compiled (same
program, shapes and flags) are cache hits, so comparing two runs' counts shows which sizes tests could share.
Subprocesses the tests start (experiments/*.py --quick) are counted in wall and CPU of nobody but their own.
"""
import glob
import json
import os
import sys
import time

import pytest

_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/core/compile/jaxpr_trace_duration": "trace_s",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s"}
_acc = {"compile_n": 0, "compile_s": 0.0, "trace_s": 0.0, "lower_s": 0.0, "hits": 0}
_programs: list = []


def _duration(event, duration, **kw):
    key = _EVENTS.get(event)
    if key is None:
        return
    _acc[key] += duration
    if key == "compile_s":
        _acc["compile_n"] += 1
        _programs.append((str(kw.get("fun_name")), round(duration, 3)))


def _event(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        _acc["hits"] += 1


def pytest_configure(config):
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_duration)
    jax.monitoring.register_event_listener(_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, wall, cpu = dict(_acc), time.perf_counter(), time.process_time()
    _programs.clear()
    yield
    row = {"id": item.nodeid, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
           **{k: _acc[k] - before[k] for k in _acc}, "programs": list(_programs)}
    path = os.environ.get("SUITE_PROFILE", "suite_profile") + "." + os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def report(prefix: str, top: int = 30) -> str:
    rows = [json.loads(line) for path in glob.glob(prefix + ".*") for line in open(path)]
    rows.sort(key=lambda r: -r["cpu"])
    keys = ("wall", "cpu", "compile_n", "compile_s", "trace_s", "lower_s", "hits")
    total = {k: sum(r[k] for r in rows) for k in keys}
    out = [f"{len(rows)} tests: " + ", ".join(f"{k} {v:.1f}" for k, v in total.items())]
    files: dict = {}
    for r in rows:
        files[r["id"].split("::")[0]] = files.get(r["id"].split("::")[0], 0.0) + r["cpu"]
    out += [f"{cpu:8.1f} s CPU  {name}" for name, cpu in sorted(files.items(), key=lambda x: -x[1])[:top]]
    out += [f"{r['cpu']:7.1f} s CPU {r['wall']:7.1f} s wall {r['compile_n']:4d} programs {r['compile_s']:6.1f} s "
            f"compiling  {r['id']}" for r in rows[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
