"""The time-to-accuracy benchmark's machinery (benchmarks/bench_time_to_accuracy.py): its arithmetic on synthetic
numbers, and that the script runs end to end at tiny sizes.  No timings are asserted."""
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_time_to_accuracy.py"
spec = importlib.util.spec_from_file_location("bench_time_to_accuracy", PATH)
tta = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tta          # dataclasses look their module up
spec.loader.exec_module(tta)


def curves(nvar, se):
    return tta.Curves({k: np.asarray(v, float) for k, v in nvar.items()},
                      {k: np.asarray(v, float) for k, v in se.items()})


def test_accuracy_is_the_worst_relative_error_over_curves_and_times():
    c = curves({"a": [0.0, 2.0, -4.0], "b": [1.0, 0.5, 0.2]}, {"a": [0.0, 0.04, 0.02], "b": [0.01, 0.03, 0.0]})
    assert tta.peaks(c) == {"a": 4.0, "b": 1.0}
    assert tta.accuracy(c, tta.peaks(c)) == pytest.approx(0.03)           # b: 0.03 / 1, a: 0.04 / 4 = 0.01
    assert tta.accuracy(c, {"a": 2.0, "b": 10.0}) == pytest.approx(0.02)  # against other peaks


def test_monte_carlo_time_scales_as_the_inverse_square_of_the_error():
    assert tta.time_to(10.0, 0.04, 0.02) == pytest.approx(40.0)
    assert tta.time_to(10.0, 0.04, 0.005) == pytest.approx(640.0)
    assert tta.time_to(10.0, 0.01, 0.02) == pytest.approx(2.5)
    # only the scaled part grows: 4 s fixed + 6 s * 4
    assert tta.time_to(10.0, 0.04, 0.02, scaled=6.0) == pytest.approx(28.0)


def test_max_z():
    a = curves({"x": [0.0, 1.0, 2.0]}, {"x": [0.0, 0.3, 0.1]})
    b = curves({"x": [0.0, 1.5, 2.0], "y": [5.0]}, {"x": [0.0, 0.4, 0.1], "y": [1.0]})
    assert tta.max_z(a, b) == pytest.approx(1.0)          # (1.5 - 1) / 0.5; t = 0 (both errors 0) ignored
    c = curves({"x": [0.1, 1.0, 2.0]}, {"x": [0.0, 0.3, 0.1]})
    assert tta.max_z(c, b) == math.inf                    # differ where neither has an error


def synthetic_pilots(shift=0.0):
    t = np.linspace(0, 1, 5)
    truth = {"D": np.array([1.0, 1.5, 2.0, 1.5, 1.0]), "K": 2.0 * t}     # peaks 2 and 2
    ens = tta.Pilot("ensembles", "E", math.nan, 10.0,
                    curves(truth, {k: 0.04 * np.ones(5) * 2.0 for k in truth}))     # 4% of the peak
    mc = tta.Pilot("dmftc mc", "S", 3.0, 1.0, curves({k: v + shift for k, v in truth.items()},
                                                    {k: 0.02 * np.ones(5) * 2.0 for k in truth}))  # 2%
    lv = [(f"{n}^3", s, curves(truth, {k: a * 2.0 * np.ones(5) for k in truth}))
          for n, s, a in ((4, 0.5, 0.03), (6, 0.8, 0.01), (8, 1.5, 0.003))]
    cub = tta.Pilot("dmftc cubature", "4^3", 2.0, 0.5, lv[0][2], levels=tuple(lv))
    return [mc, cub, ens]


def test_table_arithmetic_on_synthetic_pilots():
    rows = {r["method"]: r for r in tta.table(synthetic_pilots(), [0.02, 0.005])}
    ens, mc, cub = rows["ensembles"], rows["dmftc mc"], rows["dmftc cubature"]
    assert ens["accuracy"] == pytest.approx(0.04) and mc["accuracy"] == pytest.approx(0.02)
    assert ens["to"][0.02][0] == pytest.approx(40.0) and ens["to"][0.005][0] == pytest.approx(640.0)
    assert mc["to"][0.02][0] == pytest.approx(1.0) and mc["to"][0.005][0] == pytest.approx(16.0)
    assert mc["ratio"][0.02] == pytest.approx(40.0) and mc["ratio"][0.005] == pytest.approx(40.0)
    # cubature: the measured time of running the levels until one is below the target; the pilot is the first
    assert cub["accuracy"] == pytest.approx(0.03)
    assert cub["to"][0.02][0] == pytest.approx(0.5 + 0.8) and "4^3 to 6^3" in cub["to"][0.02][1]
    assert cub["to"][0.005][0] == pytest.approx(0.5 + 0.8 + 1.5) and "to 8^3" in cub["to"][0.005][1]
    assert cub["ratio"][0.02] == pytest.approx(40.0 / 1.3)
    assert mc["z"] == pytest.approx(0.0) and cub["z"] == pytest.approx(0.0)
    out = tta.show(list(rows.values()), [0.02, 0.005])
    assert "agreement" in out and "DISAGREE" not in out
    assert math.isnan(tta.table(synthetic_pilots(), [0.001])[1]["to"][0.001][0])     # cubature: not reached


def test_a_fast_wrong_answer_is_flagged():
    rows = tta.table(synthetic_pilots(shift=0.5), [0.02])
    mc = next(r for r in rows if r["method"] == "dmftc mc")
    assert mc["z"] == pytest.approx(0.5 / np.hypot(0.04, 0.08))
    assert "DISAGREE (max z > 4.5): dmftc mc" in tta.show(rows, [0.02])


def test_the_two_layer_case_runs(capsys):
    rows = tta.main(["--kind", "two_layer", "--T", "6", "--samples", "200", "--nodes", "4", "5",
                     "--N", "8", "--E", "16", "--targets", "0.5"])
    assert [r["method"] for r in rows] == ["dmftc mc", "dmftc cubature", "ensembles"]
    assert all(np.isfinite(r["accuracy"]) and r["seconds"] >= 0 for r in rows)
    assert all(np.isfinite(r["z"]) for r in rows[:2])
    out = capsys.readouterr().out
    assert "time to accuracy: two_layer.dmft, T = 6" in out and "load average" in out


@pytest.mark.slow
def test_the_deep_case_runs(capsys):
    rows = tta.main(["--kind", "deep", "--T", "4", "--samples", "400", "--paths", "64", "--groups", "4",
                     "--N", "8", "--E", "16", "--targets", "0.5"])
    assert [r["method"] for r in rows] == ["dmftc mc propagator", "ensembles"]
    assert np.isfinite(rows[0]["z"]) and all(np.isfinite(r["accuracy"]) for r in rows)
