"""Context extension of RoPE runs: `extend` (scaling methods, remaps, fine-tuning), LongRoPE's factor search,
and the same for transformers checkpoints."""
