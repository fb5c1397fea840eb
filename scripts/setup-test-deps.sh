#!/usr/bin/env bash
# System packages the test suite needs beyond the venv: Debian's chromium for the browser tests
# (tests/test_ui_browser.py drives it with Playwright's Python package, executable /usr/bin/chromium, or
# Fedora's /usr/bin/chromium-browser).
set -euo pipefail
if [ ! -x /usr/bin/chromium ] && [ ! -x /usr/bin/chromium-browser ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "the browser tests need Chromium: sudo dnf install chromium (Fedora), or your system's package" >&2
        exit 1
    fi
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium
fi
