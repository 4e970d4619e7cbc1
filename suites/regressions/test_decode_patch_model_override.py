"""Pinned regression of known bug 1 (SGLang PR #23906, fixed by #27774): with the NPU graph runner, its override of
`patch_model` must be what runs during capture, compiled sizes included; and the CUDA runner with compile and
LoRA variants keeps its contract. Explicit cases, both personalities, whatever `--personality` says; on
`--device cuda` the CUDA case runs on the GPU and the NPU cases need the virtual device (skipped, saying so)."""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.errors import PathMissing
from harness.record import example
from harness.targets import decode
from harness.targets.decode import DecodeBatch, DecodeCase
from suites.test_decode_capture import capture_and_check

ABOUT = {"frame": r"\bpatch_model\b"}  # what repro may name this pin for (harness/known_findings.py): the frame

CASES = {
    # Every size compiled: the NPU override must compile them with its own backend (npugraph_ex).
    "npu_compile_every_size": ("npu", DecodeCase(capture_bs=(1, 2, 4), max_running_requests=4,
                                                 enable_torch_compile=True, torch_compile_max_bs=8)),
    # Some sizes compiled, some not: the override is entered for both kinds.
    "npu_compile_some_sizes": ("npu", DecodeCase(capture_bs=(1, 3, 6), max_running_requests=6,
                                                 enable_torch_compile=True, torch_compile_max_bs=3, lora=True)),
    # CUDA: lora and nolora graphs per size, compiled.
    "cuda_lora_variants_compiled": ("cuda", DecodeCase(capture_bs=(2, 4), max_running_requests=5,
                                                       enable_torch_compile=True, torch_compile_max_bs=4, lora=True,
                                                       record_nolora_graph=True)),
}


def fixed_batches(case: DecodeCase):
    def batches(capture_bs):
        sizes = sorted({1, capture_bs[-1], max(1, capture_bs[-1] - 1)})  # edges and one padded size
        return [DecodeBatch(input_ids=[2 + i for i in range(n)], positions=[4 + i for i in range(n)],
                            seq_lens=[5 + i for i in range(n)],
                            lora_ids=(["a1", None, "a2", "a3"] * n)[:n] if case.lora else None) for n in sizes]

    return batches


@pytest.mark.parametrize("name", sorted(CASES))
def test_patch_model_override_is_what_captured(name, device_name):
    personality, case = CASES[name]
    try:
        layout = decode.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    if device_name != "cpu" and personality != device_name:
        pytest.skip(f"the {personality} personality runs on the cpu virtual device, not on --device {device_name}")
    device = get_device("cpu" if personality != device_name else device_name)
    if not device.available:
        pytest.skip(device.skip_reason)
    with device.install(personality), example("decode_capture_regression", personality=personality,
                                              **case.drawn()) as ex:
        capture_and_check(case, fixed_batches(case), device, personality, layout, ex)
