"""Sensitivities of the march's averages: the columns of dF/dq (tangents, transfer matrices) of two-layer
programs, and the per-path derivatives of a deep layer's ln Z_l summed over paths."""
