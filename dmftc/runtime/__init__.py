"""The runtime: the causal march, tangents, propagators and solutions of compiled specs (two-layer and deep)."""
