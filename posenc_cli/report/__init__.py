"""Rendering: rich tables, plots, passkey/task tables and the published reference tables."""
