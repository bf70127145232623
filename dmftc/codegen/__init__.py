"""Stages 4-5: array layout and the printers of the generated JAX modules."""
