"""The shared logits buffer a prefill replay asks for is as long as the logits its tail computes.

The prefill runner hands the logits processor a view of the process's shared graph output
(`GraphSharedOutput.get_logits_buffer(rows)`, sized by `_prefill_logits_buffer_rows`); the processor writes the LM
head's logits into it when the shapes agree, and otherwise allocates afresh per batch, silently. The rows follow
from the batch: one per request, or, when the batch returns logprobs, for each request its extend tokens from its
logprob start on, at least one (SGLang's `compute_extend_logprob_start_len`: the start is the request's
`logprob_start_len`, never inside its cached prefix, relative to the extend; a request asking none starts at its
extend's end).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from harness.oracles import OracleFailure

ORACLE = "logits-buffer"


def expected_rows(extend_lens: Sequence[int], prefix_lens: Sequence[int], logprob_starts: Sequence[int | None],
                  ) -> tuple[int, str]:
    """(rows, the arithmetic) for a batch; `logprob_starts[i]` None: request i asks no logprobs."""
    if all(start is None for start in logprob_starts):
        return len(extend_lens), f"{len(extend_lens)} request(s), no logprobs: one row each"
    terms = []
    for extend, prefix, start in zip(extend_lens, prefix_lens, logprob_starts):
        relative = extend if start is None else min(max(start, prefix) - prefix, extend)
        terms.append(max(extend - relative, 1))
    return sum(terms), " + ".join(map(str, terms)) + " (per request: max(extend - logprob start in it, 1))"


@contextlib.contextmanager
def observing(runner) -> Iterator[list[int]]:
    """The `rows` of every shared logits buffer `runner` asks for while the block runs."""
    asked: list[int] = []
    original = runner._next_token_logits_buffer

    def recorded(rows):
        asked.append(int(rows))
        return original(rows)
    runner._next_token_logits_buffer = recorded
    try:
        yield asked
    finally:
        del runner._next_token_logits_buffer


def check(asked: Sequence[int], rows: int, arithmetic: str, *, where: str) -> None:
    if list(asked) != [rows]:
        raise OracleFailure(ORACLE, f"{where}: the replay asked for shared logits buffers of {list(asked)} row(s) "
                            f"where its logits are {rows} row(s) ({arithmetic}): a buffer of another length is "
                            "dropped and the logits allocated afresh", asked=list(asked), rows=rows)
