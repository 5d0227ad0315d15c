#!/usr/bin/env bash
# Checks the deployment files without a Docker engine or a cluster:
#   1. docker-compose.yml parses (`docker-compose config -q`; Debian's docker-compose 1.29 is
#      installed with apt-get when missing);
#   2. every file or folder the compose file mounts or builds from exists;
#   3. deploy/Dockerfile passes a small lint: known instructions, FROM first, JSON forms
#      that parse, COPY --from naming a stage, COPY sources present in the build context,
#      every workspace member copied into the build stage;
#   4. every file under deploy/k8s (the GPU overlay's too) is valid YAML with apiVersion and
#      kind; deploy/k8s and deploy/k8s/gpu, kustomized (patches merged here), have a
#      Deployment without replicas: that KEDA scales on the seconds of work left of the
#      workers' pool, with a floor while a job is active; terminationGracePeriodSeconds =
#      FLEETRUN_DRAIN_TIMEOUT + 30 (compose: stop_grace_period); the overlay has one runner
#      per GPU, a node selector and a toleration;
#   5. the broker and ledger settings the fleet relies on are present;
#   6. the alert rules and the scrape configuration pass `promtool check` (Debian's
#      prometheus package, installed with apt-get when missing), and the Grafana dashboard
#      is JSON whose every panel has a PromQL query on the provisioned data source.
#   7. secure by default: compose refuses to start without its secrets (no guest, a Redis
#      password, an API token, a Grafana password), Redis keeps protected mode, RabbitMQ
#      lets no guest in from the network; docker-compose.tls.yml and deploy/k8s/tls give
#      every fleetrun container amqps://, rediss:// and the CA and client certificate,
#      and both servers listen on TLS only and ask for a client certificate.
#
#   scripts/check-deploy.sh        # exit 0 when every check passed
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

say() { printf '[check-deploy] %s\n' "$*" >&2; }

if ! command -v docker-compose >/dev/null; then
    say "installing docker-compose (Debian package)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
if ! command -v promtool >/dev/null; then
    say "installing prometheus (Debian package, for promtool)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
if ! python3 -c 'import yaml' 2>/dev/null; then
    say "installing PyYAML"
    python3 -m pip install -q pyyaml
fi

passed=0
failed=0
ok() { passed=$((passed + 1)); say "ok: $*"; }
bad() { failed=$((failed + 1)); say "FAILED: $*"; }

# --- 1. the compose file parses --------------------------------------------------------
# With stand-in secrets (scripts/compose-env.sh makes the real ones in .env, which
# an empty --env-file keeps out of these checks).
config="$(mktemp)"
tls_config="$(mktemp)"
refusal="$(mktemp)"
no_env="$(mktemp)"
trap 'rm -f "$config" "$tls_config" "$refusal" "$no_env"' EXIT
SECRETS=(FLEETRUN_RABBITMQ_PASSWORD FLEETRUN_REDIS_PASSWORD FLEETRUN_API_TOKEN FLEETRUN_GRAFANA_PASSWORD)
compose() {
    env "${SECRETS[@]/%/=check-deploy-secret}" docker-compose --env-file "$no_env" "$@"
}
if compose -f docker-compose.yml config -q && compose -f docker-compose.yml config > "$config"; then
    ok "docker-compose.yml parses ($(docker-compose version --short))"
else
    bad "docker-compose -f docker-compose.yml config -q"
fi
if compose -f docker-compose.yml -f docker-compose.tls.yml config > "$tls_config"; then
    ok "docker-compose.yml with docker-compose.tls.yml parses"
else
    bad "docker-compose -f docker-compose.yml -f docker-compose.tls.yml config"
fi
for name in "${SECRETS[@]}"; do
    others=()
    for other in "${SECRETS[@]}"; do [ "$other" = "$name" ] || others+=("$other=x"); done
    if env -u "$name" "${others[@]}" docker-compose --env-file "$no_env" -f docker-compose.yml \
        config -q 2> "$refusal"; then
        bad "docker-compose.yml starts without $name"
    elif grep -q "$name" "$refusal" && grep -q "scripts/compose-env.sh" "$refusal"; then
        ok "docker-compose.yml refuses to start without $name, naming it and scripts/compose-env.sh"
    else
        bad "docker-compose.yml without $name: $(tr '\n' ' ' < "$refusal")"
    fi
done

# --- 2-5: the rest in Python (PyYAML) -----------------------------------------------------
# Prints one line per check: "ok <what>" or "bad <what>".
results="$(python3 - "$config" "$tls_config" <<'PY'
import glob, json, os, re, sys
import yaml

