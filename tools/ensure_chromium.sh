#!/usr/bin/env bash
# Idempotent: the report tests drive Debian's chromium headless (tests/report/).
set -euo pipefail
exec "$(dirname "$0")/apt_install.sh" chromium command -v chromium
