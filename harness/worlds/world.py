"""A drawn world: the parallel configuration, the served model and the program every rank plays.

`World` holds the parallel flags a user passes (`--tp`, `--pp`, `--dp`, `--enable-dp-attention`,
`--moe-dense-tp-size`) and the rank layout SGLang derives from them, written out here as arithmetic so that the
oracles can hold SGLang's own derivation to it: world rank w is TP rank w % tp of pipeline stage w // tp;
attention-DP ranks = dp with DP attention (else 1), attention-TP width = tp / that, and TP rank r serves
attention-DP rank r // attention-TP width. Every stage plays the same program (each holds its own layers' KV of
the same requests); a stage before the last hands its hidden states to the next, the last computes the logits.

A program is a tuple of iterations; an iteration gives each attention-DP rank one piece of work (`Admit` new
prompts: a prefill; `Decode`: a decode step of its running requests; `Idle`: nothing, the rank joins the DP group's
collectives with an idle batch; `Finish`: requests leave, then a decode step). Without DP attention every TP rank
serves one batch: the program has one column.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Admit:
    """New requests: their prompts (token ids), prefilled in one extend batch, then decoding with the others."""

    prompts: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class Decode:
    """One decode step of every running request of the rank."""


@dataclasses.dataclass(frozen=True)
class Finish:
    """The running requests at these positions finish (their KV and pool rows go back), then a decode step."""

    positions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Idle:
    """The attention-DP rank has no batch this iteration (SGLang gives it an idle batch if any other rank works)."""


Work = Admit | Decode | Finish | Idle


@dataclasses.dataclass(frozen=True)
class World:
    """The parallel flags of one server (module docstring)."""

    tp: int
    dp: int = 1
    dp_attention: bool = False
    moe_dense_tp: int | None = None  # --moe-dense-tp-size: 1 is DP-FFN (dense MLPs data parallel)
    ep: int = 1  # --ep-size: MoE experts spread over this many ranks
    pp: int = 1  # --pp-size: pipeline stages, each a TP group of `tp` ranks

    @property
    def ranks(self) -> int:
        """Processes: `pp` stages of a TP group each."""
        return self.tp * self.pp

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank_of(self, rank: int) -> int:
        return rank // self.tp

    @property
    def dp_ranks(self) -> int:
        """Attention-DP ranks (SGLang's `num_dp_ranks`)."""
        return self.dp if self.dp_attention else 1

    @property
    def attn_tp(self) -> int:
        return self.tp // self.dp_ranks

    def dp_rank_of(self, rank: int) -> int:
        """The attention-DP rank world rank `rank` serves (within its stage)."""
        return self.tp_rank_of(rank) // self.attn_tp

    def server_flags(self) -> dict:
        flags = dict(tp_size=self.tp, dp_size=self.dp, enable_dp_attention=self.dp_attention)
        if self.moe_dense_tp is not None:
            flags["moe_dense_tp_size"] = self.moe_dense_tp
        if self.ep != 1:
            flags["ep_size"] = self.ep
        if self.pp != 1:
            flags["pp_size"] = self.pp
        return flags

    # -- what SGLang must derive from the flags (utils/common.py's require_* rules, written out) ---------------
    @property
    def mlp_tp_gather(self) -> bool:
        """The MLP's input is all-gathered from every attention-DP rank: with DP attention, always in the worlds
        drawn here (SGLang exempts only a DP LM head with an all-to-all MoE backend, DeepEP or FlashInfer, whose
        kernels need a GPU)."""
        return self.dp_attention

    @property
    def attn_tp_gather(self) -> bool:
        """Attention's input is scattered over the attention-TP group (--moe-dense-tp-size set and more than one
        TP rank per attention-DP rank)."""
        if self.moe_dense_tp is None:
            return False
        return self.dp_ranks < self.tp if self.dp_attention else True

    @property
    def attn_tp_sharded(self) -> bool:
        """A padded batch's tokens are split over the attention-TP group (SGLang's `attn_tp_sequence_sharded`: it
        holds a gathered buffer, `require_gathered_buffer`)."""
        return self.mlp_tp_gather or self.attn_tp_gather

    @property
    def masks_pad_rows(self) -> bool:
        """The runner publishes the real token count to the model (`enable_num_token_non_padded`): with MoE expert
        parallelism (the other triggers, a ROCm DP-MoE mask and elastic joiners, are not drawn here)."""
        return self.ep > 1

    def non_padded(self, rank: int, real_tokens: int, bucket_tokens: int) -> int:
        """The pad mask TP rank `rank` holds for a batch of `real_tokens` padded to `bucket_tokens`
        (`compute_local_num_token_non_padded`): sharded, each attention-TP rank owns a contiguous chunk of
        bucket / width tokens, the padded bucket (not the real count) setting the chunk, so it keeps
        clamp(real - chunk x its attention-TP rank, 0, chunk); replicated, the real count."""
        if not self.attn_tp_sharded:
            return real_tokens
        chunk, attn_tp_rank = bucket_tokens // self.attn_tp, rank % self.attn_tp
        return min(max(real_tokens - chunk * attn_tp_rank, 0), chunk)

    @property
    def mlp_sync(self) -> bool:
        """Ranks agree on each iteration's batch shape before the forward (SGLang's `require_mlp_sync`)."""
        return self.dp_attention or self.mlp_tp_gather or self.attn_tp_gather

    def layout_error(self) -> str | None:
        """Why these flags make no rank layout (SGLang must refuse them), or None."""
        if self.dp_attention and (self.dp > self.tp or self.tp % self.dp):
            return f"--dp {self.dp} does not divide --tp {self.tp} into attention-DP groups"
        if self.tp % self.ep:
            return f"--ep-size {self.ep} does not divide --tp {self.tp}"
        if not self.dp_attention and self.dp != 1:
            return f"--dp {self.dp} without DP attention is {self.dp} servers (a router's), not one world"
        return None

    def requests_per_rank(self, max_running_requests: int) -> int:
        """The request pool of each attention-DP rank: `--max-running-requests` shared by the DP ranks, at least one
        (SGLang's `resolve_max_num_reqs`, the KV capacity ample)."""
        return max(1, max_running_requests // self.dp_ranks)

    def aligned(self, count: int, width: int | None = None) -> int:
        """`count` aligned up to `width` (default the capture alignment), as SGLang's `ceil_align`."""
        width = width or self.capture_alignment()
        return -(-count // width) * width

    def capture_alignment(self) -> int:
        """The factor every captured size is a multiple of: the attention-TP width when the runner gathers
        (`get_cuda_graph_batch_size_alignment`, no two-batch overlap, no context parallel)."""
        return self.attn_tp if (self.mlp_tp_gather or self.attn_tp_gather) else 1

    def capture_list(self, requested: tuple[int, ...], max_running_requests: int) -> list[int]:
        """The sizes SGLang captures for `--cuda-graph-bs requested` (`get_batch_sizes_to_capture`): the rank's
        request pool aligned up joins the list when a requested size exceeds it; sizes not a multiple of the
        alignment, or above the aligned pool, are dropped."""
        align = self.capture_alignment()
        pool = self.aligned(self.requests_per_rank(max_running_requests))
        sizes = list(requested) + ([pool] if max(requested) > pool else [])
        return sorted({s for s in sizes if s % align == 0 and s <= pool})

    def label(self) -> str:
        parts = [f"tp{self.tp}"] + ([f"pp{self.pp}"] if self.pp != 1 else [])
        if self.dp_attention:
            parts.append(f"dp{self.dp}-attention")
        if self.moe_dense_tp is not None:
            parts.append(f"moe-dense-tp{self.moe_dense_tp}")
        if self.ep != 1:
            parts.append(f"ep{self.ep}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class WorldCase:
    """One example: the world, the family served, the decode capture list asked for, the server's capacity, the
    program (one column per attention-DP rank) and the prefill graphs' token counts (`--cuda-graph-backend-prefill
    breakable`, CUDA's default; none: off)."""

    world: World
    family: str
    capture_bs: tuple[int, ...]
    max_running_requests: int
    program: tuple[tuple[Work, ...], ...]
    prefill_tokens: tuple[int, ...] = ()  # the breakable prefill graphs' token counts; () = prefill graphs off

    def drawn(self) -> dict:
        """The case as a record's drawn values (`from_drawn` rebuilds it: repro scripts, pinned regressions)."""
        return {"world": dataclasses.asdict(self.world), "world_label": self.world.label(), "family": self.family,
                "capture_bs": list(self.capture_bs), "max_running_requests": self.max_running_requests,
                "program": [[_work_record(work) for work in row] for row in self.program],
                "prefill_tokens": list(self.prefill_tokens)}

    @classmethod
    def from_drawn(cls, drawn: dict) -> WorldCase:
        program = tuple(tuple(_work_of(work) for work in row) for row in drawn["program"])
        return cls(World(**drawn["world"]), drawn["family"], tuple(drawn["capture_bs"]),
                   drawn["max_running_requests"], program, tuple(drawn.get("prefill_tokens", ())))


def _work_record(work: Work) -> dict:
    fields = {k: [list(p) for p in v] if k == "prompts" else list(v) for k, v in dataclasses.asdict(work).items()}
    return {"work": type(work).__name__.lower(), **fields}


def _work_of(record: dict) -> Work:
    kind = {"admit": Admit, "decode": Decode, "finish": Finish, "idle": Idle}[record["work"]]
    if kind is Admit:
        return Admit(tuple(tuple(p) for p in record["prompts"]))
    if kind is Finish:
        return Finish(tuple(record["positions"]))
    return kind()


def describe(work: Work) -> str:
    if isinstance(work, Admit):
        return f"admit {[len(p) for p in work.prompts]}-token prompts"
    if isinstance(work, Finish):
        return f"finish {list(work.positions)}, decode"
    return type(work).__name__.lower()
