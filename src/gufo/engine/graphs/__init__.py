"""Decode-step and prefill-chunk CUDA graphs."""
