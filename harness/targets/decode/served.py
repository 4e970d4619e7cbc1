"""The real-model decode target served the way a server serves it: SGLang's `ModelRunner` dispatching every forward.

`RealModelTarget` replays through the decode runner's `execute` and runs eager on a backend of its own, so no batch
the server runs between two replays ever touches the state a replay reads. `ServedTarget` builds what SGLang's
`ModelRunner` builds, in its startup order, around one attention backend: SGLang's `EagerRunner` first (its
static input registry is the process-wide pool the graph runners then coalesce onto, `share_input_buffer`), then
the `DecodeCudaGraphRunner`; and every forward the scheduler makes, prefill or decode, goes through SGLang's own
dispatch, `ModelRunner._forward_raw`: a decode batch a captured size holds replays, everything else (a prefill, a
decode batch past the largest captured size) runs on the eager runner, over the same backend and buffers. The
references stay apart: eager on a fresh backend (`RealModelTarget.eager`) and SGLang's torch-native attention.

The model runner is SGLang's own `ModelRunner` class with its constructor skipped, carrying the double's
attributes (`harness.targets.decode.base.make_model_runner`), so `_forward_raw` and the eager runner's helpers
(`_extend_forward_kwargs`, `_pp_kwargs`) are SGLang's. The multi-rank worlds serve through the same class
(`harness.targets.worlds.serving.WorldTarget`).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from harness.devices.host_memory import pinned_host_memory
from harness.errors import PathMissing
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch, DecodeCase
from harness.targets.decode.real_model import KV_TOKENS, RealModelTarget, kernels

MODEL_RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
EAGER_RUNNER_MODULE = "sglang.srt.model_executor.runner.eager_runner"


def missing() -> str | None:
    """Why the installed SGLang has no eager runner to serve beside the decode runner (before 0.5.2x the eager
    path lives in `ModelRunner.forward_extend`), or None."""
    from harness.versions import module_exists, sglang_version

    if not module_exists(EAGER_RUNNER_MODULE):
        return f"SGLang {sglang_version()} has no {EAGER_RUNNER_MODULE}: the served stack (eager runner beside the " \
               "decode runner) is not driven"
    return None


class ServedTarget(RealModelTarget):
    """See the module docstring."""

    def __init__(self, case: DecodeCase, **kwargs: Any) -> None:
        reason = missing()
        if reason:
            raise PathMissing(reason)
        super().__init__(case, **kwargs)
        self.model_runner.decode_cuda_graph_runner = self.runner

    def scope(self) -> contextlib.AbstractContextManager:
        """The Triton interpreter, pinned host memory (SGLang stages host-side counts there), and CUDA's graph rule
        for the model runner's dispatch: `_forward_raw` asks `ForwardMode.is_cpu_graph` (DECODE only: SGLang's CPU
        graph runner) when the runner's device is "cpu", as it is on the virtual device, where under the cuda
        personality the runner is a CUDA graph runner, whose rule (`is_cuda_graph`: IDLE too) a GPU applies."""
        from unittest import mock

        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        stack = contextlib.ExitStack()
        stack.enter_context(kernels())
        stack.enter_context(pinned_host_memory())
        stack.enter_context(mock.patch.object(ForwardMode, "is_cpu_graph", ForwardMode.is_cuda_graph))
        return stack

    def _runner_double(self, case: DecodeCase, device: str):
        """SGLang's `ModelRunner`, constructor skipped, carrying the double's attributes (but not its stand-in for
        `attn_tp_sequence_sharded`: the class's own rule applies)."""
        from sglang.srt.distributed import parallel_state

        from harness.targets.sglang_plumbing import load

        double = super()._runner_double(case, device)
        model_runner_class = load(MODEL_RUNNER_MODULE, "ModelRunner")
        runner = model_runner_class.__new__(model_runner_class)
        attributes = {k: v for k, v in vars(double).items() if k != "attn_tp_sequence_sharded"}
        attributes.update(pp_group=parallel_state.get_pp_group(), prefill_cuda_graph_runner=None,
                          decode_cuda_graph_runner=None, max_running_requests=self.pools.requests,
                          max_total_num_tokens=KV_TOKENS, decode_attn_backend=None, support_pp=self._supports_pp(),
                          is_generation=True)
        for name, value in attributes.items():
            object.__setattr__(runner, name, value)
        return runner

    def _supports_pp(self) -> bool:
        """`ModelRunner.support_pp` as SGLang's constructor derives it: the model's forward takes the previous
        stage's hidden states."""
        import inspect

        return "pp_proxy_tensors" in inspect.signature(self.real.model.forward).parameters

    def make_model_runner(self, case: DecodeCase, device: str):
        """The runner, its attention backend the decode runner's, and SGLang's eager runner built on it before the
        decode runner is (SGLang's startup order)."""
        from harness.targets.sglang_plumbing import load

        runner = self._model_runner
        runner.attn_backend = runner.decode_attn_backend = self.attn_backend
        with self.scope():
            runner.eager_runner = load(EAGER_RUNNER_MODULE, "EagerRunner")(runner)
        return runner

    def serve(self, fb) -> Any:
        """One forward as the server makes it (`ModelRunner._forward_raw`): SGLang's `ModelRunnerOutput`."""
        with self.scope(), torch.no_grad():
            return self.model_runner._forward_raw(fb, None)

    def replay(self, batch: DecodeBatch):
        """A decode batch through the server's dispatch, which must pick the graph (the caller asked
        `can_replay`)."""
        output = self.serve(self.forward_batch(batch))
        if not output.can_run_graph:
            raise OracleFailure("admission", f"the runner admits a batch of {batch.batch_size} (captured "
                                f"{self.capture_bs}), but ModelRunner's dispatch ran it eager", batch=batch)
        return output.logits_output

    def serve_eager(self, fb, where: str):
        """A batch the server must run eager (a prefill; a decode batch no captured size holds) through its
        dispatch: the logits output."""
        output = self.serve(fb)
        if output.can_run_graph:
            raise OracleFailure("admission", f"{where}: ModelRunner's dispatch replayed a graph (captured "
                                f"{self.capture_bs}) for a {fb.forward_mode.name} batch of {fb.batch_size} that "
                                "no captured size holds")
        return output.logits_output
