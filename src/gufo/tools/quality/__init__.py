"""Numerical checks: prefill-vs-decode validation and logit comparisons."""
