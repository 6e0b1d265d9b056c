"""Context extension of RoPE runs: `plan` (a request as Scale | Remap | SearchThenScale, and `execute`), `extend`
(frequency scaling and its fine-tune), `remap` (Self-Extend, ReRoPE), `longrope_search` (LongRoPE's factor search),
`child_run` (the output directory and the child committed into it), `hf_extend` (the same for transformers
checkpoints), `limits` and `identity` (the factor range, and what differs from an existing child), `settings` (the
settings' checks and the parent's that need no checkpoint: no torch), `calibrate` (a run's evaluation temperature
fitted into a child) with `calibrate_settings` (its settings and the checks that need no checkpoint: no torch)."""
