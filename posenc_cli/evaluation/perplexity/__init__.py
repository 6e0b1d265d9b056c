"""Perplexity at and beyond the training length (`posenc eval-extrapolate`).

Four protocols (the first two as in the ALiBi paper, Press et al. 2022, §4 and App. B, and HF's perplexity guide):

- nonoverlap: the held-out token stream is cut into windows of L tokens; every token of every window is scored.
- sliding (stride S): windows of L tokens advance by S; only the last S tokens of each window are scored, so every
  scored token sees at least L - S tokens of context. S = L is exactly the non-overlapping protocol.
- fixed-target (target N): the NoPE paper's protocol (Kazemnejad et al. 2023, App. F). The same N tokens are scored
  at every length L: each window ends with its N target tokens and holds L - N tokens of context before them, so
  only the context grows with L. Separates "more context helps" from "positions past the training length break
  the model", which non-overlapping windows mix. The targets are consecutive N-token blocks at the END of the
  validation stream (the only anchoring that needs no knowledge of the other lengths asked for); a length whose
  windows do not all fit, or that is shorter than N, is n/a. N defaults to the base length (the NoPE paper scored
  the last ≤ 200 tokens at L = 1024; N = L/5 would cost five times more forwards per scored token here).
- streaming (window W, sinks N, block S = stride, default 1): StreamingLLM's KV-cache decoding over streams of L
  tokens (the nonoverlap protocol's windows), each token seeing the stream's first N tokens and its W (to W+S-1)
  most recent ones, their K/V as first computed, at positions assigned inside that cache; exact semantics in
  `posenc_cli.evaluation.streaming`. W defaults to the base length - N - S + 1, so the cache's positions stay below
  the base length.

Metrics are token-weighted: ppl = exp(total NLL / scored tokens), bits per byte = total NLL / (ln 2 · UTF-8 bytes of
the scored tokens). Windows are always taken from the start of the validation stream, so every run with the same
tokenizer scores exactly the same tokens (paired numbers), and for the non-overlapping protocol every length scores
the same stretch of text.

The validation stream is the run's own validation split, or another corpus given as data overrides
(`corpus.data_config_with_overrides`): files named with `data=text 'data.paths=[held_out.txt]'` are scored whole (an
evaluation-only corpus), not split. A length with no window in the stream is "too_few_tokens", a state of its own
apart from "n/a" (the scheme cannot read that many tokens; `results` lists every state). A run trained with
randomized positions is fed per-window sorted draws from its range (`positions`), unless sequential ids are asked for.

The window protocols also measure LongPPL when an evaluator run is named (Fang et al. 2025: perplexity over the key
tokens, whose log-probability the evaluator's long context raises by more than α = 2 over its training-length context
and which stay above β = −2; `posenc_cli.evaluation.longppl`, `evaluator`): every run is scored on the evaluator's key
tokens, stored as `longppl`, `key_tokens` and `longppl_evaluator` beside the plain perplexity.

Results live in `eval/extrapolate.json` inside each run directory (`posenc_cli.evaluation.results` reads and writes
it); a new measurement replaces the entry with the same key (`entry_key`) and keeps the others.

The package, one idea per module: `planning` (lengths, windows, precision, the planned cells), `measuring` (the
forward passes and NLL sums of one length), `entries` (the typed entries, written and read back), `evaluator`
(LongPPL's evaluator run and its stored key sets) and `discovery` (runs found under directories, each evaluated in
turn). The registered task, one loaded run planned, measured or reused and stored, is
`posenc_cli.evaluation.tasks.extrapolate`. Import each name from its module: this package re-exports nothing.
"""
