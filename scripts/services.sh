#!/usr/bin/env bash
# Installs (when missing), starts and stops the real servers the `services` test tier and the
# fleet demo use, all on loopback:
#   RabbitMQ  amqp://guest:guest@127.0.0.1:5673/%2f   (management API on 127.0.0.1:15673,
#                                                     Prometheus metrics on 127.0.0.1:15693)
#   Redis     redis://127.0.0.1:6390/                 (append-only persistence on)
#   S3        http://127.0.0.1:5055                   (moto_server)
# and, for the TLS tests, with a private CA (scripts/test-certs.sh, in $STATE/tls) whose
# client certificate both require:
#   RabbitMQ  amqps://fleetrun:…@127.0.0.1:5674/%2f   (TLS only, verify_peer and
#                                                     fail_if_no_peer_cert; EXTERNAL login)
#   Redis     rediss://:…@127.0.0.1:6391/             (TLS only, tls-auth-clients yes)
#
#   scripts/services.sh start   # install what is missing, start, wait until each answers
#
# `start` reuses a server only if this script started it (Redis and moto_server by the pid
# files under $FLEETRUN_SERVICES_DIR, RabbitMQ by its node name fleetrun@localhost), and
# fails naming the port when anything else listens on one of them; `stop` stops only those.
#   scripts/services.sh stop
#   scripts/services.sh env     # print the variables the tests and the fleet read
set -euo pipefail

STATE=${FLEETRUN_SERVICES_DIR:-/tmp/fleetrun-services}
AMQP_PORT=5673
MGMT_PORT=15673
PROMETHEUS_PORT=15693
REDIS_PORT=6390
S3_PORT=5055
AMQPS_PORT=5674
AMQPS_DIST_PORT=25674
REDISS_PORT=6391
# The TLS servers' password: a test looks for it in every log and output.
TLS_PASSWORD=tls-secret-7f3a
TLS_NODE=fleetrun-tls@localhost

say() { printf '[services] %s\n' "$*" >&2; }

print_env() {
  cat <<ENV
export FLEETRUN_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f
export FLEETRUN_TEST_AMQP_MANAGEMENT_URL=http://guest:guest@127.0.0.1:$MGMT_PORT
export FLEETRUN_TEST_RABBITMQ_PROMETHEUS=127.0.0.1:$PROMETHEUS_PORT
export FLEETRUN_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/
export FLEETRUN_TEST_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export FLEETRUN_TEST_TLS_DIR=$STATE/tls
export FLEETRUN_TEST_AMQPS_URL=amqps://fleetrun:$TLS_PASSWORD@127.0.0.1:$AMQPS_PORT/%2f
export FLEETRUN_TEST_REDISS_URL=rediss://:$TLS_PASSWORD@127.0.0.1:$REDISS_PORT/
ENV
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local name=$1 port=$2 tries=${3:-120}
  for _ in $(seq "$tries"); do
    port_open "$port" && return 0
    sleep 0.5
  done
  say "$name did not open port $port"
  return 1
}

# The pid of the process listening on 127.0.0.1:$1, or nothing.
listener_pid() {
  ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2
}

# Fails, naming the port, when something this script did not start listens on it: a test
# run must not talk to, or stop, a server that is not the one it set up.
refuse_foreign() {
  local name=$1 port=$2
  local pid what
  pid=$(listener_pid "$port")
  what=$( [ -n "$pid" ] && ps -o comm= -p "$pid" 2>/dev/null || true)
  say "port $port (the $name's) is taken by ${what:-a process} (pid ${pid:-unknown}), which scripts/services.sh did not start; stop it or free the port, then run this again"
  exit 1
}

# The pid of the RabbitMQ node this script starts (named fleetrun@localhost), or nothing.
rabbitmq_pid() {
  timeout 30 rabbitmqctl -n fleetrun@localhost eval 'os:getpid().' 2>/dev/null | tr -d '"'
}

# Whether $2 is the pid listening on port $1.
listens_as() { [ -n "$2" ] && [ "$(listener_pid "$1")" = "$2" ]; }

