"""Parallel worlds, as data: what a world is and what its ranks report.

A world is a parallel configuration (`world.World`: tensor parallel, attention data parallel, attention-TP gathers)
with the rank layout SGLang derives from it written out as arithmetic, and a program of scheduler iterations in
which each attention-DP rank has its own load (`world.Admit` new prompts, `Decode`, `Finish`, or `Idle`). A rank
reports what it did and saw as a `record.RankRecord`. The processes that serve a world live in
`harness.targets.worlds`; the oracles that judge it in `harness.oracles.world_agreement`. This package imports
neither, so both can read it.
"""
