"""SGLang's real KV-cache pools on the CPU, and the cached prefix a drawn decode batch reads.

`Pools(model_config, requests, tokens)`: SGLang's `ReqToTokenPool` (row 0 is SGLang's padding row), its
`MHATokenToKVPool` (K/V buffers per layer; an MLA model's `MLATokenToKVPool`, one latent buffer per layer), its
`TokenToKVPoolAllocator` (slot 0 reserved for padded writes) and its `KVIndexTranslator` (what attention backends
build their read indices through, 0.5.19 on; before, they read `req_to_token` themselves), as `ModelRunner` builds
them.

`stage(batch, seed)` plays the scheduler's part before a decode step: each request's row of `req_to_token` maps its
`seq_len` tokens to slots (the last one its `out_cache_loc`, where this step writes), and the prefix slots hold
K/V drawn from `seed`, as a prefill would have left them. `snapshot()` / `restore()` let eager run on exactly the
cache the replay saw.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from harness.errors import HarnessError


class Pools:
    def __init__(self, model_config: Any, requests: int, tokens: int, device: str = "cpu", attn_tp: int = 1) -> None:
        """`attn_tp`: the attention-TP width of the rank (its K/V hold that share of the KV heads)."""
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        from harness.versions import module_exists

        self.requests, self.tokens = requests, tokens
        self.staged_slots: list[list[int]] = []  # per request of the last staged batch, its KV slots in order
        self.req_to_token_pool = ReqToTokenPool(size=requests, max_context_len=model_config.context_len,
                                                device=device, enable_memory_saver=False)
        from sglang.srt.configs.model_config import AttentionArch

        self.mla = model_config.attention_arch == AttentionArch.MLA
        if self.mla:  # one latent buffer per layer: kv_lora_rank + the rope part, as ModelRunner sizes it
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

            self.token_to_kv_pool = MLATokenToKVPool(
                size=tokens, page_size=1, dtype=torch.float32, kv_lora_rank=model_config.kv_lora_rank,
                qk_rope_head_dim=model_config.qk_rope_head_dim, layer_num=model_config.num_hidden_layers,
                device=device, enable_memory_saver=False)
        else:
            self.token_to_kv_pool = MHATokenToKVPool(
                size=tokens, page_size=1, dtype=torch.float32, head_num=model_config.get_num_kv_heads(attn_tp),
                head_dim=model_config.head_dim, layer_num=model_config.num_hidden_layers, device=device,
                enable_memory_saver=False, enable_alt_stream=False)
        self.allocator = TokenToKVPoolAllocator(tokens, torch.float32, device, self.token_to_kv_pool, False)
        self.translator = None
        if module_exists("sglang.srt.mem_cache.kv_index_translator"):
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

            self.translator = KVIndexTranslator(
                req_to_token=self.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=self.allocator,
                token_to_kv_pool=self.token_to_kv_pool, page_size=1, device=device)

    def bind(self, model_runner: Any) -> None:
        """Give a model runner (double) these pools, under the names SGLang's `ModelRunner` keeps them by."""
        for name, value in (("req_to_token_pool", self.req_to_token_pool), ("token_to_kv_pool", self.token_to_kv_pool),
                            ("token_to_kv_pool_allocator", self.allocator), ("kv_index_translator", self.translator)):
            if value is not None:
                setattr(model_runner, name, value)

    def buffers(self) -> list[tuple[str, torch.Tensor]]:
        pool = self.token_to_kv_pool
        if self.mla:
            return [(f"kv_buffer[layer {layer}]", buffer) for layer, buffer in enumerate(pool.kv_buffer)]
        return [(f"{kind}_buffer[layer {layer}]", buffers[layer]) for kind, buffers in
                (("k", pool.k_buffer), ("v", pool.v_buffer)) for layer in range(len(pool.k_buffer))]

    def stage(self, seq_lens: list[int], pool_rows: list[int], seed: int) -> list[int]:
        """Map each request's tokens to fresh slots from SGLang's allocator and fill the prefix K/V; returns the
        batch's `out_cache_loc` (each request's last slot)."""
        if any(not 1 <= row <= self.requests for row in pool_rows) or len(set(pool_rows)) != len(pool_rows):
            raise HarnessError(f"pool rows {pool_rows} must be distinct, within 1..{self.requests} (row 0 is "
                               "SGLang's padding row)")
        if sum(seq_lens) > self.tokens - 1:
            raise HarnessError(f"seq_lens {seq_lens} need {sum(seq_lens)} KV slots, the pool has {self.tokens - 1}")
        self.allocator.clear()
        slots = self.allocator.alloc(sum(seq_lens))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.req_to_token_pool.req_to_token.zero_()
            for _, buffer in self.buffers():
                buffer.copy_(torch.randn(buffer.shape, generator=generator))
            start, last, self.staged_slots = 0, [], []
            for row, length in zip(pool_rows, seq_lens):
                self.req_to_token_pool.req_to_token[row, :length] = slots[start:start + length]
                self.staged_slots.append(slots[start:start + length].tolist())
                start += length
                last.append(int(slots[start - 1]))
        return last

    def snapshot(self) -> list[torch.Tensor]:
        return [buffer.clone() for _, buffer in self.buffers()]

    def restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for (_, buffer), value in zip(self.buffers(), saved):
                buffer.copy_(value)


