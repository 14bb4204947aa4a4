#!/usr/bin/env bash
# Idempotent: the tracking and registry tests also run against an MLflow server backed by a
# real PostgreSQL (tests/tracking/pg_server.py starts it on loopback as the postgres user).
# Installs Debian's postgresql only when its server binaries are missing.
set -euo pipefail
exec "$(dirname "$0")/apt_install.sh" postgresql \
  bash -c 'ls /usr/lib/postgresql/*/bin/pg_ctl || command -v pg_ctl'
