"""Command-line interface: one module per command, argument parsing only."""