def ok(what): print("ok", " ".join(str(what).split()))
def bad(what): print("bad", " ".join(str(what).split()))

# 2. what the compose file mounts and builds from
try:
    with open(sys.argv[1]) as f:
        compose = yaml.safe_load(f) or {}
except Exception as e:  # the config step already failed and said so
    compose = {}
    bad(f"normalized compose config unreadable: {e}")
named = set((compose.get("volumes") or {}).keys())
for name, svc in (compose.get("services") or {}).items():
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            kind, src = vol.get("type"), vol.get("source")
        else:
            src = vol.split(":")[0]
            kind = "bind" if src.startswith(("/", ".", "~")) else "volume"
        if kind == "volume":
            (ok if src in named else bad)(f"{name}: named volume {src} is declared")
        elif kind == "bind":
            (ok if os.path.exists(src) else bad)(f"{name}: mount source {src} exists")
    build = svc.get("build")
    if build:
        ctx = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = os.path.join(ctx, (build.get("dockerfile") if isinstance(build, dict) else None) or "Dockerfile")
        (ok if os.path.isdir(ctx) else bad)(f"{name}: build context {ctx} exists")
        (ok if os.path.isfile(dockerfile) else bad)(f"{name}: {dockerfile} exists")

# 3. deploy/Dockerfile lint (build context: the repository root)
KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
         "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
path = "deploy/Dockerfile"
problems, logical, buf, start = [], [], "", 0
for no, line in enumerate(open(path), 1):
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        continue  # comments may also sit inside a continued instruction
    if not buf:
        start = no
    buf += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
    if not stripped.endswith("\\"):
        logical.append((start, buf.strip()))
        buf = ""
if buf:
    problems.append(f"line {start}: the file ends inside a continued instruction")
stages, froms = set(), 0
for i, (no, text) in enumerate(logical):
    word, _, rest = text.partition(" ")
    if word.upper() not in KNOWN:
        problems.append(f"line {no}: unknown instruction {word!r}")
        continue
    word = word.upper()
    if i == 0 and word not in ("FROM", "ARG"):
        problems.append(f"line {no}: the first instruction is {word}, not FROM or ARG")
    if word == "ARG" and froms == 0:
        continue
    if word == "FROM":
        froms += 1
        m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.I)
        if m:
            stages.add(m.group(1).lower())
    if word in ("CMD", "ENTRYPOINT", "SHELL", "RUN") and rest.lstrip().startswith("["):
        try:
            json.loads(rest)
        except ValueError:
            problems.append(f"line {no}: {word}'s JSON form does not parse")
    if word in ("COPY", "ADD"):
        args = rest.split()
        flags = [a for a in args if a.startswith("--")]
        paths = [a for a in args if not a.startswith("--")]
        source = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        if source is not None:
            if source.lower() not in stages and not re.search(r"[:/]", source):
                problems.append(f"line {no}: COPY --from={source} names no earlier stage")
        elif word == "COPY" and len(paths) >= 2:
            for src in paths[:-1]:
                if not glob.glob(src):
                    problems.append(f"line {no}: COPY source {src} is not in the build context")
if froms == 0:
    problems.append("no FROM")
# cargo needs every workspace member in the build stage
import tomllib
copied = {a.rstrip("/") for _, t in logical if t.upper().startswith("COPY ") and "--from" not in t
          for a in t.split()[1:-1]}
for member in tomllib.load(open("Cargo.toml", "rb"))["workspace"]["members"]:
    if member not in copied:
        problems.append(f"workspace member {member}/ is not copied into the build stage")
for p in problems:
    bad(f"{path}: {p}")
if not problems:
    ok(f"{path}: {len(logical)} instructions, {froms} stages, lint clean")

# 4. Kubernetes manifests: every file under deploy/k8s (the GPU overlay's included)
def load_docs(path):
    return [d for d in yaml.safe_load_all(open(path)) if d is not None]
manifests = {}
for path in sorted(glob.glob("deploy/k8s/**/*.yaml", recursive=True)):
    try:
        docs = load_docs(path)
    except yaml.YAMLError as e:
        bad(f"{path}: not valid YAML: {e}")
        continue
    missing = [i for i, d in enumerate(docs) if not (isinstance(d, dict) and d.get("apiVersion") and d.get("kind"))]
    if missing:
        bad(f"{path}: documents {missing} lack apiVersion or kind")
    else:
        ok(f"{path}: valid YAML, {len(docs)} objects ({', '.join(d['kind'] for d in docs)})")
    manifests[path] = docs

