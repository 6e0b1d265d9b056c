"""`data.examples`: the examples of a token stream and each one's prompt, on hand-built streams."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.examples import NO_PROMPT, example_prompts, find_examples

EOD = 0


def test_each_example_s_prompt_is_its_inputs_up_to_the_first_scored_target() -> None:
    # three documents: a b | c d e (d, e scored) | f (nothing scored but its end-of-document)
    tokens = np.array([1, 2, EOD, 3, 4, 5, EOD, 6, EOD])
    scored = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=np.uint8)
    examples = find_examples(tokens, EOD)
    assert examples.starts.tolist() == [0, 3, 7] and examples.lengths.tolist() == [3, 4, 2]
    # [eod] a -> b: 2 inputs; [eod] c -> d: 2; [eod] f -> [eod]: 2 (the end-of-document target counts)
    assert example_prompts(examples, scored).tolist() == [2, 2, 2]
    later = np.array([0, 0, 1, 0, 0, 1, 1, 0, 0], dtype=np.uint8)  # c d unscored, e first; f's example none
    assert example_prompts(examples, later).tolist() == [3, 3, NO_PROMPT]


def test_a_stream_without_scored_tokens_or_examples_has_no_prompt() -> None:
    tokens = np.array([1, 2, EOD, 3, EOD])
    examples = find_examples(tokens, EOD)
    assert example_prompts(examples, np.zeros(5, dtype=np.uint8)).tolist() == [NO_PROMPT, NO_PROMPT]
    none = find_examples(np.array([1, 2, 3]), EOD)  # no end-of-document: no example
    assert example_prompts(none, np.ones(3, dtype=np.uint8)).size == 0
