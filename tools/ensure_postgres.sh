#!/usr/bin/env bash
# Idempotent: the tracking and registry tests also run against an MLflow server backed by a
# real PostgreSQL (tests/tracking/pg_server.py starts it on loopback as the postgres user).
# Installs Debian's postgresql only when its server binaries are missing.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql
