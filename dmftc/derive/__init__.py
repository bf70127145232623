"""Stage 3: symbolic derivation with SymPy (saddle-point and sensitivity equations, Hessian blocks), the
activation and its distributional derivatives, and the text `dmftc derive` prints."""
