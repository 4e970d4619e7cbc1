"""One rank's server: SGLang's decode runner (and, drawn, its breakable prefill runner) on a real model, driven by
SGLang's scheduler code, inside a world.

`WorldTarget` is the real-model decode target (`harness.targets.decode.real_model`) placed in a world: its server
args carry the world's flags and are published for this rank; the model is SGLang's class loaded by SGLang's loader
from a transformers checkpoint (the loader keeps this rank's shard); the KV pools hold this rank's attention heads;
the model runner is SGLang's own `ModelRunner` class with its constructor skipped, so that `_forward_raw` (graph
or eager, the eager DP padding, the MLP-sync post-processing) and `attn_tp_sequence_sharded` are SGLang's.

`RankServer.play(program)` runs each iteration as SGLang's scheduler does: the rank's local batch (a prefill of
new prompts, a decode step, or none), `prepare_mlp_sync_batch_raw` when the world syncs (the DP group's gather of
token counts and votes, an idle batch for an idle rank), the decode-to-extend conversion
(`SchedulerDPAttnAdapter.maybe_convert_decode_to_extend`), `ForwardBatch.init_new`, `ModelRunner._forward_raw`, the
greedy next tokens. Before each forward the ranks exchange what their runner decided (graph or eager, the bucket
it padded to) on a gloo group of the harness's own: ranks that disagree would run different collectives and hang,
so the disagreement is reported instead (`world-agreement`). After a replay, the same batch runs again eager on
the cache the replay saw (every rank in step, since eager's collectives are collective too) and the logits and KV
cache must agree.
"""
from __future__ import annotations

import time
import traceback

import torch

from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager
from harness.oracles.recompile import RecompileWatcher
from harness.oracles.world_agreement import ITERATION_MARK
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_model import KV_TOKENS, _cache_difference, kernels
from harness.targets.decode.served import ServedTarget
from harness.targets.decode.scheduled import Scheduler
from harness.worlds.record import IterationRecord, RankRecord, RequestRow, said
from harness.worlds.world import Admit, Decode, Finish, WorldCase, describe


