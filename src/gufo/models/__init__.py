"""Model architectures, one module each, selected by `general.architecture`."""
