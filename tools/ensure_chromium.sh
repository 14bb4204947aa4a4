#!/usr/bin/env bash
# Idempotent: the report tests drive Debian's chromium headless (tests/report/).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
