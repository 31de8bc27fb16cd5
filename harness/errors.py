"""The errors every layer raises: the bottom of the harness, importing none of it (the layer test,
tests/unit/test_layers.py)."""


class ConfigError(ValueError):
    """Bad input, reported as one line naming the value and what would be valid."""
