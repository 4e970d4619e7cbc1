"""What SGLang's piecewise compile installs when Inductor compiles the pieces (`dynamo-contract`), and what a piece
served from SGLang's compile cache computes (`graph-replay`). Evidence comes from
`harness.targets.prefill.inductor` as plain values; the expectations come from the case alone:

- adaptor compiles per session = pieces x (1 general + one per compile size); each (piece, size) compiled once;
- the Inductor config in force for each compile holds SGLang's `PostGradPassManager` as `post_grad_custom_post_pass`
  (the one its `SGLangBackend` configured), and a per-size compile runs with `set_inductor_config`'s tuning
  (`max_autotune`, `coordinate_descent_tuning`) on, the general one with the process defaults;
- SGLang's adaptor sends Inductor's and Triton's caches to two distinct sub-folders of its cache folder (so one
  folder carries the whole cache to another machine, and neither writes among SGLang's own files);
- SGLang's cache file, read back by the next session, holds one handle per (size or None, piece, "inductor");
- a piece loaded from those handles gives the fresh piece's outputs, bit for bit (the same compiled artifact).
"""
from __future__ import annotations

from collections.abc import Iterable

from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager

ORACLE = "dynamo-contract"
REPLAY = "graph-replay"


def _shape(shape: int | None) -> str:
    return "the general (dynamic) shape" if shape is None else f"token count {shape}"


def expected_keys(pieces: int, compile_sizes: Iterable[int]) -> list[tuple]:
    """(shape, piece) pairs SGLang compiles: every piece for None (general) and for each compile size.
    Example: 3 pieces, sizes (8,) -> 3 x (1 + 1) = 6 compiles."""
    return [(shape, index) for shape in (None, *sorted(compile_sizes)) for index in range(pieces)]


def check_compiles(compiles: list, *, pieces: int, compile_sizes: Iterable[int], pass_managers: list,
                   what: str) -> dict:
    """One adaptor compile per (shape, piece) of `expected_keys`, each under SGLang's post-grad pass manager, the
    per-size ones tuned by `set_inductor_config`. `pass_managers`: each piece's SGLangBackend's manager."""
    import torch._inductor.config as inductor_config

    from sglang.srt.compilation.pass_manager import PostGradPassManager

    sizes = sorted(set(compile_sizes))
    expected = expected_keys(pieces, sizes)
    got = [(record.shape, record.index) for record in compiles]
    if len(got) != len(expected) or sorted(got, key=str) != sorted(expected, key=str):
        missing = [key for key in expected if key not in got]
        extra = [key for key in got if key not in expected or got.count(key) > 1]
        first = (f"; no specialised compile of piece {missing[0][1]} for {_shape(missing[0][0])}"
                 if missing and missing[0][0] is not None else "")
        raise OracleFailure(ORACLE, f"{what}: {len(got)} adaptor compile(s), expected {len(expected)} = {pieces} "
                            f"pieces x (1 general + {len(sizes)} compile size(s) {tuple(sizes)}){first}",
                            missing=missing, unexpected=extra, compiles=got)
    defaults = {name: getattr(inductor_config, name) for name in ("max_autotune", "coordinate_descent_tuning")}
    for record in compiles:
        where = f"{what}: piece {record.index}, {_shape(record.shape)}"
        if not record.post_grad_pass:
            raise OracleFailure(ORACLE, f"{where}: Inductor's compile_fx_inner never ran under SGLang's "
                                "pass context, so no Inductor config can be judged", record=record)
        for installed in record.post_grad_pass:
            if not isinstance(installed, PostGradPassManager):
                raise OracleFailure(ORACLE, f"{where}: post_grad_custom_post_pass in the Inductor config that ran is "
                                    f"{installed!r}, expected SGLang's PostGradPassManager (SGLangBackend."
                                    "configure_post_pass installs it in the inductor config it builds)",
                                    installed=repr(installed))
            if not any(installed is manager for manager in pass_managers):
                raise OracleFailure(ORACLE, f"{where}: post_grad_custom_post_pass is a PostGradPassManager other "
                                    "than the one the piece's SGLangBackend configured", installed=repr(installed))
        for name, values in (("max_autotune", record.max_autotune),
                             ("coordinate_descent_tuning", record.coordinate_descent_tuning)):
            want = True if record.shape is not None else defaults[name]
            if any(value != want for value in values):
                raise OracleFailure(ORACLE, f"{where}: Inductor config {name}={values[0]}, expected {want} "
                                    f"(set_inductor_config turns it on for a runtime shape only)",
                                    attribute=name, values=values)
    return {"adaptor_compiles": len(got), "pieces": pieces, "compile_sizes": sizes}


