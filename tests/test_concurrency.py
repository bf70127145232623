"""Compiling is safe under concurrency, and loading never runs a stale module.

* Two processes compile the same spec into the same directory at the same moment,
  round after round, while the test reads the target continuously: the module is
  never half-written (it always is one complete generated text that parses), it
  ends equal to ``generate(spec)``, and no temporary files are left behind.
* ``dmftc.load`` after an edit of the spec rebuilds the module and runs the new
  code, even when the rebuilt module has the same size and modification time as
  the old one (the case a ``.pyc`` cache cannot tell apart).
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import stat
import sys
import time
import traceback
from pathlib import Path

import pytest

import dmftc
from dmftc import build
from dmftc.compiler import compile_spec, generate, is_stale, output_path

# A fixed small spec (the shipped eos.dmft), so that edits of the shipped specs do not change these tests.
from spec_texts import EOS  # noqa: E402
ROUNDS = 20


def _variant(k: int) -> str:
    """Two spec texts with different hashes (so every round has a stale module to replace)."""
    return EOS + ("\n# variant b\n" if k % 2 else "")


def _worker(spec: str, out: str, rounds: int, barrier, results) -> None:
    try:
        for _ in range(rounds):
            barrier.wait(timeout=120)            # the spec of this round is written
            target, _ = compile_spec(spec, out)  # both workers race on the same target
            results.put(("done", str(target)))
            barrier.wait(timeout=120)            # the round has been checked
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put(("error", traceback.format_exc()))


def _assert_complete(text: str, allowed: set[str]) -> None:
    assert text in allowed, f"half-written or foreign module ({len(text)} characters)"
    compile(text, "generated module", "exec")


def test_two_processes_compiling_the_same_spec_never_corrupt_the_module(tmp_path):
    spec, out = tmp_path / "race.dmft", tmp_path / "out"
    target = output_path(spec, out)
    expected = []
    for k in range(2):
        spec.write_text(_variant(k))
        expected.append(generate(spec))
    assert expected[0] != expected[1]
    ctx = mp.get_context("spawn")  # no fork of a process that may have started JAX threads
    barrier, results = ctx.Barrier(3), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(str(spec), str(out), ROUNDS, barrier, results)) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        reads = 0
        for r in range(ROUNDS):
            spec.write_text(_variant(r))
            barrier.wait(timeout=120)
            done, deadline = 0, time.monotonic() + 120
            while done < 2:  # read the target as fast as possible while both workers write it
                if target.exists():
                    _assert_complete(target.read_text(), set(expected))
                    reads += 1
                try:
                    kind, payload = results.get_nowait()
                except queue.Empty:
                    assert time.monotonic() < deadline, "a worker did not finish its round"
                    continue
                assert kind == "done", payload
                assert Path(payload) == target
                done += 1
            assert target.read_text() == expected[r % 2]
            leftovers = sorted(p.name for p in out.iterdir() if p != target)
            assert leftovers == [], f"round {r}: temporary files left behind: {leftovers}"
            barrier.wait(timeout=120)
        assert reads >= ROUNDS
    finally:
        barrier.abort()  # release the workers at once if a check failed
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.kill()
    assert all(w.exitcode == 0 for w in workers)
    assert not is_stale(spec, out)
    assert sorted(p.name for p in out.iterdir()) == [target.name]


def test_generated_module_has_a_normal_file_mode(tmp_path):
    spec = tmp_path / "m.dmft"
    spec.write_text(EOS)
    target, changed = compile_spec(spec, tmp_path / "out")
    assert changed
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_load_rebuilds_a_module_generated_from_another_spec_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # let the import system cache bytecode, as by default
    spec, out = tmp_path / "m.dmft", tmp_path / "out"
    spec.write_text(EOS)
    m1 = dmftc.load(spec, out)
    target = output_path(spec, out)
    assert m1.module.SPEC_SHA256 == _sha(spec)
    old_text, old_mtime = target.read_text(), target.stat().st_mtime_ns

    # an edit of the same length: the regenerated module has the same size as the old one
    default = m1.parameters["y"]
    assert "param y = 1.0" in EOS and default == 1.0
    spec.write_text(EOS.replace("param y = 1.0", "param y = 2.0"))
    assert is_stale(spec, out)

    real_write = build.atomic_write

    def write_within_the_same_second(path, text):  # what a fast edit-and-reload loop produces
        changed = real_write(path, text)
        os.utime(path, ns=(old_mtime, old_mtime))
        return changed

    monkeypatch.setattr(build, "atomic_write", write_within_the_same_second)
    m2 = dmftc.load(spec, out)
    new_text = target.read_text()
    assert new_text != old_text and len(new_text) == len(old_text)
    assert target.stat().st_mtime_ns == old_mtime
    assert m2.module.SPEC_SHA256 == _sha(spec) != m1.module.SPEC_SHA256
    assert m2.parameters["y"] == 2.0
    assert not is_stale(spec, out)


def test_load_rebuilds_after_an_edit_that_changes_the_module(tmp_path):
    spec, out = tmp_path / "m.dmft", tmp_path / "out"
    spec.write_text(EOS)
    dmftc.load(spec, out)
    spec.write_text(EOS.replace("param y = 1.0", "param y = 0.25") + "\n# edited\n")
    m = dmftc.load(spec, out)
    assert m.module.SPEC_SHA256 == _sha(spec)
    assert m.parameters["y"] == 0.25
    assert output_path(spec, out).read_text() == generate(spec)
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("content", ["# my own module\nx = 1\n", ""])
def test_compile_refuses_to_overwrite_a_file_it_did_not_generate(tmp_path, content):
    spec, out = tmp_path / "m.dmft", tmp_path / "out"
    spec.write_text(EOS)
    out.mkdir()
    target = output_path(spec, out)
    target.write_text(content)
    with pytest.raises(dmftc.DmftcError, match="not generated by dmftc"):
        compile_spec(spec, out)
    assert target.read_text() == content
    assert sorted(p.name for p in out.iterdir()) == ["m.py"]
