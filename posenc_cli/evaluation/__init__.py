"""Evaluations of a run: perplexity by length, passkey and the RULER-style tasks (the task registry), their
shared per-cell loop and their results files."""