class WorldTarget(ServedTarget):
    """See the module docstring. `checkpoint`: the folder of the family's transformers checkpoint."""

    def __init__(self, case: WorldCase, *, rank: int, checkpoint: str, dist_port: int) -> None:
        self.world, self.world_rank, self.checkpoint, self.dist_port = case.world, rank, checkpoint, dist_port
        self.prefill_tokens = case.prefill_tokens
        decode_case = DecodeCase(capture_bs=case.capture_bs, max_running_requests=case.max_running_requests)
        super().__init__(decode_case, family=case.family)
        self.prefill_runner = self.capture_prefill() if self.prefill_tokens else None

    def make_model_runner(self, case: DecodeCase, device: str):
        """The served runner, with SGLang's own shared logits buffer where the world captures prefill graphs (its
        `cuda_graph_setup` makes it before any runner: `GraphSharedOutput.create_for_model_runner`, sized by the
        runner's `max_shared_logits_buffer_rows`), which the prefill runner's capture reads."""
        runner = super().make_model_runner(case, device)
        if self.prefill_tokens:
            from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

            object.__setattr__(runner, "graph_shared_output", GraphSharedOutput.create_for_model_runner(runner))
        return runner

    def prefill_phase(self, case: DecodeCase) -> dict:
        """`--cuda-graph-backend-prefill breakable` with the case's token counts, where the case asks for prefill
        graphs (SGLang's default on CUDA); SGLang's config resolution then applies its DP rules to them."""
        if not self.prefill_tokens:
            return {}
        from sglang.srt.model_executor.cuda_graph_config import PhaseConfig

        return {"prefill": PhaseConfig(backend="breakable", bs=list(self.prefill_tokens))}

    def capture_prefill(self):
        """SGLang's `PrefillCudaGraphRunner` on this rank's model runner, captured after the decode graphs (the
        order of SGLang's `cuda_graph_setup`): the runner `_forward_raw` and the DP vote then consult for every
        extend batch. The attributes it reads that SGLang's `ModelRunner` derives at load time are set from the
        model (its `RadixAttention` layers)."""
        from sglang.srt.layers.radix_attention import RadixAttention

        from harness.targets.prefill.v0_5_14 import RUNNER_MODULE
        from harness.targets.sglang_plumbing import load

        runner = self.model_runner
        layers = [m for m in self.real.model.modules() if isinstance(m, RadixAttention)]
        for name, value in dict(attention_layers=layers, mha_companion_layers=[None] * len(layers),
                                moe_layers=[None] * len(layers), moe_fusions=[None] * len(layers)).items():
            if getattr(runner, name, None) is None:
                object.__setattr__(runner, name, value)
        with self.scope():
            runner.prefill_cuda_graph_runner = load(RUNNER_MODULE, "PrefillCudaGraphRunner")(runner)
        return runner.prefill_cuda_graph_runner

    def server_flags(self, case: DecodeCase) -> dict:
        return {**super().server_flags(case), **self.world.server_flags()}

    def publish_config(self, case: DecodeCase, device: str):
        """Publish this rank's config, then (once per process) bring up SGLang's parallel runtime from it, as a
        scheduler process does: `init_parallel_runtime` (gloo on the CPU) builds the TP, attention-TP/DP and world
        groups and the DP-attention state."""
        server_args = super().publish_config(case, device)
        from sglang.srt.distributed import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            from sglang.srt.distributed.bootstrap import init_parallel_runtime

            init_parallel_runtime(server_args=server_args, device=device, dist_port=self.dist_port)
        return server_args

    def load_model(self):
        from sglang.srt.distributed.bootstrap import init_layer_runtime

        from harness.models.real.transformers_reference import load_sglang

        real = load_sglang(self.family, self.checkpoint)
        init_layer_runtime(model_config=real.model_config)  # the DP gathered buffer, sized from the model
        return real

    def make_pools(self, case: DecodeCase, device: str):
        """This rank's pools: its request rows as SGLang's KV-cache configurator resolves them for the DP layout
        (`resolve_max_num_reqs`: the running requests shared by the attention-DP ranks), its attention heads."""
        from types import SimpleNamespace

        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
        from sglang.srt.runtime_context import get_parallel

        from harness.models.real.pools import Pools

        resolver = SimpleNamespace(model_config=self.real.model_config, attn_dp_size=get_parallel().num_dp_ranks,
                                   mambaish_config=None)
        rows = KVCacheConfigurator.resolve_max_num_reqs(resolver, KV_TOKENS)
        return Pools(self.real.model_config, rows, KV_TOKENS, device, attn_tp=self.world.attn_tp)


