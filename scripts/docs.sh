#!/usr/bin/env bash
# Build the documentation site (docs/) into docs/_build/html, warnings as errors.
# Installs the `docs` extra (Sphinx, MyST, furo, matplotlib for the plots) into .venv when it is missing; the pages that
# come from the code (variables, CLI, performance tables) are generated during the build by
# docs/_ext/vkshmem_docs.py. Open docs/_build/html/index.html afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
# the interpreter: $PYTHON if set (the tests pass theirs), else the project's .venv
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || command -v "$PY" >/dev/null || PY=python3
if ! "$PY" -c 'import sphinx, myst_parser, furo, matplotlib' 2>/dev/null; then
    echo "docs.sh: installing the docs extra of pyproject.toml into $("$PY" -c 'import sys; print(sys.prefix)')" >&2
    # the requirements of pyproject.toml's `docs` extra (not `pip install -e .[docs]`, which
    # would rebuild vkshmem itself)
    mapfile -t REQS < <("$PY" -c 'try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
    "$PY" -m pip install -q --disable-pip-version-check "${REQS[@]}"
fi
# -E: read every page again, so each run reports every warning (not only those of changed pages)
exec "$PY" -m sphinx -E -W --keep-going -q -b html docs docs/_build/html "$@"
