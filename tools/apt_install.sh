#!/usr/bin/env bash
# apt_install.sh PACKAGE CHECK... — install a Debian package unless CHECK (a command) succeeds.
# Two `make test` on one machine (or apt's own timers) must not collide on the dpkg lock:
# our installs take turns under flock and re-check once they hold it (the other may have
# installed the package meanwhile); `apt-get install` also waits up to 10 min for a foreign
# holder of the dpkg lock (DPkg::Lock::Timeout).
set -euo pipefail
pkg="$1"; shift
if "$@" >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
exec 9>"${TMPDIR:-/tmp}/flora-apt.lock"
flock 9
if "$@" >/dev/null 2>&1; then
  exit 0
fi
APT=(-o DPkg::Lock::Timeout=600)
$SUDO apt-get "${APT[@]}" update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${APT[@]}" install -y -qq "$pkg"
