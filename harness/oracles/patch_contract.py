"""The `patch_model` contract of the decode runner (known bug class 1, SGLang PR #27774).

The sizes come from the case, by SGLang's arithmetic (`expected_sizes`), not from the runner's own lists.
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


def expected_sizes(case) -> tuple[list[int], list[int]]:
    """(capture sizes, compile sizes) SGLang must derive from a decode case on one rank:
        sizes   = capture_bs + [pool] if max(capture_bs) > pool      (the pool's size is always captured)
        capture = sorted(set(s for s in sizes if s <= pool))         (a batch never exceeds the pool)
        compile = [s for s in capture if s <= torch_compile_max_bs] when torch.compile is on, else []
    e.g. capture_bs (2, 8, 12), pool 6, compile up to 4: capture [2, 6], compile [2]."""
    pool = case.max_running_requests
    sizes = list(case.capture_bs) + ([pool] if max(case.capture_bs) > pool else [])
    capture = sorted({s for s in sizes if s <= pool})
    compile_bs = [s for s in capture if s <= case.torch_compile_max_bs] if case.enable_torch_compile else []
    return capture, compile_bs


def check_default_capture_list(target) -> None:
    """A capture list left to SGLang's default (`--cuda-graph-max-bs M`, no list) is what the arguments imply:
    sizes 1..M, sorted, with 1 and M; every size 1..M with padding disabled; every size up to min(8, M) under
    speculative decoding (less padding for small verify batches); otherwise 1, 2, 4 and 8 (those up to M), and no
    gap wider than 8 between neighbours (M <= 256)."""
    drawn = target.drawn_case
    if drawn.default_max_bs is None or "default_max_bs" in target.dropped_options:
        return
    top, sizes = drawn.default_max_bs, list(target.case.capture_bs)
    if drawn.disable_padding:
        must, why = list(range(1, top + 1)), "every size 1..M (padding disabled)"
    elif drawn.spec is not None:
        must, why = list(range(1, min(8, top) + 1)), "every size up to min(8, M) (speculative decoding)"
    else:
        must, why = [s for s in (1, 2, 4, 8) if s <= top], "1, 2, 4 and 8 up to M"
    gaps = [b - a for a, b in zip(sizes, sizes[1:])]
    problems = [text for bad, text in (
        (sizes != sorted(set(sizes)), "not sorted and unique"),
        (not sizes or sizes[0] < 1 or sizes[-1] != top, f"not within 1..{top} ending at {top}"),
        (any(s not in sizes for s in must), f"missing some of {why}: {must}"),
        (top <= 256 and any(g > 8 for g in gaps), "a gap wider than 8 between neighbours")) if bad]
    if problems:
        raise OracleFailure(ORACLE, f"SGLang's default decode capture list for --cuda-graph-max-bs {top} "
                                    f"(padding {'off' if drawn.disable_padding else 'on'}, speculative "
                                    f"{'on' if drawn.spec else 'off'}) is {sizes}: {'; '.join(problems)}",
                            capture_bs=sizes)


def check_patch_model_contract(target, hooks: HookRecorder, layout, graphs_captured: int | None = None) -> None:
    """`graphs_captured`: the graphs the device captured during construction, where it counts them."""
    check_default_capture_list(target)
    personality = target.personality
    expected = expected_patch_name(personality, layout)
    # graphs per size: the LoRA and the "nolora" variant when the (CUDA) runner records both, else one
    variants = 2 if (target.case.record_nolora_graph and personality == "cuda") else 1
    # under --enable-pdmux the runner captures every size once per stream group (SGLang's --sm-group-num)
    variants *= max(1, target.case.switches.pdmux_groups)
    # DeepSeek-V4.1's candidate variants: the unfiltered graph (requests up to the candidate span) and the filtered
    # fallback; the harness's config offers no low-ratio variant (compress ratios hold neither 1 nor 2)
    variants *= 2 if target.case.switches.dsv41_span else 1
    sizes, compile_bs = expected_sizes(target.case)
    if sorted(target.capture_bs) != sizes or sorted(target.compile_bs) != compile_bs:
        raise OracleFailure(ORACLE, f"the runner captures sizes {target.capture_bs} and compiles {target.compile_bs}, "
                                    f"but the case asks for capture {sizes} and compile {compile_bs} "
                                    "(see expected_sizes)", case=target.case)
    if graphs_captured is not None and graphs_captured != len(sizes) * variants:
        raise OracleFailure(ORACLE, f"the runner captured {graphs_captured} graph(s), expected {len(sizes) * variants} "
                                    f"({len(sizes)} sizes x {variants} LoRA variant(s) / stream group(s))",
                            capture_bs=sizes)
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
            f"({len(sizes)} sizes x {variants} LoRA variant(s) / stream group(s)); other patch_model variants ran: "
            f"{dict(others) or 'none'}{override}",
            personality=personality, capture_bs=sizes, compile_bs=compile_bs,
            ran=[(e.name, e.num_tokens, e.enable_compile) for e in entries])
    hooks.assert_called(expected, times=len(sizes) * variants,
                        why=f"once per captured size and LoRA variant, personality {personality}")
    width = target.case.tokens_per_request  # patch_model is told tokens: sizes x draft tokens under TARGET_VERIFY
    compiled = sorted({e.num_tokens // width for e in entries if e.enable_compile})
    if compiled != compile_bs:
        raise OracleFailure(ORACLE, f"`{expected}` was asked to compile sizes {compiled}, expected {compile_bs} "
                                    "(the captured sizes up to torch_compile_max_bs)", capture_bs=sizes)
    tokens_entered = sorted({e.num_tokens for e in entries})
    if tokens_entered != [s * width for s in sizes]:
        raise OracleFailure(ORACLE, f"`{expected}` was entered for {tokens_entered} token(s), expected "
                                    f"{[s * width for s in sizes]} (sizes {sizes} x {width} token(s) per request)",
                            capture_bs=sizes)
    for entry in entries:
        if len(entry.calls) != 3 or entry.calls[-1] != "capture" or "capture" in entry.calls[:-1]:
            raise OracleFailure(
                ORACLE, f"the forward `{entry.name}` yielded for {entry.num_tokens} token(s) is not what was "
                        f"captured: its calls were {entry.calls}, expected two warm-ups then one call inside the "
                        "graph capture", num_tokens=entry.num_tokens)
