"""`gufo bench` and `gufo compare`: llama-bench semantics, reports, and A/B tables."""
