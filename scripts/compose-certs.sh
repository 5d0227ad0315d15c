#!/usr/bin/env bash
# Makes a private CA and the certificates docker-compose.tls.yml mounts, in deploy/tls/
# (not in git): for trying TLS on one Docker host. With a CA of your own, put its files
# there under the same names instead.
#   ca.pem                      the CA every side trusts (ca.key stays beside it)
#   server.pem server.key       DNS names rabbitmq, redis and localhost (both servers)
#   client.pem client.key       CN=fleetrun, what the workers, the API and the command show
# Keeps a folder that already holds them; `--force` makes them again.
#   scripts/compose-certs.sh [--force]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DIR=deploy/tls
FILES=(ca.pem server.pem server.key client.pem client.key)
have_all() {
  local f
  for f in "${FILES[@]}"; do [ -s "$DIR/$f" ] || return 1; done
}
if [ "${1:-}" != --force ] && have_all; then
  echo "$DIR already holds the certificates (--force makes them again)"
  exit 0
fi

mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

openssl req -x509 -newkey rsa:3072 -nodes -sha256 -days 825 -subj "/CN=fleetrun private CA" \
  -keyout "$DIR/ca.key" -out "$DIR/ca.pem" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null

# $1 the files' name, $2 the subject, $3 the extensions.
leaf() {
  openssl req -newkey rsa:3072 -nodes -subj "$2" -keyout "$DIR/$1.key" -out "$work/$1.csr" 2>/dev/null
  printf '%s\n' "$3" > "$work/$1.ext"
  openssl x509 -req -sha256 -days 825 -in "$work/$1.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" \
    -CAcreateserial -out "$DIR/$1.pem" -extfile "$work/$1.ext" 2>/dev/null
}
leaf server "/CN=fleetrun services" \
  "subjectAltName=DNS:rabbitmq,DNS:redis,DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client "/CN=fleetrun" "extendedKeyUsage=clientAuth"

# The containers' users (rabbitmq, redis, fleetrun: three uids) read the files through a
# read-only bind mount: readable by all here; the folder itself by its owner's group only
# on a shared host is yours to decide. ca.key never leaves this folder.
chmod 644 "$DIR"/*.pem "$DIR"/server.key "$DIR"/client.key
chmod 600 "$DIR/ca.key"
rm -f "$DIR/ca.srl"
echo "made a CA and the server and client certificates in $DIR"
