#!/bin/sh
# Katib's database on the local node, as its katib-standalone-postgres manifest expects the postgres image to behave:
# the first start makes the cluster in PGDATA with POSTGRES_USER (password POSTGRES_PASSWORD) and the database
# POSTGRES_DB; every start then serves it on all addresses, passwords required.
set -eu
export TZ=UTC
: "${PGDATA:?PGDATA names the data directory}" "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:?}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  umask 077
  printf '%s\n' "$POSTGRES_PASSWORD" >/tmp/password
  initdb --pgdata="$PGDATA.initdb" --username="$POSTGRES_USER" --pwfile=/tmp/password --auth=scram-sha-256 \
    --no-locale --encoding=UTF8 --no-sync
  rm -f /tmp/password
  echo "host all all all scram-sha-256" >>"$PGDATA.initdb/pg_hba.conf"
  echo "CREATE DATABASE \"$POSTGRES_DB\";" | postgres --single -c jit=off -D "$PGDATA.initdb" postgres >/dev/null
  # A start cut short in initdb leaves no PGDATA: the next start makes it again.
  rm -rf "$PGDATA" && mv "$PGDATA.initdb" "$PGDATA"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp -c jit=off
