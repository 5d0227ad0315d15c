#!/usr/bin/env bash
# Makes the secrets docker-compose.yml requires, once, in .env beside it (mode 600, not in
# git): the RabbitMQ user's password, the Redis password, the API's bearer token and
# Grafana's admin password, each 32 random characters. Compose reads .env by itself;
# `docker compose up` refuses to start without these.
#
#   scripts/compose-env.sh              # keeps every value .env already holds
#   scripts/compose-env.sh --print      # also prints the names it set (never the values)
#
# To see a value (the API token, to paste into the operator page): grep TOKEN .env
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ENV_FILE=${FLEETRUN_COMPOSE_ENV:-.env}
NAMES=(FLEETRUN_RABBITMQ_PASSWORD FLEETRUN_REDIS_PASSWORD FLEETRUN_API_TOKEN FLEETRUN_GRAFANA_PASSWORD)

# Letters and digits only: every value goes into a URL unescaped.
secret() { LC_ALL=C tr -dc 'A-Za-z0-9' < /dev/urandom | head -c 32; }

umask 077
touch "$ENV_FILE"
chmod 600 "$ENV_FILE"
for name in "${NAMES[@]}"; do
  if grep -q "^$name=." "$ENV_FILE"; then
    continue
  fi
  printf '%s=%s\n' "$name" "$(secret)" >> "$ENV_FILE"
  if [ "${1:-}" = --print ]; then echo "set $name in $ENV_FILE"; fi
done
