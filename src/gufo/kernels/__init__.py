"""Compute kernels chosen by a registry keyed by (backend, op, qtype)."""
