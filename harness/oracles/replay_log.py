"""Oracle `replay-log`: with `SGLANG_LOG_DECODE_GRAPH_KEY`, every decode replay logs one line naming the graph it
replays, as the batch implies (the decode runner's own `execute`; the NPU runner's has no such log):

    Decode graph replay: worker=target key_size={padded} (bs) mode={forward mode} raw_bs={requests}

with padded = the smallest captured size >= the batch's requests (`patch_contract.expected_sizes`); e.g. a
DECODE batch of 3 requests with sizes [2, 4] captured: `key_size=4 (bs) mode=DECODE raw_bs=3`."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from harness.oracles import OracleFailure
from harness.oracles.patch_contract import expected_sizes

ORACLE = "replay-log"
LOGGER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
PREFIX = "Decode graph replay:"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(PREFIX):
            self.lines.append(message)


@contextlib.contextmanager
def replay_log() -> Iterator[list[str]]:
    """The runner's replay-log lines written in the block."""
    logger, handler = logging.getLogger(LOGGER), _Lines()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def expected_lines(case, batches, replays_per_batch: int = 2) -> list[str]:
    """`replays_per_batch`: each drawn batch is replayed as drawn, then shifted (`decode_replay`)."""
    sizes = expected_sizes(case)[0]
    return [f"{PREFIX} worker=target key_size={min(s for s in sizes if s >= b.batch_size)} (bs) "
            f"mode={b.forward_mode} raw_bs={b.batch_size}" for b in batches for _ in range(replays_per_batch)]


def check_replay_log(lines: list[str], case, batches) -> None:
    expected = expected_lines(case, batches)
    if lines != expected:
        wrong = next((i for i, (a, b) in enumerate(zip(lines, expected)) if a != b), min(len(lines), len(expected)))
        raise OracleFailure(ORACLE, f"SGLANG_LOG_DECODE_GRAPH_KEY: {len(lines)} replay line(s) for {len(expected)} "
                            f"replays; first difference at replay {wrong}: expected "
                            f"{expected[wrong] if wrong < len(expected) else None!r}, logged "
                            f"{lines[wrong] if wrong < len(lines) else None!r}", expected=expected, logged=lines)
