"""Independent oracles for the tests: hand-written or autodiff solvers of particular networks and of the
derivatives the compiled pipeline computes in closed form.  Not on the path of a spec or of the Python API's
standard network; the one exception is :mod:`structured_march`, which also marches a
:class:`dmftc.runtime.problem.deep_model.DeepModel` given in Python without a spec (it has no program of its own)."""
