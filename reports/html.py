"""One self-contained HTML page per run (no server, no scripts): per suite the examples, verdicts, time and
coverage of SGLang's targeted code; a picture of what was explored (two drawn dimensions, each cell shaded by
how many examples landed there and outlined red where one failed); then every failure with its drawn values,
oracle, diagnosis and replay command."""
from __future__ import annotations

import collections
import html
import json
from pathlib import Path

from harness import registry
from reports.summary import VERDICTS, expected_by_rule, load, ran_suites_coverage

def _points(picture, row: dict, x_key: str, y_key: str) -> list[tuple[str, str]]:
    """The cells one example lands in: its drawn (x, y), or each (y, x) pair it noted under `picture.note`."""
    if picture is not None and picture.note:
        return [(str(x), str(y)) for y, x in row.get("notes", {}).get(picture.note, [])]
    return [(_value(row["drawn"], x_key), _value(row["drawn"], y_key))]


COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#6a1b9a", "expected-error": "#ef6c00", "skip": "#757575"}


def _scalar_keys(drawn: dict) -> list[str]:
    return [k for k, v in drawn.items() if isinstance(v, (str, int, float, bool)) or v is None]


def _value(drawn: dict, key: str) -> str:
    value = drawn.get(key)
    return json.dumps(value) if not isinstance(value, str) else value


def _order(values: set[str]) -> list[str]:
    def key(text):
        try:
            return (0, float(text), text)
        except ValueError:
            return (1, 0.0, text)
    return sorted(values, key=key)


def picture(suite: str, rows: list[dict]) -> str:
    """An SVG grid: x and y are two drawn values; shade = examples there; red outline = a failure there."""
    drawn_rows = [r for r in rows if isinstance(r.get("drawn"), dict)]
    if not drawn_rows:
        return ""
    drawing = registry.picture(suite)
    x_key, y_key = (drawing.x, drawing.y) if drawing else (None, None)
    first = drawn_rows[0]["drawn"]
    if not (drawing and drawing.note) and (x_key not in first or y_key not in first):
        keys = _scalar_keys(first)
        if len(keys) < 2:
            return ""
        x_key, y_key = keys[0], keys[1]
    cells: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for row in drawn_rows:
        for point in _points(drawing, row, x_key, y_key):
            cells[point][row.get("verdict", "error")] += 1
    if not cells:
        return ""
    xs, ys = _order({x for x, _ in cells}), _order({y for _, y in cells})
    size, left, top = 40, 170, 8
    most = max(sum(c.values()) for c in cells.values())
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + size * len(xs) + 20}" '
             f'height="{top + size * len(ys) + 110}" font-family="sans-serif" font-size="11">']
    for j, y in enumerate(ys):
        parts.append(f'<text x="{left - 6}" y="{top + j * size + size / 2 + 4}" text-anchor="end">'
                     f'{html.escape(y[:26])}</text>')
    for i, x in enumerate(xs):
        cx = left + i * size + size / 2
        parts.append(f'<text transform="translate({cx},{top + len(ys) * size + 8}) rotate(60)">'
                     f'{html.escape(x[:18])}</text>')
    for (x, y), counts in cells.items():
        i, j = xs.index(x), ys.index(y)
        total, failed = sum(counts.values()), counts["fail"] + counts["error"]
        shade = 0.15 + 0.85 * total / most
        outline = 'stroke="#c62828" stroke-width="3"' if failed else 'stroke="#fff"'
        title = ", ".join(f"{k}: {v}" for k, v in counts.items())
        parts.append(f'<rect x="{left + i * size}" y="{top + j * size}" width="{size - 2}" height="{size - 2}" '
                     f'fill="#1565c0" fill-opacity="{shade:.2f}" {outline}><title>{html.escape(x_key)}={html.escape(x)}, '
                     f'{html.escape(y_key)}={html.escape(y)}: {title}</title></rect>')
        if failed:
            parts.append(f'<text x="{left + i * size + size / 2 - 1}" y="{top + j * size + size / 2 + 4}" '
                         f'text-anchor="middle" fill="#fff" font-weight="bold">{failed}</text>')
    parts.append("</svg>")
    caption = (f"<p>{html.escape(y_key)} (rows) by {html.escape(x_key)} (columns): darker cells had more examples; "
               "a red outline and number mark failing examples. Hover a cell for its verdicts.</p>")
    return caption + "".join(parts)


MUTANT_COLOURS = {"killed": "#2e7d32", "survived": "#c62828", "timed out": "#ef6c00", "unreached": "#9e9e9e"}


