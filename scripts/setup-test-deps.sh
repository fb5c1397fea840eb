#!/usr/bin/env bash
# System packages the test suite needs beyond the venv: Debian's chromium for the browser tests
# (tests/test_ui_browser.py drives it with Playwright's Python package, executable /usr/bin/chromium).
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium
fi
