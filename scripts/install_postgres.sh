#!/usr/bin/env bash
# Installs PostgreSQL's server binaries (Debian's `postgresql`) when missing: `make test`
# runs the e2e suite against a PostgreSQL store too, and `make serve-cluster` starts one.
# The tests start their own server in a temporary folder (initdb + pg_ctl as the postgres
# user); nothing here starts or configures a system service. Quietly does nothing when the
# binaries are there; says why when it cannot install them (not root, no apt-get).
set -u

if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_postgres.sh: PostgreSQL is not installed and this is not root with apt-get;" \
         "install the postgresql package (the PostgreSQL-store tests and serve-cluster need it)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends postgresql >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null 2>&1 \
        || { echo "install_postgres.sh: could not install postgresql" >&2; exit 0; }
fi
echo "install_postgres.sh: installed postgresql"
