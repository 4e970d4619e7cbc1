"""The selected gate against the full one: seconds and test items of `gate --select` on one-line changes of
different files (each a mutant: the selected gate must still fail on it), beside the full gate of every suite.
The line map is the gate campaign's (`--map DIR`: reused when it is there, else built there first, as `gate
--select` does; that campaign's seconds printed once).

    .venv/bin/python bench/bench_gate.py [--map reports/bench-gate-map] [-n 2] [--no-full]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.mutants import REPO_ROOT, scratch_sglang  # noqa: E402

CHANGES = {  # one line each, in three targeted files of different suites
    "decode runner: replay slices padded rows": ("srt/model_executor/runner/decode_cuda_graph_runner.py",
                                                 "output.next_token_logits[: self.raw_num_token]",
                                                 "output.next_token_logits[: self.bs * self.captured_req_width]"),
    "compile kwargs: mode beside options": ("multimodal_gen/runtime/utils/torch_compile.py",
                                            '"options" not in compile_kwargs\n            and backend == "inductor"',
                                            'backend == "inductor"'),
    "prefill runner: MIXED not normalised": ("srt/model_executor/runner/prefill_cuda_graph_runner.py",
                                             "            ForwardMode.EXTEND\n            if forward_batch.forward_"
                                             "mode == ForwardMode.MIXED\n",
                                             "            forward_batch.forward_mode\n            if forward_batch."
                                             "forward_mode == ForwardMode.MIXED\n"),
}


def gate(tree: Path, report: Path, workers: str, *extra: str) -> tuple[int, float, str]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "harness", "gate", str(tree), "--report-dir", str(report),
                           "-n", workers, *extra], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.returncode, time.monotonic() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--map", default="reports/bench-gate-map")
    parser.add_argument("-n", dest="workers", default="2")
    parser.add_argument("--no-full", action="store_true", help="skip the full gate")
    options = parser.parse_args()
    line_map, out = Path(options.map).resolve(), Path("reports/bench-gate").resolve()
    if not (line_map / "line_tests.json").exists():
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "harness", "campaign", "--report-dir", str(line_map), "-n",
                        options.workers], cwd=REPO_ROOT, capture_output=True)
        print(f"line map: the gate campaign with coverage took {time.monotonic() - started:.0f} s")
    print(f"{'change':<42}{'exit':>5}{'seconds':>9}{'items':>7}{'suites':>7}  unexecuted")
    for name, (file, old, new) in CHANGES.items():
        tree = scratch_sglang([(file, old, new)])
        code, seconds, text = gate(tree, out / name.split(":")[0].replace(" ", "-"), options.workers,
                                   "--select", str(line_map))
        chosen = next((line for line in text.splitlines() if "test item(s) and" in line), "")
        items = chosen.split("; ")[-1].split(" test item")[0] if chosen else "?"
        suites = chosen.split(" and ")[-1].split(" whole")[0] if chosen else "?"
        missed = sum(line.count(",") + 1 for line in text.splitlines() if "no test executed:" in line)
        print(f"{name:<42}{code:>5}{seconds:>9.1f}{items:>7}{suites:>7}  {missed}")
    if not options.no_full:
        code, seconds, _ = gate(scratch_sglang([]), out / "full", options.workers)
        print(f"{'full gate, clean tree':<42}{code:>5}{seconds:>9.1f}")


if __name__ == "__main__":
    main()
