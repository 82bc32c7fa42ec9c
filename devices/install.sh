#!/usr/bin/env bash
# Install the splitrt device daemon on a board.
#
#   devices/install.sh [--prefix P] [--device rpi4|rpi5|jetson-nano|jetson-orin-nano|x86] [--source DIR]
#                      [--python PY] [--reuse-env] [--model FILE.onnx]... [--cloud HOST:PORT]...
#                      [--api-address 127.0.0.1:PORT] [--metrics-port N] [--no-discovery] [--no-systemd]
#                      [--force-config]
#
# Creates a venv under P (default /opt/splitrt), installs splitrt from the source checkout into it (a copy,
# not an editable link), copies the board descriptors and shipped profiles, writes P/etc/splitrt/daemon.toml
# for the board (an existing one is kept; the new one goes to daemon.toml.new), installs the systemd units
# (splitrt-daemon enabled and started when systemd runs; splitrt-cloud only installed) and a launcher
# P/bin/splitrt-daemon that the unit runs.
#
# --reuse-env: do not download or install dependencies; the venv sees the site-packages of --python
#   (a .pth file) and splitrt itself is installed with `pip install --no-deps --no-build-isolation`.
#   For CI and for boards where onnxruntime comes from the vendor (Jetson: NVIDIA's wheel) already.
set -euo pipefail

PREFIX=/opt/splitrt
DEVICE=""
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
REUSE=0
SYSTEMD=1
DISCOVERY=true
FORCE_CONFIG=0
API_ADDRESS="127.0.0.1:50100"
METRICS_PORT=9464
MODELS=()
CLOUDS=()
BOARDS="rpi4 rpi5 jetson-nano jetson-orin-nano x86"

die() { echo "install.sh: error: $*" >&2; exit 2; }
say() { echo "install.sh: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="${2:?--prefix needs a directory}"; shift 2 ;;
        --device) DEVICE="${2:?--device needs a board name}"; shift 2 ;;
        --source) SOURCE="${2:?--source needs a directory}"; shift 2 ;;
        --python) PYTHON="${2:?--python needs an interpreter}"; shift 2 ;;
        --reuse-env|--no-deps) REUSE=1; shift ;;
        --model) MODELS+=("${2:?--model needs a file}"); shift 2 ;;
        --cloud) CLOUDS+=("${2:?--cloud needs HOST:PORT}"); shift 2 ;;
        --api-address) API_ADDRESS="${2:?--api-address needs 127.0.0.1:PORT}"; shift 2 ;;
        --metrics-port) METRICS_PORT="${2:?--metrics-port needs a port}"; shift 2 ;;
        --no-systemd) SYSTEMD=0; shift ;;
        --no-discovery) DISCOVERY=false; shift ;;
        --force-config) FORCE_CONFIG=1; shift ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (expected one of --prefix --device --source --python --reuse-env --model --cloud --api-address --metrics-port --no-systemd --no-discovery --force-config)" ;;
    esac
done

if [ -z "$DEVICE" ]; then
    model="$(tr -d '\0' < /proc/device-tree/model 2>/dev/null || true)"
    case "$model:$(uname -m)" in
        *"Raspberry Pi 5"*) DEVICE=rpi5 ;;
        *"Raspberry Pi 4"*) DEVICE=rpi4 ;;
        *"Orin Nano"*) DEVICE=jetson-orin-nano ;;
        *"Jetson Nano"*|*"NVIDIA Jetson Nano"*) DEVICE=jetson-nano ;;
        *:x86_64) DEVICE=x86 ;;
        *) die "cannot tell the board (model '${model:-unknown}', $(uname -m)): expected --device one of: $BOARDS" ;;
    esac
    say "board: $DEVICE (detected)"
fi
case " $BOARDS " in *" $DEVICE "*) ;; *) die "--device: expected one of: $BOARDS, got '$DEVICE'" ;; esac
[ -f "$SOURCE/pyproject.toml" ] && [ -d "$SOURCE/splitrt" ] || die "--source: expected a splitrt checkout (pyproject.toml, splitrt/), got '$SOURCE'"
[ -f "$SOURCE/devices/$DEVICE.toml" ] || die "no descriptor $SOURCE/devices/$DEVICE.toml"
command -v "$PYTHON" >/dev/null || die "--python: '$PYTHON' not found"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "--python: expected Python >= 3.10, got $("$PYTHON" -V 2>&1)"
case "$API_ADDRESS" in 127.0.0.1:*|localhost:*) ;; *) die "--api-address: expected 127.0.0.1:PORT (loopback), got '$API_ADDRESS'" ;; esac
for m in "${MODELS[@]+"${MODELS[@]}"}"; do [ -f "$m" ] || die "--model: expected an .onnx file, got '$m'"; done

mkdir -p "$PREFIX"
PREFIX="$(cd "$PREFIX" && pwd)"
VENV="$PREFIX/venv"
SHARE="$PREFIX/share/splitrt"
ETC="$PREFIX/etc/splitrt"
t0=$(date +%s)

# 1. the venv and splitrt, built from a copy of the checkout (a build writes build/ and *.egg-info)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
tar -C "$SOURCE" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' \
    --exclude=__pycache__ --exclude=./.mypy_cache --exclude=./.pytest_cache --exclude=./.ruff_cache -cf - . \
    | tar -C "$stage" -xf -
