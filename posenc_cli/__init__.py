"""posenc: train small language models that differ only in positional scheme, and test them long."""

__version__ = "0.1.0"