def kustomized(folder):
    """The objects `kubectl apply -k folder` applies, patches merged (maps merged, lists of
    named items merged by name, other lists replaced; null deletes), or None."""
    kpath = os.path.join(folder, "kustomization.yaml")
    if kpath not in manifests:
        bad(f"{folder}: no kustomization.yaml")
        return None
    k = manifests[kpath][0]
    objects = []
    for res in k.get("resources", []):
        target = os.path.normpath(os.path.join(folder, res))
        if os.path.isdir(target):
            sub = kustomized(target)
            if sub is None:
                return None
            objects += sub
        elif target in manifests:
            objects += [json.loads(json.dumps(d)) for d in manifests[target]]
        else:
            bad(f"{kpath}: resource {res} does not exist")
            return None
    def merge(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            for key, v in b.items():
                if v is None:
                    a.pop(key, None)
                else:
                    a[key] = merge(a.get(key), v)
            return a
        if isinstance(a, list) and isinstance(b, list) and all(isinstance(x, dict) and "name" in x for x in a + b):
            for item in b:
                same = next((x for x in a if x["name"] == item["name"]), None)
                if same is None:
                    a.append(item)
                else:
                    merge(same, item)
            return a
        return b
    for patch in k.get("patches", []):
        ppath = os.path.normpath(os.path.join(folder, patch["path"]))
        if ppath not in manifests:
            bad(f"{kpath}: patch {patch['path']} does not exist")
            return None
        for p in manifests[ppath]:
            target = next((o for o in objects if o["kind"] == p["kind"] and o["metadata"]["name"] == p["metadata"]["name"]), None)
            if target is None:
                bad(f"{ppath}: patches {p['kind']}/{p['metadata']['name']}, which {folder} does not have")
                return None
            merge(target, json.loads(json.dumps(p)))
    return objects

def env_of(container, config):
    env = dict(config)
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
    return env

for folder in ("deploy/k8s", "deploy/k8s/gpu"):
    objects = kustomized(folder)
    if objects is None:
        continue
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    config = next((c.get("data") or {} for c in kinds.get("ConfigMap", []) if "FLEETRUN_POOL" in (c.get("data") or {})), {})
    pool = config.get("FLEETRUN_POOL")
    for so in kinds.get("ScaledObject", []):
        target = so["spec"]["scaleTargetRef"]["name"]
        deploy = next((d for d in kinds.get("Deployment", []) if d["metadata"]["name"] == target), None)
        if deploy is None:
            bad(f"{folder}: ScaledObject {so['metadata']['name']} scales {target}, which is not there")
            continue
        (bad if "replicas" in deploy["spec"] else ok)(
            f"{folder}: Deployment {target} leaves its replica count to KEDA (no replicas:)")
        queries = [t["metadata"].get("query", "") for t in so["spec"].get("triggers", []) if t.get("type") == "prometheus"]
        signal = [q for q in queries if "fleetrun_pool_work_seconds_left" in q]
        floor = [q for q in queries if "fleetrun_pool_jobs_active" in q]
        (ok if signal and floor else bad)(
            f"{folder}: KEDA scales on the seconds of work left and keeps a worker while a job is active")
        wrong = [q for q in queries if f'pool="{pool}"' not in q]
        (bad if wrong or not pool else ok)(
            f"{folder}: KEDA's queries name the workers' pool {pool!r}" + (f" (not: {wrong})" if wrong else ""))
        pod = deploy["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = env_of(container, config)
        grace, drain = pod.get("terminationGracePeriodSeconds"), env.get("FLEETRUN_DRAIN_TIMEOUT")
        (ok if drain and drain.isdigit() and grace == int(drain) + 30 else bad)(
            f"{folder}: terminationGracePeriodSeconds ({grace}) = FLEETRUN_DRAIN_TIMEOUT ({drain}) + 30")
        limits = (container.get("resources") or {}).get("limits") or {}
        if folder.endswith("gpu"):
            gpus = limits.get("nvidia.com/gpu")
            (ok if gpus is not None and env.get("FLEETRUN_MAX_PROCESSES") == str(gpus) else bad)(
                f"{folder}: one runner per GPU (nvidia.com/gpu {gpus}, FLEETRUN_MAX_PROCESSES {env.get('FLEETRUN_MAX_PROCESSES')})")
            (ok if pod.get("nodeSelector") and pod.get("tolerations") else bad)(
                f"{folder}: GPU nodes only (a nodeSelector and a toleration)")

# docker-compose: the same grace rule for the workers
worker = (compose.get("services") or {}).get("worker") or {}
drain = str((worker.get("environment") or {}).get("FLEETRUN_DRAIN_TIMEOUT", ""))
grace = str(worker.get("stop_grace_period", ""))
m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", grace)
seconds = int(m.group(1) or 0) * 60 + int(m.group(2) or 0) if grace and m else None
(ok if drain.isdigit() and seconds == int(drain) + 30 else bad)(
    f"docker-compose.yml: worker stop_grace_period ({grace}) = FLEETRUN_DRAIN_TIMEOUT ({drain}) + 30 s")

# 5. broker and ledger settings
def setting(path, key, sep):
    if not os.path.isfile(path):
        return None
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line.startswith(key):
            k, _, v = line.partition(sep)
            if k.strip() == key:
                return v.strip()
    return None
timeout = setting("deploy/rabbitmq/rabbitmq.conf", "consumer_timeout", "=")
if timeout and timeout.isdigit() and int(timeout) >= 3_600_000:
    ok(f"rabbitmq.conf: consumer_timeout = {int(timeout) // 60_000} min")
else:
    bad(f"rabbitmq.conf: consumer_timeout should be a whole number of ms, >= 1 h (is {timeout})")
plugins_file = "deploy/rabbitmq/enabled_plugins"
plugins = open(plugins_file).read() if os.path.isfile(plugins_file) else ""
for plugin in ("rabbitmq_management", "rabbitmq_prometheus"):
    (ok if re.fullmatch(r"\s*\[[\w,\s]*\b" + plugin + r"\b[\w,\s]*\]\.\s*", plugins) else bad)(
        f"enabled_plugins: an Erlang list ending in '.', with {plugin}")
(ok if setting("deploy/redis/redis.conf", "appendonly", " ") == "yes" else bad)(
    "redis.conf: appendonly yes")
(ok if setting("deploy/redis/redis.conf", "appendfsync", " ") == "always" else bad)(
    "redis.conf: appendfsync always (a recording Redis acknowledged survives its kill)")

# 6. the dashboard and what compose gives it
dash_path = "deploy/grafana/fleetrun.json"
try:
    dash = json.load(open(dash_path))
    sources = yaml.safe_load(open("deploy/grafana/provisioning/datasources/prometheus.yml"))
    uids = {d.get("uid") for d in sources.get("datasources", [])}
    problems = []
    for p in dash.get("panels", []):
        targets = p.get("targets") or []
        if not targets or not all(t.get("expr") for t in targets):
            problems.append(f"panel {p.get('title')!r} has no query")
        for d in [p.get("datasource")] + [t.get("datasource") for t in targets]:
            if not (isinstance(d, dict) and d.get("uid") in uids):
                problems.append(f"panel {p.get('title')!r} names a data source not provisioned: {d}")
    for p in problems:
        bad(f"{dash_path}: {p}")
    if not problems:
        ok(f"{dash_path}: {len(dash['panels'])} panels, each with a query on a provisioned data source")
except Exception as e:
    bad(f"{dash_path}: {e}")
services = compose.get("services") or {}
for name in ("prometheus", "grafana"):
    (ok if name in services else bad)(f"docker-compose.yml: a {name} service")

# 7. secure by default
def words(value):
    return value if isinstance(value, list) else str(value or "").split()
def text_of(svc):
    return " ".join(words(svc.get("entrypoint")) + words(svc.get("command")))
everything = json.dumps(compose)
(bad if re.search(r"guest", everything) else ok)("docker-compose.yml: no guest user anywhere")
rabbit_env = (services.get("rabbitmq") or {}).get("environment") or {}
(ok if rabbit_env.get("RABBITMQ_DEFAULT_USER") and rabbit_env.get("RABBITMQ_DEFAULT_PASS") == "check-deploy-secret" else bad)(
    "docker-compose.yml: RabbitMQ's one user and its password from the secrets")
(ok if setting("deploy/rabbitmq/rabbitmq.conf", "loopback_users.guest", "=") == "true" else bad)(
    "rabbitmq.conf: loopback_users.guest = true (a guest only from localhost)")
(ok if setting("deploy/redis/redis.conf", "protected-mode", " ") == "yes" else bad)(
    "redis.conf: protected-mode yes")
redis = services.get("redis") or {}
(ok if "requirepass" in text_of(redis) and "--include" in text_of(redis) else bad)(
    "docker-compose.yml: Redis gets requirepass from a file (--include), not its command line")
for name in ("worker", "api", "producer"):
    env = (services.get(name) or {}).get("environment") or {}
    amqp, redis_url = env.get("FLEETRUN_AMQP_URL", ""), env.get("FLEETRUN_REDIS_URL", "")
    (ok if "check-deploy-secret@" in amqp and "check-deploy-secret@" in redis_url else bad)(
        f"docker-compose.yml: {name} logs in to RabbitMQ and Redis with the secrets")
api_env = (services.get("api") or {}).get("environment") or {}
(ok if api_env.get("FLEETRUN_API_TOKEN") == "check-deploy-secret" else bad)(
    "docker-compose.yml: the API asks for a bearer token")
graf_env = (services.get("grafana") or {}).get("environment") or {}
(ok if graf_env.get("GF_SECURITY_ADMIN_PASSWORD") == "check-deploy-secret" else bad)(
    "docker-compose.yml: Grafana's admin password from the secrets")

try:
    with open(sys.argv[2]) as f:
        tls = (yaml.safe_load(f) or {}).get("services") or {}
except Exception as e:
    tls = {}
    bad(f"normalized TLS compose config unreadable: {e}")
for name in ("worker", "api", "producer"):
    svc = tls.get(name) or {}
    env = svc.get("environment") or {}
    mounts = [v if isinstance(v, str) else f"{v.get('source')}:{v.get('target')}" for v in svc.get("volumes") or []]
    files = [env.get(k, "") for k in ("FLEETRUN_TLS_CA_FILE", "FLEETRUN_TLS_CERT_FILE", "FLEETRUN_TLS_KEY_FILE")]
    mounted = all(f and any(f.startswith(m.split(":")[1] + "/") for m in mounts if m.count(":") >= 1) for f in files)
    (ok if env.get("FLEETRUN_AMQP_URL", "").startswith("amqps://")
        and env.get("FLEETRUN_AMQP_MANAGEMENT_URL", "").startswith("https://")
        and env.get("FLEETRUN_REDIS_URL", "").startswith("rediss://") and mounted else bad)(
        f"docker-compose.tls.yml: {name} uses amqps://, https://, rediss:// and mounts its CA, certificate and key")
tls_redis = text_of(tls.get("redis") or {})
(ok if "--port 0" in tls_redis and "--tls-auth-clients yes" in tls_redis and "--include" in tls_redis else bad)(
    "docker-compose.tls.yml: Redis on TLS only, asking for a client certificate, with its password")
rabbit_mounts = " ".join(str(v) for v in (tls.get("rabbitmq") or {}).get("volumes") or [])
(ok if "tls.conf" in rabbit_mounts and "conf.d" in rabbit_mounts else bad)(
    "docker-compose.tls.yml: RabbitMQ reads deploy/rabbitmq/tls.conf")
tls_conf = "deploy/rabbitmq/tls.conf"
(ok if setting(tls_conf, "listeners.tcp", "=") == "none"
    and setting(tls_conf, "ssl_options.verify", "=") == "verify_peer"
    and setting(tls_conf, "ssl_options.fail_if_no_peer_cert", "=") == "true"
    and setting(tls_conf, "management.ssl.port", "=") else bad)(
    f"{tls_conf}: AMQP on TLS only, a client certificate required, the management API over HTTPS")

objects = kustomized("deploy/k8s/tls") or []
for deploy in (o for o in objects if o["kind"] == "Deployment"):
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container, {})
    secret_vols = {v["name"] for v in pod.get("volumes") or [] if (v.get("secret") or {}).get("secretName") == "fleetrun-tls"}
    dirs = [m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in secret_vols]
    files = [env.get(k, "") for k in ("FLEETRUN_TLS_CA_FILE", "FLEETRUN_TLS_CERT_FILE", "FLEETRUN_TLS_KEY_FILE")]
    readable = (pod.get("securityContext") or {}).get("fsGroup") is not None
    (ok if dirs and all(any(f.startswith(d + "/") for d in dirs) for f in files) and readable else bad)(
        f"deploy/k8s/tls: {deploy['metadata']['name']} reads its CA, certificate and key from the Secret fleetrun-tls")
PY
)" || bad "the Python checks crashed"

# --- 6. alert rules and scrape configuration -------------------------------------------------
if promtool check rules deploy/prometheus/alerts.yml >/dev/null; then
    ok "deploy/prometheus/alerts.yml: promtool check rules"
else
    bad "promtool check rules deploy/prometheus/alerts.yml"
fi
if promtool check config deploy/prometheus/prometheus.yml >/dev/null; then
    ok "deploy/prometheus/prometheus.yml: promtool check config"
else
    bad "promtool check config deploy/prometheus/prometheus.yml"
fi

while read -r verdict what; do
    [ -z "$verdict" ] && continue
    if [ "$verdict" = ok ]; then ok "$what"; else bad "$what"; fi
done <<< "$results"

echo "check-deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
