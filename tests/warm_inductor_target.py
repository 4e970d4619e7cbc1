"""Run in a warm child by tests/test_mutate.py (not collected on its own): the warm parent's imports must leave
Inductor whole, so a mutant run's Inductor compile of a `bmm` lowers it (an import order that broke a circular
import once left `aten.bmm` without its lowering, and every such compile in a warm child failed)."""
import torch


def test_a_warm_child_lowers_a_bmm_with_inductor():
    from torch._inductor.lowering import lowerings

    assert torch.ops.aten.bmm.default in lowerings, "the warm parent's imports dropped Inductor's bmm lowering"
    compiled = torch.compile(lambda a, b: torch.bmm(a, b) * 2, backend="inductor")
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    torch.testing.assert_close(compiled(a, b), torch.bmm(a, b) * 2)
