#!/usr/bin/env bash
# Creates (once) the pinned environment the harness runs in, then runs `python -m harness ARGS`.
#   ./harness.sh campaign     fuzz campaign of every suite on the CPU virtual device, with a report
#   ./harness.sh selftest     the harness's own tests (oracles, virtual device, mutants)
# Another SGLang:   SGLANG_REQUIREMENTS=requirements/sglang-0.5.19.txt TORCH_REQUIREMENTS=none ./harness.sh ...
#   (TORCH_REQUIREMENTS=none: the SGLang file pins torch itself and everything is installed --no-deps)
#   or a source tree (a pull request's checkout):   SGLANG_SRC=/path/to/sglang ./harness.sh gate
# HARNESS_VENV picks the environment's folder (default .venv); tox.ini sets one per environment.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${HARNESS_VENV:-.venv}
TORCH_REQ=${TORCH_REQUIREMENTS:-requirements/torch-2.14.1.txt}
SGLANG_REQ=${SGLANG_REQUIREMENTS:-requirements/sglang-0.5.23.txt}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

torch_files=(); [ "$TORCH_REQ" = none ] || torch_files=(-r "$TORCH_REQ")
stamp=$(cat "${torch_files[@]:1}" "$SGLANG_REQ" requirements/harness.txt | sha256sum | cut -c1-16)-${SGLANG_SRC:-wheel}
if [ "$(cat "$VENV/.harness-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "[harness.sh] building $VENV: $TORCH_REQ, $SGLANG_REQ${SGLANG_SRC:+, SGLang from $SGLANG_SRC}" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    # torch and the harness's tools with their dependencies, held to SGLang's pins where they overlap;
    # then SGLang itself without its GPU-kernel dependencies, plus the pure-Python packages it imports.
    "${pip[@]}" "${torch_files[@]}" -r requirements/harness.txt -c "$SGLANG_REQ"
    "${pip[@]}" --no-deps -r "$SGLANG_REQ"
    if [ -n "${SGLANG_SRC:-}" ]; then
        src="$SGLANG_SRC"; [ -f "$src/python/pyproject.toml" ] && src="$src/python"
        [ -f "$src/pyproject.toml" ] || { echo "[harness.sh] SGLANG_SRC=$SGLANG_SRC is not an SGLang source tree (no pyproject.toml there or in python/)" >&2; exit 2; }
        "${pip[@]}" --no-deps -e "$src"
    fi
    echo "$stamp" > "$VENV/.harness-stamp"
fi
exec "$VENV/bin/python" -m harness "$@"
