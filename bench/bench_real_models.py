"""Benchmark of the real-model suite on the cpu virtual device: per family, the seconds to build SGLang's model
class (config.json, ModelConfig, DummyModelLoader), the capture (the decode runner's constructor: two warm-ups and
a capture per size, the Triton kernels run by the CPU interpreter), one replay through `execute`, one eager forward
on the Triton backend, and the Triton kernel launches each capture recorded; the same for the EAGLE draft worker's
draft decode and draft extend graphs, and for a LoRA server of each LoRA kernel backend (its manager and adapters
built, the batch on both adapters); then the wall time of the suite's
gate profile (`--gate`, at `-n 2`: what the real-model gate examples add to the gate campaign).

With `--compiled`, each family again under `--enable-torch-compile` (Dynamo and AOTAutograd, backend aot_eager:
its capture includes tracing the compiled sizes).

Usage: python bench/bench_real_models.py [--sizes 1,2,4] [--gate] [--compiled]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def padded_batch(target, sizes: tuple[int, ...]):
    """A staged decode batch one below the largest captured size (a padded replay)."""
    n = max(1, max(sizes) - 1)
    return target.stage([9, 4, 17, 6, 11, 3, 20, 8][:n], list(range(1, n + 1)), [5] * n, seed=1)


def bench_family(family: str, sizes: tuple[int, ...], compiled: bool = False) -> None:
    from harness.devices import cpu, get_device
    from harness.targets.decode import real_model
    from harness.targets.decode.base import DecodeCase

    reason = real_model.family_missing(family)
    if reason:
        print(f"{family}: skipped: {reason}")
        return
    case = DecodeCase(capture_bs=sizes, max_running_requests=8)
    if compiled:  # --enable-torch-compile, Dynamo and AOTAutograd only (the gate's backend)
        import torch

        case = dataclasses.replace(case, enable_torch_compile=True, compile_backend="aot_eager",
                                   torch_compile_max_bs=max(sizes))
        torch._dynamo.reset()
    with get_device("cpu").install("cuda"):
        cpu.reset_log()
        started = time.perf_counter()
        target = real_model.RealModelTarget(case, family=family)
        family = f"{family}+compile" if compiled else family
        if target.capture_refused:
            print(f"{family:8s} {target.real.family.architecture:20s} build + refused capture "
                  f"{time.perf_counter() - started:6.2f} s: {target.capture_refused[:160]}", flush=True)
            return
        built = time.perf_counter() - started - target.capture_seconds
        batch = padded_batch(target, sizes)
        started = time.perf_counter()
        target.replay(batch)
        replay = time.perf_counter() - started
        started = time.perf_counter()
        target.eager(batch)
        eager = time.perf_counter() - started
        print(f"{family:14s} {target.real.family.architecture:20s} build {built:6.2f} s   capture of {list(sizes)}: "
              f"{target.capture_seconds:6.2f} s   replay (batch of {batch.batch_size}): {replay:5.2f} s   "
              f"eager: {eager:5.2f} s   launches recorded per capture: {[c.num_launches for c in cpu.CAPTURES]}",
              flush=True)


def bench_draft(sizes: tuple[int, ...]) -> None:
    """The EAGLE draft worker (a tree of 2 branches over 3 steps): build of both models, the capture of its draft
    decode and draft extend graphs, one replay and one eager run of each (a batch one below the largest size)."""
    from harness.devices import cpu, get_device
    from harness.targets.decode import eagle_draft
    from harness.targets.decode.base import DecodeCase, SpecSettings

    reason = eagle_draft.draft_missing()
    if reason:
        print(f"eagle: skipped: {reason}")
        return
    with get_device("cpu").install("cuda"):
        cpu.reset_log()
        started = time.perf_counter()
        case = DecodeCase(capture_bs=sizes, max_running_requests=8,
                          spec=SpecSettings(num_steps=3, topk=2, num_draft_tokens=5, algorithm="EAGLE"))
        target = eagle_draft.EagleDraftTarget(case)
        built = time.perf_counter() - started - target.capture_seconds
        n = max(1, max(sizes) - 1)
        rows, seq_lens = list(range(1, n + 1)), [9, 4, 17, 6, 11, 3, 20, 8][:n]
        draft = eagle_draft.DraftBatch(seq_lens, rows, [[1, 2]] * n, [[0.6, 0.3]] * n, seed=1)
        extend = eagle_draft.DraftExtendBatch(seq_lens, rows, [[1, 2, 3, 4, 5]] * n, [2] * n, seed=2)
        timings = {}
        for name, run in (("draft replay", lambda: target.replay_draft(target.draft_forward_batch(
                              draft, target.stage_draft(draft)))),
                          ("draft eager", lambda: target.eager_draft(target.draft_forward_batch(
                              draft, target.stage_draft(draft)))),
                          ("extend replay", lambda: target.replay_extend(target.extend_forward_batch(
                              extend, target.stage_extend(extend)), target.select_index(extend))),
                          ("extend eager", lambda: target.eager_extend(target.extend_forward_batch(
                              extend, target.stage_extend(extend)), target.select_index(extend)))):
            started = time.perf_counter()
            run()
            timings[name] = time.perf_counter() - started
        print(f"{'eagle':8s} {'LlamaForCausalLMEagle':20s} build {built:6.2f} s   capture of {list(sizes)} (draft "
              f"decode + extend): {target.capture_seconds:6.2f} s   "
              + "   ".join(f"{name} (batch of {n}): {seconds:5.2f} s" for name, seconds in timings.items()),
              flush=True)


def bench_lora(backend: str, sizes: tuple[int, ...]) -> None:
    """A LoRA server (`real_lora.RealLoRATarget`) on `backend`: build (model, manager, adapters), capture, one
    replay and one eager run of a batch one below the largest size on adapters "a" and "b" by turns."""
    from harness.devices import cpu, get_device
    from harness.targets.decode import real_lora
    from harness.targets.decode.base import DecodeCase

    reason = real_lora.lora_missing(backend)
    if reason:
        print(f"lora/{backend}: skipped: {reason}")
        return
    with get_device("cpu").install("cuda"):
        cpu.reset_log()
        started = time.perf_counter()
        target = real_lora.RealLoRATarget(DecodeCase(capture_bs=sizes, max_running_requests=8), backend=backend)
        built = time.perf_counter() - started - target.capture_seconds
        staged = padded_batch(target, sizes)
        n = staged.batch_size
        batch = dataclasses.replace(staged, lora_ids=["a", "b"] * (n // 2) + ["a"] * (n % 2))
        timings = {}
        for name, run in (("replay", lambda: target.replay(batch)), ("eager", lambda: target.eager(batch))):
            started = time.perf_counter()
            run()
            timings[name] = time.perf_counter() - started
        print(f"{'lora':8s} {backend:20s} build {built:6.2f} s   capture of {list(sizes)}: "
              f"{target.capture_seconds:6.2f} s   replay (batch of {n}): {timings['replay']:5.2f} s   eager: "
              f"{timings['eager']:5.2f} s   launches recorded per capture: {[c.num_launches for c in cpu.CAPTURES]}",
              flush=True)


def bench_gate() -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "suites/test_real_models.py", "-q", "-n", "2",
                           "--profile", "gate", "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
    print(f"gate profile of suites/test_real_models.py at -n 2: {time.perf_counter() - started:6.1f} s wall "
          f"(exit {done.returncode}; {tail[0] if tail else ''})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--gate", action="store_true")
    parser.add_argument("--compiled", action="store_true",
                        help="also each captured family with --enable-torch-compile (Dynamo, backend aot_eager)")
    args = parser.parse_args()
    os.chdir(REPO)
    from harness.compat import prepare_torchvision
    from harness.models.real import FAMILIES

    prepare_torchvision()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    for family in FAMILIES:
        bench_family(family, sizes)
    if args.compiled:
        for family in FAMILIES:
            bench_family(family, sizes, compiled=True)
    bench_draft(sizes)
    from harness.targets.decode.real_lora import LORA_BACKENDS

    for backend in LORA_BACKENDS:
        bench_lora(backend, sizes)
    if args.gate:
        bench_gate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
