#!/usr/bin/env bash
# `make image` / `make image-check`: build deploy/container/Containerfile with buildah (or podman), from a
# wheel of this checkout; --check then runs the image: `splitrt serve` answers the gRPC health check and a
# Status call, in plaintext on loopback and with the default command (TLS + token from /secrets).
#
#   deploy/container/build.sh [--tag splitrt:0.1.0] [--base IMAGE] [--debian-base] [--offline] [--check]
#
# --base IMAGE    the base image (default: the Containerfile's, python:3.11-slim from Docker Hub)
# --debian-base   make the base from Debian packages instead (debootstrap bookworm + python3-venv, imported as
#                 localhost/splitrt-base:bookworm): for hosts that reach no image registry. Implies --offline.
# --offline       put every dependency wheel in the build context (pip wheel, from this host's pip cache;
#                 this host's Python must be the base's) and build with PIP_NO_INDEX=1: no network in RUN
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PY="${PY:-$REPO/.venv/bin/python}"
TAG="splitrt:$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml")"
BASE=""
DEBIAN_BASE=0
OFFLINE=0
CHECK=0
WORK="${SPLITRT_CONTAINER_DIR:-/var/tmp/splitrt-container}"

say() { echo "image: $*" >&2; }
die() { echo "image: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG="${2:?--tag needs NAME:VERSION}"; shift 2 ;;
        --base) BASE="${2:?--base needs an image}"; shift 2 ;;
        --debian-base) DEBIAN_BASE=1; OFFLINE=1; shift ;;
        --offline) OFFLINE=1; shift ;;
        --check) CHECK=1; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (expected --tag --base --debian-base --offline --check)" ;;
    esac
done
# Runtime flags that also work on hosts where the defaults do not: runc (crun refuses a cgroup v1/v2 hybrid
# host: "cgroups in hybrid mode not supported"), and rlimits at or below this shell's (podman's defaults
# raise them, which needs CAP_SYS_RESOURCE: "setrlimit RLIMIT_NPROC: Operation not permitted").
RT=()
command -v runc >/dev/null && RT+=(--runtime runc)
RT+=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Sn)" --ulimit "nproc=4096:4096")
if command -v buildah >/dev/null; then BUILD=(buildah bud --format docker --layers "${RT[@]}")
elif command -v podman >/dev/null; then BUILD=(podman build --format docker "${RT[@]}")
else die "expected buildah or podman (apt-get install buildah podman), got neither"; fi
[ -x "$PY" ] || die "expected a Python with pip at $PY (make check makes .venv), got none"

# 1. the base: a registry's, or one made here from Debian packages
if [ "$DEBIAN_BASE" = 1 ]; then
    BASE=localhost/splitrt-base:bookworm
    if ! podman image exists "$BASE" 2>/dev/null; then
        rootfs="$WORK/rootfs"
        if [ ! -f "$rootfs/.splitrt-rootfs" ]; then
            say "debootstrap bookworm (python3, python3-venv) into $rootfs"
            rm -rf --one-file-system "$rootfs.tmp"
            debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs.tmp" \
                > "$WORK/debootstrap.log" 2>&1 || die "debootstrap failed: $(tail -5 "$WORK/debootstrap.log")"
            touch "$rootfs.tmp/.splitrt-rootfs"
            mv "$rootfs.tmp" "$rootfs"
        fi
        say "importing $rootfs as $BASE"
        tar -C "$rootfs" --exclude=./.splitrt-rootfs --exclude=./var/cache/apt/archives -c . \
            | podman import --change 'CMD ["python3"]' - "$BASE" >/dev/null
    fi
fi

# 2. the build context: the wheel (and, offline, every dependency wheel)
ctx="$HERE"
rm -rf "$ctx/dist"
mkdir -p "$ctx/dist"
say "building the wheel"
"$PY" -m pip wheel -q --no-deps -w "$ctx/dist" "$REPO" >&2
args=()
if [ "$OFFLINE" = 1 ]; then
    say "collecting the dependency wheels for $("$PY" -V)"
    "$PY" -m pip wheel -q -w "$ctx/dist" "$ctx"/dist/splitrt-*.whl >&2
    args+=(--build-arg PIP_NO_INDEX=1)