install_missing() {
  local packages=()
  command -v redis-server >/dev/null || packages+=(redis-server)
  command -v rabbitmq-server >/dev/null || packages+=(rabbitmq-server)
  command -v ss >/dev/null || packages+=(iproute2)
  if [ ${#packages[@]} -gt 0 ]; then
    say "installing ${packages[*]}"
    apt-get update -qq
    # The packages' own service start is refused in containers; we start the servers below.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
  fi
  if ! python3 -c 'import moto, sys; v = tuple(int(x) for x in moto.__version__.split(".")[:3]); sys.exit(v < (5, 2, 5))' 2>/dev/null \
     || ! command -v moto_server >/dev/null; then
    # moto before 5.2.5 answers CompleteMultipartUpload with the wrong XML root.
    say "installing moto[server]>=5.2.5"
    python3 -m pip install -q 'moto[server]>=5.2.5'
  fi
}

start_rabbitmq() {
  if port_open "$AMQP_PORT" || port_open "$MGMT_PORT"; then
    # Ours: the node named fleetrun@localhost, its process the one on both ports.
    local pid
    pid=$(rabbitmq_pid)
    listens_as "$AMQP_PORT" "$pid" || refuse_foreign RabbitMQ "$AMQP_PORT"
    listens_as "$MGMT_PORT" "$pid" || refuse_foreign "RabbitMQ management API" "$MGMT_PORT"
    say "RabbitMQ already running on 127.0.0.1:$AMQP_PORT (started here: node fleetrun@localhost, pid $pid)"
    local files
    files=$(awk '/^Max open files/ {print $4}' "/proc/$pid/limits" 2>/dev/null || true)
    if [ -n "$files" ] && [ "$files" -lt 10000 ]; then
      say "that node may open only $files files: it stops answering new connections once its quorum queues take them; restart it with 'scripts/services.sh stop' then 'start'"
    fi
    enable_rabbitmq_prometheus "$pid"
    return 0
  fi
  mkdir -p /etc/rabbitmq
  # Sourced by the shell that starts the node, after Debian's wrapper ran `su rabbitmq`,
  # which leaves 1024 open files. RabbitMQ spends its file handles on each quorum queue's
  # log (the suite's jobs each have a queue) and on each connection: once they run out, it
  # takes TCP connections and never answers their AMQP handshake. The hard limit is the most
  # the node may have; the private brokers of the tests read this file too.
  cat > /etc/rabbitmq/rabbitmq-env.conf <<'CONF'
ulimit -S -n "$(ulimit -H -n)"
CONF
  cat >> /etc/rabbitmq/rabbitmq-env.conf <<CONF
NODENAME=fleetrun@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$AMQP_PORT
CONF
  cat > /etc/rabbitmq/rabbitmq.conf <<CONF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $PROMETHEUS_PORT
# An hour: mini-batches in tests are short; the fleet's own setting is in deploy/.
consumer_timeout = 3600000
CONF
  echo '[rabbitmq_management,rabbitmq_prometheus].' > /etc/rabbitmq/enabled_plugins
  say "starting RabbitMQ on 127.0.0.1:$AMQP_PORT"
  # RabbitMQ's own advice for a node's open files; as root the hard limit can be raised.
  ulimit -n 65536 2>/dev/null || true
  rabbitmq-server -detached
  # -detached returns before the node registers; await_startup needs it registered.
  for _ in $(seq 120); do
    rabbitmqctl -n fleetrun@localhost await_startup --timeout 120 >/dev/null 2>&1 && break
    sleep 0.5
  done
  wait_port RabbitMQ "$AMQP_PORT"
  wait_port "RabbitMQ management" "$MGMT_PORT"
  wait_port "RabbitMQ Prometheus metrics" "$PROMETHEUS_PORT"
}

# Turns on the Prometheus plugin of a node started here by an earlier version of this script,
# without a restart, on the port a fresh start gives it.
enable_rabbitmq_prometheus() {
  local pid=$1
  if port_open "$PROMETHEUS_PORT"; then
    listens_as "$PROMETHEUS_PORT" "$pid" || refuse_foreign "RabbitMQ Prometheus metrics" "$PROMETHEUS_PORT"
    return 0
  fi
  say "enabling rabbitmq_prometheus on 127.0.0.1:$PROMETHEUS_PORT"
  rabbitmqctl -n fleetrun@localhost eval "application:load(rabbitmq_prometheus), application:set_env(rabbitmq_prometheus, tcp_config, [{port, $PROMETHEUS_PORT}, {ip, \"127.0.0.1\"}])." >/dev/null
  rabbitmq-plugins -n fleetrun@localhost enable rabbitmq_prometheus >/dev/null
  wait_port "RabbitMQ Prometheus metrics" "$PROMETHEUS_PORT"
}

start_redis() {
  if port_open "$REDIS_PORT"; then
    # Ours: the pid Redis wrote to the pid file this script gave it.
    local pid
    pid=$(cat "$STATE/redis.pid" 2>/dev/null || true)
    listens_as "$REDIS_PORT" "$pid" || refuse_foreign Redis "$REDIS_PORT"
    say "Redis already running on 127.0.0.1:$REDIS_PORT (started here: pid $pid)"
    return 0
  fi
  mkdir -p "$STATE/redis"
  say "starting Redis on 127.0.0.1:$REDIS_PORT"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$STATE/redis" \
    --appendonly yes --save '' --daemonize yes --pidfile "$STATE/redis.pid" \
    --logfile "$STATE/redis.log"
  wait_port Redis "$REDIS_PORT"
}

start_s3() {
  if port_open "$S3_PORT"; then
    # Ours: the pid this script wrote when it started moto_server.
    local pid
    pid=$(cat "$STATE/moto.pid" 2>/dev/null || true)
    listens_as "$S3_PORT" "$pid" || refuse_foreign "S3 server" "$S3_PORT"
    say "moto_server already running on 127.0.0.1:$S3_PORT (started here: pid $pid)"
    return 0
  fi
  mkdir -p "$STATE"
  say "starting moto_server (S3) on 127.0.0.1:$S3_PORT"
  nohup moto_server -H 127.0.0.1 -p "$S3_PORT" > "$STATE/moto.log" 2>&1 &
  echo $! > "$STATE/moto.pid"
  wait_port moto_server "$S3_PORT"
}

# The pid of the TLS RabbitMQ node this script starts, or nothing.
tls_rabbitmq_pid() {
  timeout 30 rabbitmqctl -n "$TLS_NODE" eval 'os:getpid().' 2>/dev/null | tr -d '"'
}

# A RabbitMQ node that speaks only TLS and wants a client certificate signed by the test CA;
# it takes a password (PLAIN) or the certificate's common name alone (EXTERNAL, for the user
# fleetrun-client).
start_tls_rabbitmq() {
  if port_open "$AMQPS_PORT"; then
    local pid
    pid=$(tls_rabbitmq_pid)
    listens_as "$AMQPS_PORT" "$pid" || refuse_foreign "TLS RabbitMQ" "$AMQPS_PORT"
    say "TLS RabbitMQ already running on 127.0.0.1:$AMQPS_PORT (started here: node $TLS_NODE, pid $pid)"
    return 0
  fi
  local dir=$STATE/rabbitmq-tls tls=$STATE/tls
  mkdir -p "$dir/mnesia" "$dir/log"
  cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp = none
listeners.ssl.default = 127.0.0.1:$AMQPS_PORT
ssl_options.cacertfile = $tls/ca.pem
ssl_options.certfile = $tls/server.pem
ssl_options.keyfile = $tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
default_user = fleetrun
default_pass = $TLS_PASSWORD
consumer_timeout = 3600000
CONF
  echo '[rabbitmq_auth_mechanism_ssl].' > "$dir/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$dir"
  say "starting TLS RabbitMQ on 127.0.0.1:$AMQPS_PORT"
  ulimit -n 65536 2>/dev/null || true
  RABBITMQ_NODENAME=$TLS_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$AMQPS_PORT RABBITMQ_DIST_PORT=$AMQPS_DIST_PORT \
    RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
    RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
    rabbitmq-server -detached </dev/null >/dev/null 2>&1
  for _ in $(seq 120); do
    rabbitmqctl -n "$TLS_NODE" await_startup --timeout 120 >/dev/null 2>&1 && break
    sleep 0.5
  done
  wait_port "TLS RabbitMQ" "$AMQPS_PORT"
  # The user EXTERNAL logs in: the client certificate's common name, no password.
  if ! rabbitmqctl -n "$TLS_NODE" -q list_users | grep -q '^fleetrun-client'; then
    rabbitmqctl -n "$TLS_NODE" -q add_user fleetrun-client "$(head -c 24 /dev/urandom | base64)" >/dev/null
    rabbitmqctl -n "$TLS_NODE" -q clear_password fleetrun-client >/dev/null
    rabbitmqctl -n "$TLS_NODE" -q set_permissions fleetrun-client '.*' '.*' '.*' >/dev/null
  fi
}

# A Redis that speaks only TLS, with a password, asking every client for a certificate
# signed by the test CA (Redis's default `tls-auth-clients yes`).
start_tls_redis() {
  if port_open "$REDISS_PORT"; then
    local pid
    pid=$(cat "$STATE/redis-tls.pid" 2>/dev/null || true)
    listens_as "$REDISS_PORT" "$pid" || refuse_foreign "TLS Redis" "$REDISS_PORT"
    say "TLS Redis already running on 127.0.0.1:$REDISS_PORT (started here: pid $pid)"
    return 0
  fi
  local tls=$STATE/tls
  mkdir -p "$STATE/redis-tls"
  say "starting TLS Redis on 127.0.0.1:$REDISS_PORT"
  # The password from a file: a command line is visible to every user of the machine.
  printf 'requirepass %s\n' "$TLS_PASSWORD" > "$STATE/redis-tls/auth.conf"
  chmod 600 "$STATE/redis-tls/auth.conf"
  redis-server "$STATE/redis-tls/auth.conf" --port 0 --tls-port "$REDISS_PORT" --bind 127.0.0.1 \
    --tls-cert-file "$tls/server.pem" --tls-key-file "$tls/server.key" \
    --tls-ca-cert-file "$tls/ca.pem" --tls-auth-clients yes \
    --dir "$STATE/redis-tls" --appendonly yes --save '' --daemonize yes \
    --pidfile "$STATE/redis-tls.pid" --logfile "$STATE/redis-tls.log"
  wait_port "TLS Redis" "$REDISS_PORT"
}

# Stops what this script started, and only that.
stop_all() {
  # A node asked to stop has been seen to hang for good (it had hundreds of quorum queues):
  # a minute, then its process is killed. Its data is for tests only.
  local node
  node=$(rabbitmq_pid || true)
  if [ -n "$node" ] && ! timeout 60 rabbitmqctl -n fleetrun@localhost stop >/dev/null 2>&1; then
    say "RabbitMQ did not stop within a minute: killing pid $node"
    kill -9 "$node" 2>/dev/null || true
  fi
  local pid
  pid=$(cat "$STATE/redis.pid" 2>/dev/null || true)
  if listens_as "$REDIS_PORT" "$pid"; then
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
  node=$(tls_rabbitmq_pid || true)
  if [ -n "$node" ] && ! timeout 60 rabbitmqctl -n "$TLS_NODE" stop >/dev/null 2>&1; then
    say "TLS RabbitMQ did not stop within a minute: killing pid $node"
    kill -9 "$node" 2>/dev/null || true
  fi
  pid=$(cat "$STATE/redis-tls.pid" 2>/dev/null || true)
  if listens_as "$REDISS_PORT" "$pid"; then
    kill "$pid" 2>/dev/null || true
  fi
  pid=$(cat "$STATE/moto.pid" 2>/dev/null || true)
  if listens_as "$S3_PORT" "$pid"; then
    kill "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/moto.pid"
}

case "${1:-}" in
  start)
    install_missing
    start_redis
    start_s3
    start_rabbitmq
    "$(dirname "$0")/test-certs.sh" "$STATE/tls" >/dev/null
    start_tls_redis
    start_tls_rabbitmq
    say "all services are up"
    ;;
  stop) stop_all ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
