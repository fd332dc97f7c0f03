"""Runtime: KV cache slots, prefill, decode, sampling, token traces."""
