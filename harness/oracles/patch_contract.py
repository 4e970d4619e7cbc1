"""The `patch_model` contract of the decode runner (known bug class 1, SGLang PR #27774).

For every captured batch size (and LoRA variant) the runner enters `patch_model(model, bs in compile_bs, ...)`
looked up on `torch_compile_decoration` at call time, so a platform's override installed there (the NPU runner
installs `patch_model_npu`) is what runs. Checked from what really ran (observed by the identity of the functions,
so a by-value import that bypasses the override is seen too):
- the personality's `patch_model` (cuda: `patch_model`; npu: `patch_model_npu`) was entered once per captured
  size and variant, and no other variant was;
- compile was enabled exactly for the sizes in `compile_bs`;
- what each entry yielded is what was captured: it ran twice outside capture (SGLang's two warm-ups) and its last
  call ran inside the graph capture.
"""
from __future__ import annotations

from collections import Counter

from harness.oracles import OracleFailure
from harness.oracles.hooks import HookRecorder

ORACLE = "hook-contract"


def expected_patch_name(personality: str, layout) -> str:
    return layout.npu_patch_name if personality == "npu" else "patch_model"


def check_patch_model_contract(target, hooks: HookRecorder, layout) -> None:
    personality = target.personality
    expected = expected_patch_name(personality, layout)
    variants = 2 if (target.case.record_nolora_graph and personality == "cuda") else 1
    sizes = target.capture_bs
    entries = target.patch_model_seen
    ran = Counter(e.name for e in entries)
    others = {name: n for name, n in ran.items() if name != expected}
    if others or ran[expected] != len(sizes) * variants:
        override = (f"; the {personality} override `{expected}` is installed on torch_compile_decoration by "
                    f"{layout.npu_runner_class}.__init__, so the runner did not look `patch_model` up on the module "
                    "at call time (a by-value import?)") if personality == "npu" else ""
        raise OracleFailure(
            ORACLE,
            f"during capture `{expected}` ran {ran[expected]} time(s), expected {len(sizes) * variants} "
            f"({len(sizes)} sizes x {variants} LoRA variant(s)); other patch_model variants ran: "
            f"{dict(others) or 'none'}{override}",
            personality=personality, capture_bs=sizes, compile_bs=target.compile_bs,
            ran=[(e.name, e.num_tokens, e.enable_compile) for e in entries])
    hooks.assert_called(expected, times=len(sizes) * variants,
                        why=f"once per captured size and LoRA variant, personality {personality}")
    compiled = sorted({e.num_tokens for e in entries if e.enable_compile})
    if compiled != sorted(target.compile_bs):
        raise OracleFailure(ORACLE, f"`{expected}` was asked to compile sizes {compiled}, but compile_bs is "
                                    f"{sorted(target.compile_bs)}", capture_bs=sizes)
    for entry in entries:
        if len(entry.calls) != 3 or entry.calls[-1] != "capture" or "capture" in entry.calls[:-1]:
            raise OracleFailure(
                ORACLE, f"the forward `{entry.name}` yielded for {entry.num_tokens} token(s) is not what was "
                        f"captured: its calls were {entry.calls}, expected two warm-ups then one call inside the "
                        "graph capture", num_tokens=entry.num_tokens)
