"""GGUF files: locating, reading, validating."""
