"""What a solve is about, as the numerics read it: a compiled spec's model and activation, its parameters and
options, the deep action's variables and the standard network of the Python API."""
