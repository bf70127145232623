"""The engines: the saddle point, propagator, exact backend and O(1/N) correction of two-layer specs, the deep
propagator and its variants (linear, several points), and the cubature backend."""