class RankServer:
    """This rank's server and its scheduler (module docstring)."""

    def __init__(self, case: WorldCase, rank: int, checkpoint: str, dist_port: int) -> None:
        import torch.distributed as dist

        self.case, self.rank = case, rank
        started = time.perf_counter()
        self.target = WorldTarget(case, rank=rank, checkpoint=checkpoint, dist_port=dist_port)
        self.dp_rank = case.world.dp_rank_of(rank)  # after SGLang accepted the layout
        self.seconds = {"build_and_capture": time.perf_counter() - started}
        self.group = dist.new_group(backend="gloo")  # the harness's own channel between the ranks
        self.scheduler = Scheduler(self.target)
        self.stages = Stages(case.world, rank, self.group)
        self.runner = self.target.runner
        self.model_runner = self.target.model_runner

    def placement(self) -> dict:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return {name: getattr(parallel, name, None) for name in (
            "tp_rank", "tp_size", "attn_tp_rank", "attn_tp_size", "attn_dp_rank", "num_dp_ranks", "attn_dp_enabled",
            "pp_rank", "pp_size")}

    def play(self) -> RankRecord:
        """The program, iteration by iteration; whatever stops it is the record's failure, the iterations played
        before it kept."""
        record = RankRecord(self.rank, self.placement(), list(self.runner.capture_bs), seconds=self.seconds)
        prefill = self.target.prefill_runner
        record.prefill_capture = [] if prefill is None else [int(n) for n in prefill.capture_num_tokens]
        started = time.perf_counter()
        index = -1
        try:
            with RecompileWatcher(f"rank {self.rank}'s model") as watcher:
                watcher.arm()
                warmed: set[str] = set()
                for index, row in enumerate(self.case.program):
                    record.iterations.append(self.iterate(index, row[self.dp_rank] if len(row) > 1 else row[0]))
                    self.check_compiles(watcher, record.iterations[-1], warmed)
        except OracleFailure as failure:
            record.failure = {"oracle": failure.oracle, "diagnosis": failure.diagnosis,
                              "details": {key: str(value)[-3000:] for key, value in failure.details.items()},
                              "traceback": traceback.format_exc()[-3000:]}
        except Exception as error:  # noqa: BLE001 - SGLang's own error, in the record with where it happened
            traceback.print_exc()
            record.failure = {"oracle": "world-rank", "diagnosis": f"iteration {index}: {said(error)}",
                              "traceback": traceback.format_exc()[-3000:]}
        record.seconds["program"] = time.perf_counter() - started
        return record

    @staticmethod
    def check_compiles(watcher: RecompileWatcher, row: IterationRecord, warmed: set[str]) -> None:
        """SGLang's in-model compiled helpers (`torch.compile` inside its layers: at TP > 1 the vocabulary-parallel
        embedding's `get_masked_input_and_mask`, dynamic) compile their variants at capture, and a forward mode's
        first batch at serve time (eager, or a replay's eager twin) may compile once more (a server's warm-up
        request); after that only Dynamo's bounded variants may compile (`recompile.size_class_compile`: the
        size-1 frame, a view's base); any other compile is a guard that fails per size or per state, at serve
        time."""
        from harness.oracles.recompile import size_class_compile

        first = row.forward_mode is not None and row.forward_mode not in warmed
        if first:
            warmed.add(row.forward_mode)
        elif not (watcher.guard_failures and all(size_class_compile(text) for text in watcher.guard_failures)):
            watcher.check(f"iteration {row.index} ({row.work}, {row.forward_mode} "
                          f"{'replayed' if row.graph else 'eager'}), after every forward mode's first batch")
        watcher.arm()

    # -- one iteration ---------------------------------------------------------------------------------------
    def local_batch(self, work):
        """The ScheduleBatch this rank brings to the iteration (None: nothing)."""
        scheduler = self.scheduler
        if isinstance(work, Admit):
            return scheduler.extend_batch(work.prompts)
        if isinstance(work, Finish):
            scheduler.finish(work.positions)
        if isinstance(work, (Decode, Finish)) and scheduler.running is not None and scheduler.running.reqs:
            with kernels():
                scheduler.running.prepare_for_decode()
            return scheduler.running
        return None

    def synced(self, local):
        """SGLang's MLP sync of the iteration (`prepare_mlp_sync_batch_raw`): the gathered counts and the vote set on
        the batch, an idle batch when this rank has none and another works."""
        if not self.case.world.mlp_sync:
            return local
        from sglang.srt.managers.scheduler_components.dp_attn import prepare_mlp_sync_batch_raw
        from sglang.srt.utils.common import require_mlp_tp_gather

        with self.target.scope():
            return prepare_mlp_sync_batch_raw(
                local, self.model_runner, self.idle_batch, disable_cuda_graph=False,
                require_mlp_tp_gather=require_mlp_tp_gather(), disable_overlap_schedule=True, offload_tags=set())

    def idle_batch(self):
        """SGLang's idle batch (`SchedulerDPAttnAdapter.get_idle_batch`)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        pools = self.scheduler.pools
        batch = ScheduleBatch.init_new([], pools.req_to_token_pool, pools.allocator, self.scheduler.tree_cache,
                                       self.model_runner.model_config, False, SpeculativeAlgorithm.NONE)
        batch.prepare_for_idle()
        return batch

    def iterate(self, index: int, work) -> IterationRecord:
        print(f"{ITERATION_MARK} {index} ({describe(work)})", flush=True)  # where a rank that dies was
        local = self.local_batch(work)
        batch = self.synced(local)
        row = IterationRecord(index, describe(work), None, 0 if local is None else _tokens(local), None, None,
                              False, None, None, None)
        if batch is None:
            return row
        if self.case.world.mlp_sync:  # the scheduler's next step after the sync (a no-op without prefill graphs)
            from sglang.srt.managers.scheduler_components.dp_attn import SchedulerDPAttnAdapter

            decoding = batch.forward_mode.is_decode()
            batch = SchedulerDPAttnAdapter.maybe_convert_decode_to_extend(None, batch)  # reads no adapter state
            row.converted = decoding and batch.forward_mode.is_extend()
            if self.target.prefill_runner is not None:
                row.prefill_vote = bool(batch.can_run_dp_prefill_cuda_graph)
        row.forward_mode = batch.forward_mode.name
        row.global_num_tokens = list(batch.global_num_tokens) if batch.global_num_tokens is not None else None
        row.vote = getattr(batch, "can_run_decode_cuda_graph", None) if self.case.world.mlp_sync else None
        fb = self.scheduler.forward_batch(batch)
        decision = self.decide(batch, fb, row)
        self.agree(index, decision)
        before = self.scheduler.pools.snapshot()
        proxy = self.stages.receive()
        with self.target.scope(), torch.no_grad():
            output = self.model_runner._forward_raw(fb, proxy)
        row.graph = bool(output.can_run_graph)
        row.prefill_graph = row.graph and decision[0] == "prefill"
        produced = self.stages.produced(output.logits_output)
        self.stages.send(output.logits_output)
        rows = len(batch.reqs)
        if row.graph:
            self.eager_twin(batch, produced, proxy, before, row)
        if rows:
            logits = produced.get("next_token_logits")
            if logits is not None:
                row.requests = [RequestRow(req.rid, Scheduler.history(req), logits[i].tolist())
                                for i, req in enumerate(batch.reqs)]
            next_ids = self.stages.next_tokens(None if logits is None else logits[:rows].argmax(-1))
            self.advance(batch, next_ids, isinstance(work, Admit))
        return row

    def decide(self, batch, fb, row: IterationRecord) -> tuple:
        """What this rank decides for `fb` before any collective, as (runner, graph, bucket): an extend batch (or
        an idle one SGLang pads into a dummy extend) asks the prefill runner, when the world captured one; any
        other the decode runner, whose `load_batch` gives the bucket (and the pad mask it writes)."""
        prefill = self.target.prefill_runner
        if prefill is not None and (fb.forward_mode.is_extend() or fb.forward_mode.is_idle()):
            # `_forward_raw` asks the prefill runner after SGLang's DP padding (`_prepare_eager_forward_batch`: with
            # the group's vote, every rank padded to one captured bucket, an idle rank a dummy extend): asked of
            # a twin of the batch, padded the same way
            probe = self.scheduler.forward_batch(batch)
            with self.target.scope():
                self.model_runner._prepare_eager_forward_batch(probe)
                if probe.forward_mode.is_extend():
                    graph = bool(prefill.can_run_graph(probe))
                    if graph:
                        row.bucket = int(prefill._pad_to_bucket(len(probe.input_ids), prefill.capture_num_tokens))
                    return "prefill", graph, row.bucket
        mode_check = fb.forward_mode.is_cuda_graph
        graph = bool(mode_check() and self.runner.can_run_graph(fb))
        if graph:
            with self.target.scope():
                self.runner.load_batch(fb)
            row.bucket, row.raw_bs = int(self.runner.bs), int(self.runner.raw_bs)
            buffer = getattr(self.runner.buffers, "num_token_non_padded", None)
            row.non_padded = None if buffer is None else int(buffer.reshape(-1)[0])
        return "decode", graph, row.bucket

    def agree(self, index: int, decision: tuple) -> None:
        import torch.distributed as dist

        decisions = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(decisions, decision, group=self.group)
        if len({(kind if graph else "eager", graph, bucket) for kind, graph, bucket in decisions}) > 1:
            described = ", ".join(f"rank {r}: {kind} {'graph' + (', bucket ' + str(b) if b else '') if g else 'eager'}"
                                  for r, (kind, g, b) in enumerate(decisions))
            raise OracleFailure("world-agreement", f"iteration {index}: the ranks' graph runners decided "
                                f"differently before the forward ({described}); ranks that replay different "
                                "graphs, or one a graph and another eager, run different collectives",
                                decisions=decisions)

    def eager_twin(self, batch, replayed: dict, proxy, before: list, row: IterationRecord) -> None:
        """The batch again, eager (both graph runners hidden from `_forward_raw`), on the cache the replay saw and
        the hidden states the previous stage handed over (their real rows: `Stages.real_rows`): what it produces
        (the logits; before the last stage the hidden states it hands on) within float32 tolerance of the
        replay's (the graph's GEMMs run padded rows) and the KV cache it leaves equal, slot 0 (SGLang's padding
        slot) aside."""
        pools = self.scheduler.pools
        after_replay = pools.snapshot()
        pools.restore(before)
        fb = self.scheduler.forward_batch(batch)
        model_runner = self.model_runner
        runners = model_runner.decode_cuda_graph_runner, model_runner.prefill_cuda_graph_runner
        model_runner.decode_cuda_graph_runner = model_runner.prefill_cuda_graph_runner = None
        try:
            with self.target.scope(), torch.no_grad():
                eager = self.stages.produced(model_runner._forward_raw(fb, self.stages.real_rows(proxy, batch))
                                             .logits_output)
        finally:
            model_runner.decode_cuda_graph_runner, model_runner.prefill_cuda_graph_runner = runners
        row.eager_twin = True
        after_eager = pools.snapshot()
        pools.restore(after_replay)
        rows = _tokens(batch) if self.stages.hands_on else len(batch.reqs)
        try:
            assert_matches_eager({k: v[:rows] for k, v in replayed.items()},
                                 {k: v[:rows] for k, v in eager.items()}, exact=False)
            cache = _cache_difference(pools, after_replay, after_eager, exact=False)
            if cache:
                row.replay_vs_eager = f"the KV cache the replay left differs from eager's: {cache}"
        except OracleFailure as failure:
            row.replay_vs_eager = failure.diagnosis
        if row.replay_vs_eager and self.stages.count > 1:
            row.replay_vs_eager = f"pipeline stage {self.stages.stage}: {row.replay_vs_eager}"

    def advance(self, batch, next_ids: torch.Tensor, admitted: bool) -> None:
        scheduler = self.scheduler
        scheduler.advance(batch, next_ids)
        if admitted:
            if scheduler.running is None or not scheduler.running.reqs:  # the scheduler starts a new running batch
                scheduler.running = batch
            else:
                scheduler.running.merge_batch(batch)


class Stages:
    """The pipeline around this rank, as SGLang's PP scheduler hands work between stages: a stage before the last
    sends the hidden states its forward returns (`PPProxyTensors`) to the next stage's rank over SGLang's PP group
    (`send_tensor_dict`), which passes them to its forward; the last stage's greedy tokens go back to every rank
    (the harness's own group) for the next iteration. Without pipeline parallelism every method is a no-op."""

    def __init__(self, world, rank: int, group) -> None:
        self.world, self.group = world, group
        self.stage, self.count = world.pp_rank_of(rank), world.pp
        self.hands_on = self.stage < self.count - 1  # its forward returns hidden states, not logits

    def _pp_group(self):
        from sglang.srt.distributed import parallel_state

        return parallel_state.get_pp_group()

    def receive(self):
        """The previous stage's hidden states for this iteration's forward (None on the first stage)."""
        if self.stage == 0:
            return None
        from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

        return PPProxyTensors(self._pp_group().recv_tensor_dict())

    def real_rows(self, proxy, batch):
        """What an eager previous stage would have handed over: the received hidden states down to the batch's
        tokens. A previous stage that replayed hands on its bucket's rows (the decode runner slices its
        `PPProxyTensors` to `bs * captured_req_width`, the padded size), which this stage's replay copies into its
        static buffer whole; an eager forward of the batch takes its own tokens only."""
        if proxy is None:
            return None
        from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

        tokens = _tokens(batch)
        return PPProxyTensors({name: tensor[:tokens] for name, tensor in proxy.tensors.items()})

    def send(self, output) -> None:
        if self.hands_on:
            self._pp_group().send_tensor_dict(output.tensors)

    def produced(self, output) -> dict:
        """What the forward produced, by name, cloned out of any graph buffer: the next-token logits, or the
        hidden states a stage hands on."""
        if self.hands_on:
            return {name: tensor.clone() for name, tensor in output.tensors.items()}
        return {"next_token_logits": output.next_token_logits.clone()}

    def next_tokens(self, mine: torch.Tensor | None) -> torch.Tensor:
        """The iteration's next tokens, from the last stage's first rank to every rank."""
        if self.count == 1:
            return mine
        import torch.distributed as dist

        box = [None if mine is None else mine.tolist()]
        dist.broadcast_object_list(box, src=(self.count - 1) * self.world.tp, group=self.group)
        return torch.tensor(box[0], dtype=torch.int64)


def _tokens(batch) -> int:
    """The tokens a local batch brings (its extend tokens, or one per decoding request)."""
    if batch.forward_mode.is_decode():
        return batch.batch_size()
    return int(batch.extend_num_tokens)