def mutants_section(rows: list[dict]) -> str:
    """`python -m harness mutate`'s verdicts: targeted functions as rows, one square per mutant in line order,
    coloured killed / survived / timed out / unreached; then each survivor, original and mutated side by side."""
    if not rows:
        return ""
    by_function: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        by_function[f"{row['file'].rsplit('/', 1)[-1]}::{row['function']}"].append(row)
    names = sorted(by_function)
    size, left, top = 14, 8 + 7 * max(len(n) for n in names), 8
    wide = max(len(v) for v in by_function.values())
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + size * wide + 20}" '
             f'height="{top + size * len(names) + 10}" font-family="monospace" font-size="11">']
    for j, name in enumerate(names):
        parts.append(f'<text x="{left - 6}" y="{top + j * size + size - 3}" text-anchor="end">'
                     f'{html.escape(name)}</text>')
        for i, row in enumerate(sorted(by_function[name], key=lambda r: r["line"])):
            title = f"{row['file']}:{row['line']} {row['operator']}: {row['verdict']} {row.get('oracle') or ''}"
            colour = MUTANT_COLOURS.get(row["verdict"], "#000")
            parts.append(f'<rect x="{left + i * size}" y="{top + j * size}" width="{size - 2}" height="{size - 2}" '
                         f'fill="{colour}"><title>{html.escape(title)}</title></rect>')
    parts.append("</svg>")
    counts = collections.Counter(row["verdict"] for row in rows)
    legend = ", ".join(f"<span style='color:{c}'>&#9632;</span> {v} {counts[v]}" for v, c in MUTANT_COLOURS.items())
    out = [f"<h2>Mutants</h2><p>{len(rows)} mutants of the targeted functions (rows), one square each in line order: "
           f"{legend}. Hover a square for its line, change and the oracle that killed it.</p>",
           "<div class='pic'>", *parts, "</div>"]
    survivors = sorted((r for r in rows if r["verdict"] == "survived"), key=lambda r: (r["file"], r["line"]))
    if survivors:
        out.append("<table><tr><th>survivor</th><th>original</th><th>mutated</th></tr>")
        out += [f"<tr><td class='l'>{html.escape(r['file'])}:{r['line']} [{html.escape(r['operator'])}]</td>"
                f"<td class='l'><code>{html.escape(r['original'])}</code></td>"
                f"<td class='l'><code>{html.escape(r['mutated'])}</code></td></tr>" for r in survivors]
        out.append("</table>")
    return "".join(out)


def expected_table(examples: list[dict]) -> str:
    """Expected errors per suite and rule, with the share of the suite's examples each rule took."""
    by_rule = expected_by_rule(examples)
    if not by_rule:
        return ""
    totals = collections.Counter(row["suite"] for row in examples)
    rows = [f"<tr><td class='l'>{html.escape(suite)}</td><td class='l'>{html.escape(rule)}</td><td>{n}</td>"
            f"<td>{100 * n / totals[suite]:.1f}%</td></tr>"
            for suite, rules in sorted(by_rule.items()) for rule, n in sorted(rules.items())]
    return ("<h2>Expected errors by rule</h2><table><tr><th>suite</th><th>rule</th><th>examples</th>"
            "<th>share of the suite's examples</th></tr>" + "".join(rows) + "</table>")


def behaviour_section(rows: list[dict], limit: int = 200) -> str:
    """`gate --base`'s differences between the base and the pull request (behaviour.jsonl); none: nothing."""
    if not rows:
        return ""
    def cell(value) -> str:
        return f"<td class='l'>{html.escape(value if isinstance(value, str) else json.dumps(value))[:300]}</td>"

    cells = "".join("<tr>" + "".join(cell(r[k]) for k in ("test", "drawn", "what", "base", "head")) + "</tr>"
                    for r in rows[:limit])
    return (f"<h2 class='fail'>Behaviour: {len(rows)} difference(s) from the base</h2><table><tr><th>test</th>"
            f"<th>drawn</th><th>what</th><th>base</th><th>head</th></tr>{cells}</table>")


