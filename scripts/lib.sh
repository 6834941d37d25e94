# Shared by scripts/demo and scripts/test: find Python >= 3.12 and prepare .venv.
# shellcheck shell=sh

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
VENV="$ROOT/.venv"

say() { printf '%s\n' "$*" >&2; }

is_suitable() {
    [ -n "$1" ] && [ -x "$1" ] && "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null
}

find_python() {
    # An explicit choice wins; then what is on PATH; then pyenv's and common install places.
    for candidate in "${STALWART_PYTHON:-}" \
        "$(command -v python3.13 2>/dev/null)" "$(command -v python3.12 2>/dev/null)" \
        "$(command -v python3 2>/dev/null)" "$(command -v python 2>/dev/null)"; do
        if is_suitable "$candidate"; then printf '%s\n' "$candidate"; return 0; fi
    done
    pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
    for candidate in "$pyenv_root"/versions/3.1[3-9]*/bin/python3 \
        "$pyenv_root"/versions/3.12*/bin/python3 \
        /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9] /opt/homebrew/bin/python3.1[2-9]; do
        if is_suitable "$candidate"; then printf '%s\n' "$candidate"; return 0; fi
    done
    return 1
}

ensure_venv() {
    # $1: what to install, e.g. "." or ".[test]"
    if ! is_suitable "$VENV/bin/python"; then
        python=$(find_python) || {
            say "error: Stalwart needs Python 3.12 or newer, and none was found."
            say "Looked at \$STALWART_PYTHON, python3.13, python3.12, python3 and python on PATH,"
            say "pyenv versions under ${PYENV_ROOT:-$HOME/.pyenv}, and /usr/local/bin, /usr/bin."
            say "Install Python 3.12+ (e.g. 'pyenv install 3.13'), or point STALWART_PYTHON at one."
            exit 1
        }
        say "Creating $VENV with $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"
        rm -rf "$VENV"
        "$python" -m venv "$VENV"
    fi
    say "Installing django-stalwart$( [ "$1" = "." ] || printf ' with %s' "${1#.}") into .venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT$( [ "$1" = "." ] || printf '%s' "${1#.}")"
}
