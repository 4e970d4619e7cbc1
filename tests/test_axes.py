"""`python -m harness axes`: the settings and batch fields a targeted file reads, read from its AST, and classed by
what the harness does with them."""
from __future__ import annotations

from pathlib import Path

from harness.axes import axes, reads
from harness.mutants import require_sglang

SOURCE = '''
def replay(self, forward_batch):
    if get_exec().graph.disable_cuda_graph_padding and forward_batch.forward_mode.is_decode():
        n = get_spec().speculative_num_steps
    width = server_args.page_size + self.server_args.max_running_requests
    return forward_batch.seq_lens[: forward_batch.batch_size]
'''


def test_a_chain_names_its_setting_and_a_batch_its_field():
    found = reads(SOURCE)
    assert found == {("setting", "disable_cuda_graph_padding"): [3], ("batch field", "forward_mode"): [3],
                     ("setting", "speculative_num_steps"): [4], ("setting", "page_size"): [5],
                     ("setting", "max_running_requests"): [5], ("batch field", "seq_lens"): [6],
                     ("batch field", "batch_size"): [6]}


def test_the_installed_runners_settings_are_classed():
    rows = {(a.file.rsplit("/", 1)[-1], a.name): a for a in axes(Path(require_sglang()))}
    runner = "decode_cuda_graph_runner.py"
    assert rows[(runner, "speculative_num_steps")].status == "drawn"  # the draft strategies narrow by it
    overlap = rows[(runner, "enable_two_batch_overlap")]
    assert overlap.status == "not driven" and "DeepEP" in overlap.reason
    assert all(a.status in ("drawn", "fixed", "not driven") for a in rows.values())