if [ "$REUSE" = 1 ]; then
    site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$PYTHON" -c 'import onnxruntime, onnx, grpc, grpc_health, google.protobuf, numpy, psutil, zeroconf, setuptools' 2>/dev/null \
        || die "--reuse-env: expected splitrt's dependencies (and setuptools) importable by $PYTHON, got an ImportError"
    say "venv $VENV reusing the packages of $PYTHON ($site)"
    "$PYTHON" -m venv --without-pip --system-site-packages "$VENV"
    vsite="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$site" > "$vsite/splitrt-reuse.pth"
    # pip and setuptools come from the reused environment (through the .pth file).
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation --no-warn-script-location "$stage" >&2
else
    say "venv $VENV (downloads or uses the wheelhouse for onnxruntime, grpcio, ...)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "$stage" >&2
fi
"$VENV/bin/splitrt" --version >&2

# 2. data: board descriptors, shipped profiles, models
mkdir -p "$SHARE/devices" "$SHARE/profiles" "$ETC" "$PREFIX/bin" "$PREFIX/var/lib/models" "$PREFIX/var/log" \
         "$PREFIX/var/run" "$PREFIX/var/cache" "$PREFIX/lib/systemd/system"
cp "$SOURCE"/devices/*.toml "$SHARE/devices/"
cp "$SOURCE"/profiles/*.json "$SHARE/profiles/" 2>/dev/null || true
model_tables=""
for m in "${MODELS[@]+"${MODELS[@]}"}"; do
    name="$(basename "$m" .onnx)"
    cp "$m" "$PREFIX/var/lib/models/$name.onnx"
    model_tables+=$'\n[[model]]\n'"name = \"$name\""$'\n'"path = \"$PREFIX/var/lib/models/$name.onnx\""$'\n'
done
if [ -z "$model_tables" ]; then
    model_tables=$'\n# A demo model (squeezenet with seeded random weights); replace it with yours:\n'
    model_tables+=$'# [[model]] name = "...", path = "/path/to/model.onnx" (profile_device_path/profile_cloud_path optional)\n'
    model_tables+=$'[[model]]\nname = "squeezenet"\npath = "zoo:squeezenet"\n'
fi

# 3. the config for this board
case "$DEVICE" in
    x86) deadline=1000 ;;
    jetson-orin-nano|rpi5) deadline=2000 ;;
    *) deadline=3000 ;;
esac
clouds=""
for c in "${CLOUDS[@]+"${CLOUDS[@]}"}"; do clouds+="${clouds:+, }\"$c\""; done
config="$ETC/daemon.toml"
[ -f "$config" ] && [ "$FORCE_CONFIG" = 0 ] && { config="$ETC/daemon.toml.new"; say "keeping $ETC/daemon.toml; the new one is $config"; }
cat > "$config" <<EOF
# splitrt device daemon for board $DEVICE, written by devices/install.sh. Keys: see \`pydoc splitrt.device.daemon\`.
board = "$SHARE/devices/$DEVICE.toml"    # speed factor (FLOPs prior, shipped profiles) and power figures
objective = "latency"                     # latency | energy | throughput
deadline_ms = $deadline
policy = "adaptive"                       # adaptive | periodic:SECONDS | fixed:PLAN (e.g. fixed:device)
codecs = ["fp32"]                         # lossless; add "fp16", "int8c" to allow lossy transfers
clouds = [$clouds]                        # static clouds (HOST:PORT), preferred first
# edge = "EDGE:50051"                     # three tiers: a splitrt serve --next CLOUD server in between
# hops = ["EDGE:50051", "CLOUD:50051"]    # or the path hop by hop; edge_speed_factor = 4.0 (edge vs cloud)
discovery = $DISCOVERY                          # follow clouds advertised via mDNS (splitrt serve --advertise)
# tls = true / tls_ca_path = "/etc/splitrt/ca.pem" / token_path = "/etc/splitrt/token"
api_socket_path = "$PREFIX/var/run/daemon.sock"
api_address = "$API_ADDRESS"
metrics_address = "127.0.0.1"
metrics_port = $METRICS_PORT
decision_log_path = "$PREFIX/var/log/decisions.jsonl"
drain_timeout_s = 10
$model_tables
EOF
"$VENV/bin/splitrt" daemon --config "$config" --check >&2

# 4. launcher and systemd units
cat > "$PREFIX/bin/splitrt-daemon" <<EOF
#!/bin/sh
# Runs the splitrt device daemon with the installed config (the systemd unit's ExecStart).
export SPLITRT_DEVICES_DIR="$SHARE/devices" SPLITRT_PROFILES_DIR="$SHARE/profiles" SPLITRT_CACHE="$PREFIX/var/cache"
exec "$VENV/bin/splitrt" daemon --config "$ETC/daemon.toml" "\$@"
EOF
chmod 755 "$PREFIX/bin/splitrt-daemon"
for unit in splitrt-daemon.service splitrt-cloud.service; do
    sed "s|@PREFIX@|$PREFIX|g" "$SOURCE/devices/systemd/$unit" > "$PREFIX/lib/systemd/system/$unit"
done
if [ "$SYSTEMD" = 1 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    cp "$PREFIX/lib/systemd/system/"splitrt-*.service /etc/systemd/system/
    systemctl daemon-reload
    systemctl enable --now splitrt-daemon.service
    say "enabled and started splitrt-daemon.service (splitrt-cloud.service installed, not enabled)"
else
    why="--no-systemd"; [ "$SYSTEMD" = 1 ] && why="systemd is not running here"
    say "skipping systemd ($why): units are in $PREFIX/lib/systemd/system; run $PREFIX/bin/splitrt-daemon by hand"
fi
say "installed in $(( $(date +%s) - t0 )) s: config $ETC/daemon.toml, API $API_ADDRESS and $PREFIX/var/run/daemon.sock, metrics http://127.0.0.1:$METRICS_PORT/metrics"
