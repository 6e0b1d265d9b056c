"""lm-evaluation-harness over posenc's own model: `PosencLM`, lm-eval's model "posenc".

Importing this module registers the model with lm-eval (`lm_eval.api.registry.register_model`); lm-eval 0.4 looks
models up only in its own registry, which no entry point or flag of its own fills from outside the package
(EleutherAI/lm-evaluation-harness issues #1457 and #1621), so `posenc-lm-eval` (`posenc_cli.cli.lm_eval`) is
lm-eval's command line with this module imported first::

    posenc-lm-eval --model posenc --model_args run=runs/alibi,max_length=512 --tasks my_task --include_path tasks/

    import lm_eval, posenc_cli.api.lm_eval_model  # registers "posenc"
    lm_eval.simple_evaluate(model="posenc", model_args={"run": "runs/alibi"}, tasks=[...])

The run is loaded as `eval-extrapolate` loads it (`run.load.load_run`, or `run.hf_run.load_hf_run` for a
`transformers` directory), so every scheme, per-layer layout and extended run is scored by its own forward:

- loglikelihood: each request's context and continuation are one forward of exactly their tokens (no padding: a
  length-dependent scheme, such as a cell temperature or dynamic RoPE scaling, would read a padded length), batched
  only with requests of the same length; log-softmax in fp32, as `evaluation.perplexity.measuring.evaluate_model`.
  Requests longer than `max_length` + 1 tokens keep their last `max_length` + 1 (the context is cut on the left).
- loglikelihood_rolling: lm-eval's rolling windows of `max_length` tokens, each scored as above.
- generate_until: greedy decoding through the KV cache of `max_gen_toks` tokens, cut at the first end-of-document
  token and stop string; requests of different lengths share left-padded batches (`evaluation.passkey.
  decode_ragged`, what eval-algorithmic decodes with), and a batch ends once every row has emitted the end token.
  Sampling (`do_sample`) is refused: the decode path is greedy.

Every context opens with the end-of-document token (`prefix_eod`, default on): each training document follows one,
as each passkey prompt does. `max_length` defaults to the run's training length; a larger one scores the run beyond
it (extrapolation), up to the scheme's limit (learned positions). A run trained with randomized positions is fed its
trained draws (`evaluation.positions.trained_positions`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from posenc_cli.errors import ConfigError
from posenc_cli.evaluation.passkey import decode_ragged
from posenc_cli.evaluation.perplexity.planning import resolve_dtype
from posenc_cli.evaluation.positions import Positions, trained_positions
from posenc_cli.run.device import resolve_device
from posenc_cli.run.device import threads as use_threads
from posenc_cli.run.hf_run import load_hf_run
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import is_hf_dir

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from posenc_cli.run.load import LoadedRun

__all__ = ["DEFAULT_BATCH_TOKENS", "PosencLM", "continuation_scores", "cut_at_stops", "truncate_request"]

DEFAULT_BATCH_TOKENS = 16384  # tokens per forward, eval-extrapolate's --batch-tokens default
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for generate_until (its HFLM's max_gen_toks)
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}  # lm-eval's hf model's names for eval-extrapolate's dtypes
TokenRequest = tuple[Any, list[int], list[int]]  # (cache key or None, context ids, continuation ids)


def truncate_request(context: Sequence[int], continuation: Sequence[int], max_length: int) -> tuple[list[int], int]:
    """(input ids, n continuation) of one loglikelihood request: context + continuation minus its last token, cut on
    the left to `max_length` tokens; the logits of the last n inputs predict the continuation."""
    if not continuation:
        raise ConfigError("lm-eval sent a loglikelihood request with an empty continuation")
    if len(continuation) > max_length:
        raise ConfigError(
            f"a continuation of {len(continuation)} tokens does not fit max_length={max_length}; raise max_length"
        )
    whole = [*context, *continuation][-(max_length + 1) :]
    return whole[:-1], len(continuation)


def continuation_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probability and greediness of continuations: logits (B, n, V) at the positions that predict
    `targets` (B, n) -> ((B,) float64 log p, (B,) bool every target is the argmax). Log-softmax in fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, n, V)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, n)
    greedy = (logp.argmax(dim=-1) == targets).all(dim=-1)  # (B,)
    return picked.double().sum(dim=-1), greedy


def cut_at_stops(text: str, stops: Iterable[str]) -> str:
    """`text` up to the earliest occurrence of any non-empty stop string."""
    ends = [text.find(s) for s in stops if s]
    found = [e for e in ends if e >= 0]
    return text[: min(found)] if found else text


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"posenc model_args: {name} must be true or false, got {value!r}")


def _as_int(value: Any, name: str, least: int = 1) -> int:
    """A model_args integer (lm-eval hands over "4" as 4, a flag's value as text)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit() or int(text) < least:
        raise ConfigError(f"posenc model_args: {name} must be an integer >= {least}, got {value!r}")
    return int(text)


def load_any_run(path: str | Path, device: torch.device) -> LoadedRun:
    """A posenc run directory, or a `transformers` one (an exported run, a published checkpoint), as
    eval-extrapolate loads each (its `evaluate_each_run`)."""
    return load_hf_run(path, device=device) if is_hf_dir(path) else load_run(path, device=device)


@register_model("posenc")
class PosencLM(TemplateLM):
    """lm-eval's model "posenc": a posenc run (or `transformers` directory) scored by its own forward.

    model_args: `run` (the run directory; required), `device` (auto), `dtype` (auto: the run's precision where it is
    fast, as eval-extrapolate's --dtype; fp32 or float32, bf16 or bfloat16), `max_length` (the run's training
    length), `max_gen_toks` (256), `prefix_eod` (true), `batch_tokens` (16384 tokens per forward, rows of one length
    at most `batch_size`), `threads` (0: the free cores). lm-eval adds `batch_size` ("auto": only `batch_tokens`
    bounds a forward), `max_batch_size` and `device` from its own flags.
    """

    def __init__(
        self,
        run: str | Path | None = None,
        device: str | None = None,
        dtype: str = "auto",
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        max_length: int | str | None = None,
        max_gen_toks: int | str = DEFAULT_MAX_GEN_TOKS,
        prefix_eod: bool | str = True,
        batch_tokens: int | str = DEFAULT_BATCH_TOKENS,
        threads: int | str = 0,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            known = "run, device, dtype, max_length, max_gen_toks, prefix_eod, batch_tokens, threads"
            raise ConfigError(f"posenc model_args: unknown {', '.join(sorted(unknown))} (known: {known})")
        if not run:
            raise ConfigError("posenc model_args: give the run directory, --model_args run=DIR")
        self._prefix_eod = _as_bool(prefix_eod, "prefix_eod")
        self._batch_tokens = _as_int(batch_tokens, "batch_tokens")
        self._max_gen_toks = _as_int(max_gen_toks, "max_gen_toks")
        self._threads = _as_int(threads, "threads", least=0)
        self._rows_cap = self._batch_cap(batch_size, max_batch_size)
        wanted_length = None if max_length is None else _as_int(max_length, "max_length")
        self._device = resolve_device(device or "auto", "--device")
        with use_threads(self._threads):
            self.run = load_any_run(run, self._device)
        self._dtype = resolve_dtype(DTYPE_NAMES.get(str(dtype), str(dtype)), self.run.meta.precision, self._device)
        train_length, _ = self.run.meta.lengths(self.run.config)
        self._max_length = train_length if wanted_length is None else wanted_length
        limit = getattr(getattr(self.run.model, "scheme", None), "max_length", None)
        if limit is not None and self._max_length > limit:
            raise ConfigError(
                f"posenc model_args: max_length={self._max_length} is beyond the {self.run.scheme_label} scheme's "
                f"{limit} positions"
            )
        self._positions: Positions = trained_positions(self.run.config)

    @staticmethod
    def _batch_cap(batch_size: int | str | None, max_batch_size: int | None) -> int | None:
        """Rows per forward at most: lm-eval's integer batch size; None ("auto", unset) leaves `batch_tokens`."""
        if batch_size is None or str(batch_size).startswith("auto"):
            return None if max_batch_size is None else _as_int(max_batch_size, "max_batch_size")
        return _as_int(batch_size, "batch_size")

    # -- What lm-eval asks of a model. ------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.run.tokenizer.eod_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int | str:
        return self._rows_cap if self._rows_cap is not None else "auto"

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return f"posenc-{self.run.tokenizer.kind}-{self.run.tokenizer.fingerprint}"

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval's results record about the model (its `config` block)."""
        return {
            "posenc_run": str(self.run.path),
            "posenc_scheme": self.run.scheme_label,
            "posenc_step": self.run.meta.step,
            "posenc_dtype": self._dtype,
            "posenc_max_length": self._max_length,
        }

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Ids of `string`, after the end-of-document token when `add_special_tokens` (None: `prefix_eod`)."""
        ids = [int(i) for i in self.run.tokenizer.encode(string)]
        prefix = self._prefix_eod if add_special_tokens is None else add_special_tokens
        return [self.eot_token_id, *ids] if prefix else ids

    def tok_decode(self, tokens: Iterable[int], **kwargs: Any) -> str:
        return self.run.tokenizer.decode(list(tokens))

    # -- Scoring. ------------------------------------------------------------------------------------------------

    def _rows(self, length: int) -> int:
        """Rows of `length` tokens per forward: `batch_tokens` // length, at most lm-eval's batch size."""
        rows = max(1, self._batch_tokens // length)
        return rows if self._rows_cap is None else min(rows, self._rows_cap)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) of ids (B, T): the run's positions (0..T−1, or its randomized draw, the same ids for
        every row whatever the batch), fp32 or bf16 autocast as eval-extrapolate computes."""
        ids = None
        if self._positions.random:
            T = x.shape[1]
            one = self._positions.draw(1, T, self._positions.generator(T)).to(x.device)  # (1, T) or (1, layers, T)
            ids = one.expand(len(x), *one.shape[1:])  # (B, T) or (B, layers, T)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=self._dtype == "bf16"):
            return self.run.model(x) if ids is None else self.run.model(x, position_ids=ids)  # (B, T, V)

    def _loglikelihood_tokens(self, requests: list[TokenRequest], **kwargs: Any) -> list[tuple[float, bool]]:
        """(log p(continuation | context), greedy) of each request, in request order."""
        prepared = [truncate_request(ctx, cont, self._max_length) for _, ctx, cont in requests]
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, (inputs, _) in enumerate(prepared):
            by_length[len(inputs)].append(i)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        model = self.run.model
        was_training = model.training
        model.eval()
        try:
            with use_threads(self._threads), torch.inference_mode():
                for length, members in sorted(by_length.items()):
                    step = self._rows(length)
                    for start in range(0, len(members), step):
                        rows = members[start : start + step]
                        x = torch.tensor([prepared[i][0] for i in rows], dtype=torch.long, device=self._device)
                        logits = self._forward(x)  # (B, T, V)
                        for b, i in enumerate(rows):  # continuations differ in length within a batch
                            n, cont = prepared[i][1], requests[i][2]
                            target = torch.tensor([cont], dtype=torch.long, device=self._device)  # (1, n)
                            logp, greedy = continuation_scores(logits[b : b + 1, length - n :], target)
                            out[i] = (float(logp[0]), bool(greedy[0]))
        finally:
            model.train(was_training)
        for (key, _, _), answer in zip(requests, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """log p of each whole string, in lm-eval's rolling windows of `max_length` tokens (the first token predicted
        from the end-of-document token)."""
        windows: list[TokenRequest] = []
        owner: list[int] = []
        for r, (string,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(string, add_special_tokens=False)
            pairs = get_rolling_token_windows(tokens, self.eot_token_id, self._max_length, context_len=1)
            for ctx, cont in map(make_disjoint_window, pairs):
                windows.append((None, ctx, cont))
                owner.append(r)
        totals = [0.0] * len(requests)
        for r, (logp, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[r] += logp
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def _drawn_ids(self, shapes: list[tuple[int, int]]) -> list[torch.Tensor] | None:
        """A randomized-position run's ids of each (prompt tokens, steps) request: the requests of one shape, in
        order, draw from that length's generator as `passkey.decode_prompts` draws them; None for other runs."""
        if not self._positions.random:
            return None
        members: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, shape in enumerate(shapes):
            members[shape].append(i)
        ids: list[torch.Tensor] = [torch.empty(0)] * len(shapes)
        for (width, steps), rows in members.items():
            T = width + steps
            drawn = self._positions.draw(len(rows), T, self._positions.generator(T))  # (n, T) or (n, layers, T)
            for r, i in enumerate(rows):
                ids[i] = drawn[r]
        return ids

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations through the KV cache, cut at the first end-of-document token and stop string; prompts
        of any lengths decode together, left-padded (`passkey.decode_ragged`, as eval-algorithmic's), and a batch
        stops once each of its rows has generated the end token."""
        eod_text = self.tok_decode([self.eot_token_id])
        plans: list[tuple[list[int], int, list[str]]] = []
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self._max_gen_toks)
            if kwargs.get("do_sample"):
                raise ConfigError("the posenc model decodes greedily: give the task do_sample: false")
            steps = int(kwargs["max_gen_toks"])
            if steps >= self._max_length:
                raise ConfigError(f"max_gen_toks={steps} leaves no context within max_length={self._max_length}")
            prompt = self.tok_encode(context)[-(self._max_length - steps) :] or [self.eot_token_id]  # never empty
            plans.append((prompt, steps, handle_stop_sequences(kwargs.get("until"), eos=eod_text)))
        with use_threads(self._threads):
            generated = decode_ragged(
                self.run.model,
                [np.array(prompt, dtype=np.int64) for prompt, _, _ in plans],
                [steps for _, steps, _ in plans],
                [len(prompt) + steps for prompt, steps, _ in plans],
                self._rows(self._max_length) * self._max_length,
                self._dtype,
                self._device,
                None,
                "generate_until",
                position_ids=self._drawn_ids([(len(prompt), steps) for prompt, steps, _ in plans]),
                stop_id=self.eot_token_id,
            )  # one (steps_i,) array per request
        out = []
        for row, (_, _, stops) in zip(generated, plans, strict=True):
            ids = row.tolist()
            ids = ids[: ids.index(self.eot_token_id)] if self.eot_token_id in ids else ids
            out.append(cut_at_stops(self.tok_decode(ids), stops))
        for req, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out