def evidence_html(row: dict) -> str:
    """A failure's evidence (--torch-trace, --ablate): links to the trace and its tlparse index, the ablation."""
    out = []
    if row.get("trace"):
        index = row.get("trace_index")
        link = f"<a href='file://{html.escape(index)}'>tlparse index</a>, " if index else ""
        out.append(f"<p>trace: {link}raw logs in <code>{html.escape(row['trace'])}</code>"
                   f"{' (' + html.escape(row['trace_note']) + ')' if row.get('trace_note') else ''}</p>")
    if row.get("ablation"):
        cells = "".join(f"<tr><td class='l'>{html.escape(a['setting'])}</td><td>{html.escape(a['verdict'])}</td>"
                        f"<td class='l'>{html.escape(a['oracle'])}</td><td>{a['seconds']}</td></tr>"
                        for a in row["ablation"])
        out.append(f"<p>ablation: {html.escape(row['ablation_says'])}</p><table><tr><th>setting</th><th>verdict</th>"
                   f"<th>oracle</th><th>seconds</th></tr>{cells}</table>")
    return "".join(out)


def render(report_dir: Path, run_id: str) -> Path | None:
    examples = load(report_dir, "examples", run_id)
    failures = load(report_dir, "failures", run_id)
    coverage = {row["suite"]: row for row in ran_suites_coverage(load(report_dir, "coverage", run_id), examples)}
    if not examples and not failures:
        return None
    context = (examples or failures)[0]
    by_suite: dict[str, list[dict]] = collections.defaultdict(list)
    for row in examples:
        by_suite[row["suite"]].append(row)
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Harness run ", html.escape(run_id),
           "</title><style>body{font-family:sans-serif;margin:24px;max-width:1200px}"
           "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
           "th{background:#eee}td.l{text-align:left}pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}"
           ".pic{overflow-x:auto}.fail{color:#c62828}.ok{color:#2e7d32}</style></head><body>",
           f"<h1>SGLang harness run {html.escape(run_id)}</h1><p>SGLang {html.escape(str(context.get('sglang')))}"
           f" ({html.escape(str(context.get('sglang_path')))}), torch {html.escape(str(context.get('torch')))}, "
           f"device {html.escape(str(context.get('device')))}, profile {html.escape(str(context.get('profile')))}, "
           f"seed {html.escape(str(context.get('seed')))}</p>",
           f"<h2 class='{'fail' if failures else 'ok'}'>{len(failures)} failing test(s)</h2>",
           "<table><tr><th>suite</th><th>examples</th>" + "".join(f"<th>{v}</th>" for v in VERDICTS)
           + "<th>seconds</th><th>coverage of SGLang's targeted code</th></tr>"]
    for suite, rows in sorted(by_suite.items()):
        counts = collections.Counter(r.get("verdict") for r in rows)
        cov = coverage.get(suite)
        cov_text = (f"{cov['percent']:.1f}% ({cov['covered']}/{cov['statements']}): "
                    + ", ".join(f"{f} {p:.0f}%" for f, p in cov["files"].items())) if cov else "not measured"
        if cov and "branch_percent" in cov:
            cov_text += (f"; branches {cov['branch_percent']:.1f}% ({cov['branches_taken']}/{cov['branches']}): "
                         + ", ".join(f"{f} {p:.0f}%" for f, p in cov["branch_files"].items()))
        out.append(f"<tr><td class='l'>{html.escape(suite)}</td><td>{len(rows)}</td>"
                   + "".join(f"<td>{counts[v]}</td>" for v in VERDICTS)
                   + f"<td>{sum(r.get('seconds', 0) for r in rows):.1f}</td><td class='l'>{html.escape(cov_text)}</td></tr>")
    out.append("</table>")
    out.append(expected_table(examples))
    out.append(behaviour_section(load(report_dir, "behaviour")))
    for suite, rows in sorted(by_suite.items()):
        out.append(f"<h2>What {html.escape(suite)} explored</h2><div class='pic'>{picture(suite, rows)}</div>")
    out.append(mutants_section(load(report_dir, "mutants")))
    evidence = collections.defaultdict(list)
    for row in load(report_dir, "evidence", run_id):
        evidence[row["test"]].append(row)
    if failures:
        out.append("<h2>Failures</h2>")
    for row in failures:
        out.append(f"<h3 class='fail'>{html.escape(row['test'])}</h3><p><b>[{html.escape(str(row.get('oracle')))}]</b> "
                   f"{html.escape(str(row.get('diagnosis')))}</p><p>drawn:</p><pre>"
                   f"{html.escape(json.dumps(row.get('drawn'), indent=1))}</pre><p>details:</p><pre>"
                   f"{html.escape(json.dumps(row.get('details'), indent=1, default=str))}</pre><p>replay:</p>"
                   f"<pre>{html.escape(row['replay'])}</pre>")
        out.extend(evidence_html(row) for row in evidence.get(row["test"], []))
    out.append("</body></html>")
    path = Path(report_dir) / "report.html"
    path.write_text("".join(out), encoding="utf-8")
    return path
