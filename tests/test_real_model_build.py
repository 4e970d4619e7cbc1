"""Building SGLang's model classes from a written config (`harness.models.real`): what a missing class and a
configuration SGLang rejects look like. No capture: cheap."""
from __future__ import annotations

import dataclasses

import pytest

from harness.models import real


def test_a_missing_class_is_a_reason_naming_module_and_class(monkeypatch):
    ghost = dataclasses.replace(real.FAMILIES["dense"], name="ghost", architecture="GhostForCausalLM")
    monkeypatch.setitem(real.FAMILIES, "ghost", ghost)
    assert real.missing("ghost").endswith("has no sglang.srt.models.llama.GhostForCausalLM")
    assert real.missing("dense") is None


def test_a_config_sglang_rejects_surfaces_as_its_own_error(tmp_path):
    """A DeepSeek-V2 config without routed experts: SGLang's ModelConfig (through transformers' strict config
    class) refuses it, and that error is what the harness raises, unwrapped."""
    path = real.write_config(real.FAMILIES["mla"], str(tmp_path), n_routed_experts=None)
    with pytest.raises(Exception) as refused:
        real.model_config(path)
    assert "n_routed_experts" in str(refused.value)
    assert not type(refused.value).__module__.startswith("harness")


def test_a_draft_worker_without_a_method_the_target_calls_is_a_reason_naming_it(monkeypatch):
    """A release whose EAGLE draft worker lacks a method the draft target calls (an older layout) is a skip naming
    the class and the method, never an AttributeError mid-capture."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    from harness.targets.decode.eagle_draft import draft_missing

    assert draft_missing() is None
    monkeypatch.delattr(EagleDraftWorker, "_init_dsa_index_share_state")
    assert draft_missing().endswith("eagle_worker_v2.EagleDraftWorker lacks _init_dsa_index_share_state: this "
                                    "target drives the 0.5.2x EAGLE draft worker's layout")
