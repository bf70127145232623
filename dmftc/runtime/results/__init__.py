"""Results of a solve: the `Solution` class, its propagator blocks, labelled arrays and files, figures and
sweeps."""
