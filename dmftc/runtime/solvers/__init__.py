"""Causal linear solves: U block lower triangular in time (block back and forward substitution), the deep
action's Hessian blocks, and the bias of solving with a noisy Hessian."""
