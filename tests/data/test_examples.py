"""`data.examples`: the examples of a token stream and each one's prompt, on hand-built streams."""

from __future__ import annotations

import numpy as np

from posenc_cli.data.examples import NO_PROMPT, example_prompts, find_examples, longest_spans
from posenc_cli.data.sources.base import prompt_answer
from posenc_cli.data.tokenizer import ByteTokenizer

EOD = 0
BYTE = ByteTokenizer()


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


def test_the_longest_example_and_prompt_are_what_a_row_reads() -> None:
    eod = BYTE.eod_id
    docs = [prompt_answer("ab", " c"), prompt_answer("defg", " hi"), "plain", prompt_answer("j", " k")]
    ids, scored = BYTE.encode_scored(docs)
    examples = find_examples(ids.astype(np.int64), eod)
    # the longest: [eod] + "defg hi", 8 inputs; its prompt, [eod] + "defg", 5 (the 5th input predicts " ")
    assert longest_spans(examples, scored) == (8, 5)
    assert longest_spans(examples, None) == (8, None)  # every token scored: no prompt
    assert longest_spans(examples, np.zeros_like(scored)) == (8, None)
    # "plain" has no scored token: it sets the longest example, not the longest prompt
    ids, scored = BYTE.encode_scored([prompt_answer("ab", " c"), "a longer plain document"])
    assert longest_spans(find_examples(ids.astype(np.int64), eod), scored) == (24, 3)
    assert longest_spans(find_examples(np.array([1, 2, 3]), eod), None) == (0, None)  # no end-of-document: no example
