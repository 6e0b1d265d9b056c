"""Data: the token cache and batching, tokenizers, the corpus sources and the RULER-style episode generators."""