class HybridPools(Pools):
    """A hybrid-state model's pools, as SGLang's KV-cache configurator builds them on one rank (no speculative
    decoding; the Mamba extra buffer when `track`): `HybridReqToTokenPool` (its `MambaPool`: per linear-attention
    layer a conv state and a recurrent state per slot, slot 0 SGLang's padding slot) and `HybridLinearKVPool` (K/V
    for the full-attention layers only). `buffers()` lists the state per layer and kind, slot first, beside the K/V: a
    snapshot, a restore and a cache comparison cover the recurrent state as they cover the KV cache. `stage` also
    gives each request a state slot from SGLang's allocator, mapped from its pool row, its state drawn (what a
    prefill would have left); the other rows keep stale mappings onto those slots, as finished requests leave
    them."""

    def __init__(self, model_config: Any, requests: int, tokens: int, device: str = "cpu", track: bool = False) -> None:
        """`track`: the Mamba extra buffer (`--mamba-radix-cache-strategy extra_buffer`): each request also holds
        its ping-pong track slots, where a decode step checkpoints its state at every track interval."""
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool, MHATokenToKVPool

        text = model_config.hf_config.get_text_config()
        params = text.mamba2_cache_params
        self.requests, self.tokens, self.mla = requests, tokens, False
        self.staged_slots: list[list[int]] = []
        self.staged_states: list[int] = []  # per request of the last staged batch, its state slot
        self.staged_tracks: list[list[int]] = []  # and its ping-pong track slots (`track`)
        self.track = track
        self.state_layers = list(params.layers)
        self.full_layers = list(text.full_attention_layer_ids)
        self.req_to_token_pool = HybridReqToTokenPool(
            # a state slot a request, and under the extra buffer its two ping-pong track slots beside it
            size=requests, mamba_size=requests * 3 if track else requests, mamba_spec_state_size=requests,
            max_context_len=model_config.context_len, device=device, enable_memory_saver=False,
            cache_params=params, mamba_layer_ids=self.state_layers, enable_mamba_extra_buffer=track,
            speculative_num_draft_tokens=None, speculative_eagle_topk=None, enable_overlap_schedule=True,
            start_layer=0)
        self.token_to_kv_pool = HybridLinearKVPool(
            size=tokens, dtype=torch.float32, page_size=1, head_num=model_config.get_num_kv_heads(1),
            head_dim=model_config.head_dim, full_attention_layer_ids=self.full_layers, device=device,
            mamba_pool=self.req_to_token_pool.mamba_pool, enable_memory_saver=False, enable_kv_cache_copy=False,
            start_layer=0, full_kv_pool_class=MHATokenToKVPool, quant_method=None, post_capture_active=False,
            use_mla=False)
        self.allocator = TokenToKVPoolAllocator(tokens, torch.float32, device, self.token_to_kv_pool, False)
        self.translator = KVIndexTranslator(
            req_to_token=self.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=self.allocator,
            token_to_kv_pool=self.token_to_kv_pool, page_size=1, device=device)

    def buffers(self) -> list[tuple[str, torch.Tensor]]:
        full = self.token_to_kv_pool.full_kv_pool
        kv = [(f"{kind}_buffer[layer {layer}]", buffers[i]) for kind, buffers in
              (("k", full.k_buffer), ("v", full.v_buffer)) for i, layer in enumerate(self.full_layers)]
        cache = self.req_to_token_pool.mamba_pool.mamba_cache
        kinds = [(f"conv_state{i if len(cache.conv) > 1 else ''}", conv) for i, conv in enumerate(cache.conv)]
        kinds.append(("recurrent_state", cache.temporal))
        return kv + [(f"mamba {kind}[layer {layer}]", states[i]) for kind, states in kinds
                     for i, layer in enumerate(self.state_layers)]

    def stage(self, seq_lens: list[int], pool_rows: list[int], seed: int) -> list[int]:
        last = super().stage(seq_lens, pool_rows, seed)  # also draws every state slot's state
        pool = self.req_to_token_pool
        pool.mamba_allocator.clear()
        slots = pool.mamba_allocator.alloc(len(pool_rows)).tolist()
        # a row no request of the batch holds keeps the slot its finished request held, since handed to a live
        # request (SGLang frees the slot and leaves the row's mapping): a padded row that reads a stale row's
        # mapping instead of SGLang's sentinel then writes a live request's state. Row 0, the padding row, SGLang
        # never maps.
        idle = [row for row in range(1, self.requests + 1) if row not in pool_rows]
        with torch.no_grad():
            pool.req_index_to_mamba_index_mapping.zero_()
            for row, slot in [*zip(pool_rows, slots), *zip(idle, itertools.cycle(slots))]:
                pool.req_index_to_mamba_index_mapping[row] = slot
        self.staged_states, self.staged_tracks = slots, []
        if self.track:  # each request's ping-pong track slots, SGLang's allocator's too (stale on idle rows)
            width = pool.mamba_ping_pong_track_buffer_size
            tracks = pool.mamba_allocator.alloc(len(pool_rows) * width).view(len(pool_rows), width)
            mapping = pool.req_index_to_mamba_ping_pong_track_buffer_mapping
            with torch.no_grad():
                mapping.zero_()
                for row, pair in [*zip(pool_rows, tracks), *zip(idle, itertools.cycle(tracks))]:
                    mapping[row] = pair
            self.staged_tracks = tracks.tolist()
        return last

    def track_fields(self, seq_lens: list[int], interval: int) -> tuple[list[int], list[bool]]:
        """What SGLang's `prepare_for_decode` hands a decode batch under the extra buffer: each request's track
        destination (its ping-pong slot, alternating at each checkpoint) and whether this step checkpoints (its
        length a multiple of the track interval)."""
        indices = [pair[(n // interval) % len(pair)] for pair, n in zip(self.staged_tracks, seq_lens)]
        return indices, [n % interval == 0 for n in seq_lens]


def pools_for(model_config: Any, hybrid: bool, requests: int, tokens: int, device: str = "cpu",
              track: bool = False) -> Pools:
    """The pools SGLang builds for the model: hybrid ones for a hybrid-state family (with the Mamba extra buffer
    when `track`), else plain KV pools."""
    if hybrid:
        return HybridPools(model_config, requests, tokens, device, track=track)
    return Pools(model_config, requests, tokens, device)
