"""Ground truth: ensembles of finite-width networks trained by gradient descent, mapped onto the specs'
order parameters."""
