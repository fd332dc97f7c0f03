"""Architecture modules: one file per GGUF `general.architecture`."""
