"""Independent oracles for the tests: hand-written or autodiff solvers of particular networks and of the
derivatives the compiled pipeline computes in closed form.  Not on the user's path."""