fi
[ -n "$BASE" ] && args+=(--build-arg "BASE=$BASE")
t0=$(date +%s)
"${BUILD[@]}" "${args[@]}" -f "$HERE/Containerfile" -t "$TAG" "$ctx" >&2 || die "${BUILD[*]} failed (above)"
say "built $TAG in $(( $(date +%s) - t0 )) s: $(podman image inspect "$TAG" --format '{{.Size}}' 2>/dev/null | awk '{printf "%.0f MB", $1/1e6}')"
[ "$CHECK" = 1 ] || exit 0

# 3. run it: host network (no CNI needed), a free loopback port, the health check and a Status call
port="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
names=()
trap 'for n in "${names[@]+"${names[@]}"}"; do podman rm -f "$n" >/dev/null 2>&1 || true; done' EXIT
wait_healthy() {  # $1 container
    for _ in $(seq 60); do
        podman healthcheck run "$1" >/dev/null 2>&1 && return 0
        [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || { podman logs "$1" >&2; return 1; }
        sleep 1
    done
    podman logs "$1" >&2
    return 1
}
name="splitrt-check-$$"
names+=("$name")
models="$(mktemp -d)"
"$REPO/.venv/bin/splitrt" zoo get squeezenet --out "$models/squeezenet.onnx" >/dev/null
chmod -R a+rX "$models"
podman run "${RT[@]}" -d --name "$name" --network host -v "$models:/models:ro" \
    -e SPLITRT_HEALTH_ADDRESS="127.0.0.1:$port" "$TAG" splitrt serve --models /models --port "$port" >/dev/null
wait_healthy "$name" || die "plaintext: the health check never passed"
"$REPO/.venv/bin/splitrt" status "127.0.0.1:$port" --json >&2 || die "plaintext: Status failed"
# a split request served by the container: the tail of squeezenet at a middle cut
out="$("$REPO/.venv/bin/splitrt" run "$models/squeezenet.onnx" --cloud "127.0.0.1:$port" --cut c30 --random --json)" \
    || die "plaintext: splitrt run against the container failed"
where="$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["where"])' "$out")"
[ "$where" != local ] || die "plaintext: the request finished locally, not in the container: $out"
say "plaintext serve: healthy, Status answered, a split request (c30) served ($where); user $(podman exec "$name" id -u)"
rm -rf "$models"

secrets="$(mktemp -d)"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$secrets/tls.key" -out "$secrets/tls.crt" -days 1 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost >/dev/null 2>&1
echo "check-token-$$" > "$secrets/token.txt"
chown -R 1000:1000 "$secrets" && chmod 600 "$secrets"/*
port2="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
name="splitrt-check-tls-$$"
names+=("$name")
# the default command with its port moved (host network: 50051 may be taken here)
cmd="$(podman image inspect "$TAG" --format '{{json .Config.Cmd}}')"
mapfile -t argv < <("$PY" -c 'import json, sys; print(*json.loads(sys.argv[1]), sep="\n")' "$cmd" \
                    | sed "s/^50051\$/$port2/")
podman run "${RT[@]}" -d --name "$name" --network host -v "$secrets:/secrets:ro" \
    -e SPLITRT_HEALTH_ADDRESS="127.0.0.1:$port2" "$TAG" "${argv[@]}" >/dev/null
wait_healthy "$name" || die "TLS: the health check never passed"
"$REPO/.venv/bin/splitrt" status "localhost:$port2" --tls-ca "$secrets/tls.crt" --token-file "$secrets/token.txt" \
    --json >&2 || die "TLS: Status failed"
podman stop -t 30 "$name" >/dev/null
say "TLS serve (the default command): healthy, Status answered with the token; stopped: exit $(podman inspect -f '{{.State.ExitCode}}' "$name")"
rm -rf "$secrets"
