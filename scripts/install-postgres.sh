#!/usr/bin/env bash
# PostgreSQL's server binaries (initdb, pg_ctl, postgres) for `make serve` on PostgreSQL and its tests:
# nothing to do when /usr/lib/postgresql/*/bin (Debian, Ubuntu), POSTGRES_BIN or the PATH has them;
# otherwise Debian's `postgresql` package, through apt-get (as root, or with sudo). No cluster of the
# package's own is needed: each workspace makes its own (`fedunlearn db start`, stores/postgres.py).
set -euo pipefail

found() {
  for dir in ${POSTGRES_BIN:-} $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin \
             "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/pg_ctl)")"; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then echo "$dir"; return 0; fi
  done
  return 1
}

if dir="$(found)"; then
  echo "PostgreSQL server binaries: $dir"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL's server binaries (initdb, pg_ctl, postgres) are missing and this machine has no apt-get:" \
       "install PostgreSQL 13 or newer with its package manager (and set POSTGRES_BIN to the directory of" \
       "initdb if it is not on the PATH), or serve on SQLite: SERVE_DB=sqlite make serve" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "installing postgresql needs root: sudo apt-get install -y postgresql" >&2; exit 1; }
  SUDO="sudo"
fi
echo "installing Debian's postgresql package (apt-get install -y postgresql)" >&2
# A container without an init system: the package's own cluster is not started (invoke-rc.d refuses), which
# is fine — each workspace runs a cluster of its own.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
  || { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }
dir="$(found)" || { echo "apt-get installed postgresql, yet initdb/pg_ctl/postgres are not found" >&2; exit 1; }
echo "PostgreSQL server binaries: $dir"