def check_cache_layout(redirected: list[dict], *, what: str) -> dict:
    """Each `InductorAdaptor.initialize_cache` left `TORCHINDUCTOR_CACHE_DIR` and `TRITON_CACHE_DIR` on two distinct
    folders strictly inside SGLang's cache folder (its `cache_dir` less the rank prefix), both created."""
    import os

    for entry in redirected:
        if entry["disabled"]:
            continue
        cache_dir, prefix = entry["cache_dir"], entry["prefix"]
        base = os.path.normpath(cache_dir[: -len(prefix)] if prefix else cache_dir)
        folders = {name: entry[name] for name in ("inductor", "triton")}
        for name, folder in folders.items():
            inside = folder is not None and os.path.commonpath([base, os.path.normpath(folder)]) == base \
                and os.path.normpath(folder) != base
            if not inside or not os.path.isdir(folder):
                raise OracleFailure(ORACLE, f"{what}: after initialize_cache({cache_dir!r}) {name.title()}'s cache is "
                                    f"{folder!r}, where it must be a folder of its own inside SGLang's cache folder "
                                    f"{base!r}" + ("" if inside else " (it is not strictly inside)"),
                                    **folders, base=base)
        if os.path.normpath(folders["inductor"]) == os.path.normpath(folders["triton"]):
            raise OracleFailure(ORACLE, f"{what}: Inductor and Triton share the cache folder {folders['inductor']!r}",
                                **folders)
    return {"cache_folders": len(redirected)}


def check_cache_read(cache: dict, *, pieces: int, compile_sizes: Iterable[int], what: str) -> dict:
    """SGLang read back one inductor handle (hash, file) per (shape, piece): what the first session compiled."""
    expected = {(shape, index, "inductor") for shape, index in expected_keys(pieces, compile_sizes)}
    if set(cache) != expected:
        missing = sorted(expected - set(cache), key=str)
        raise OracleFailure(ORACLE, f"{what}: SGLang's compile cache file holds {len(cache)} handle(s), expected "
                            f"{len(expected)} (shape, piece, 'inductor') = {pieces} pieces x (1 + "
                            f"{len(set(compile_sizes))} compile sizes)"
                            + (f"; missing piece {missing[0][1]} for {_shape(missing[0][0])}" if missing else ""),
                            missing=missing, unexpected=sorted(set(cache) - expected, key=str))
    for key, handle in cache.items():
        if not (isinstance(handle, tuple) and len(handle) == 2 and all(isinstance(h, str) for h in handle)):
            raise OracleFailure(ORACLE, f"{what}: handle {key} is {handle!r}, expected (hash, file path) strings "
                                "(InductorAdaptor.load asserts that shape)", key=key)
    return {"cache_handles": len(cache)}


def check_loaded(fresh: dict, loaded: dict, *, what: str) -> dict:
    """Every piece SGLang keyed a handle for was loaded and gives the fresh piece's outputs bit for bit (`fresh`:
    (shape, piece) -> (args, output leaves, indices of uninitialised leaves left out); `loaded`: the same leaves)."""
    absent = sorted(set(fresh) - set(loaded), key=str)
    if absent:
        shape, index = absent[0]
        raise OracleFailure(REPLAY, f"{what}: piece {index} for {_shape(shape)} could not be served from SGLang's "
                            "compile cache", absent=absent)
    for (shape, index), (_, output, _skipped) in sorted(fresh.items(), key=str):
        try:
            assert_matches_eager(loaded[(shape, index)], output, exact=True)
        except OracleFailure as failure:
            raise OracleFailure(REPLAY, f"{what}: piece {index} for {_shape(shape)} loaded from SGLang's compile "
                                f"cache differs from the freshly compiled piece: {failure.diagnosis}",
                                **failure.details) from failure
    return {"loaded_pieces": len(loaded)}
