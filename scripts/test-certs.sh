#!/usr/bin/env bash
# Makes the TLS material of the test servers, in one folder (default: $FLEETRUN_SERVICES_DIR/tls):
#   ca.pem ca.key               a private CA (10 years)
#   server.pem server.key       localhost and 127.0.0.1, signed by the CA (RabbitMQ, Redis)
#   client.pem client.key       CN=fleetrun-client, signed by the CA (what the fleet presents)
#   expired.pem expired.key     a server certificate for localhost that expired in 2016
#   elsewhere.pem elsewhere.key a server certificate for elsewhere.invalid only
#   other-ca.pem                a CA that signed nothing here (a client trusting only it
#                               meets an unknown CA)
# The last three make each TLS failure a client can meet; `openssl s_server` serves them.
# Keeps a folder that already holds every file; `--force` makes them again.
#   scripts/test-certs.sh [DIR] [--force]
set -euo pipefail

DIR=${FLEETRUN_SERVICES_DIR:-/tmp/fleetrun-services}/tls
FORCE=no
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=yes ;;
    *) DIR=$arg ;;
  esac
done
FILES=(ca.pem ca.key server.pem server.key client.pem client.key expired.pem expired.key
  elsewhere.pem elsewhere.key other-ca.pem)

have_all() {
  local f
  for f in "${FILES[@]}"; do [ -s "$DIR/$f" ] || return 1; done
}

if [ "$FORCE" = no ] && have_all; then
  exit 0
fi

mkdir -p "$DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A CA: $1 the name of its files, $2 its subject.
ca() {
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -keyout "$work/$1.key" -out "$work/$1.pem" -subj "$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>/dev/null
}

# A certificate signed by the CA: $1 its files' name, $2 its subject, $3 its extensions,
# then openssl's validity arguments.
leaf() {
  openssl req -newkey rsa:2048 -nodes -keyout "$work/$1.key" -out "$work/$1.csr" -subj "$2" 2>/dev/null
  printf '%s\n' "$3" > "$work/$1.ext"
  openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
    -CAcreateserial -sha256 "${@:4}" -extfile "$work/$1.ext" -out "$work/$1.pem" 2>/dev/null
}

ca ca "/CN=fleetrun test CA"
ca other-ca "/CN=fleetrun other CA"
SERVER_EXT='subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE'
leaf server "/CN=localhost" "$SERVER_EXT" -days 3650
leaf client "/CN=fleetrun-client" 'extendedKeyUsage=clientAuth
basicConstraints=CA:FALSE' -days 3650
leaf elsewhere "/CN=elsewhere.invalid" 'subjectAltName=DNS:elsewhere.invalid
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE' -days 3650
# Valid for one day in 2016: `openssl ca` takes the dates `x509 -req` does not.
openssl req -newkey rsa:2048 -nodes -keyout "$work/expired.key" -out "$work/expired.csr" \
  -subj "/CN=localhost" 2>/dev/null
printf '%s\n' "$SERVER_EXT" > "$work/expired.ext"
cat > "$work/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
database = $work/index.txt
new_certs_dir = $work
serial = $work/serial
policy = any
default_md = sha256
[any]
commonName = supplied
CNF
: > "$work/index.txt"
echo 1000 > "$work/serial"
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ca.pem" -keyfile "$work/ca.key" \
  -startdate 20160101000000Z -enddate 20160102000000Z -extfile "$work/expired.ext" \
  -in "$work/expired.csr" -out "$work/expired.pem" -notext 2>/dev/null

for f in "${FILES[@]}"; do cp "$work/$f" "$DIR/$f"; done
# The servers run as other users (RabbitMQ as `rabbitmq`): the keys are test keys.
chmod 644 "$DIR"/*
echo "$DIR"
