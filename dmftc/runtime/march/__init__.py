"""The single-site march: a spec's own generated program run forward in time over Monte Carlo paths, what it
reads at each step, and the loop over groups of paths."""
