"""Numerical helpers every engine shares: the functions generated code calls (`kernels`), the march's
numerics, the geometry of the points, quadrature rules, source paths (random and Sobol') and devices."""
