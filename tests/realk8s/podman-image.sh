#!/usr/bin/env bash
# `make image` where no Docker engine runs: the project's Dockerfile built with podman + runc.
# No registry image can be pulled, so the base (the Dockerfile's PYTHON_IMAGE) is a Debian bookworm
# made with debootstrap from the machine's own apt mirror, with python3 and venv; it is built once and
# kept as localhost/rollout-router-base:bookworm. Usage: podman-image.sh [IMAGE [TARGET]] (TARGET: the
# Dockerfile's router (default) or operator stage).
set -euo pipefail

IMAGE="${1:-ghcr.io/rolloutrouter/rollout-router:0.1.0}"
TARGET="${2:-router}"
BASE="localhost/rollout-router-base:bookworm"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
APT=(env DEBIAN_FRONTEND=noninteractive apt-get)
[[ "$(id -u)" == 0 ]] || APT=(sudo "${APT[@]}")

missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
    echo "podman-image.sh: installing Debian packages: ${missing[*]}" >&2
    "${APT[@]}" update -qq && "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# crun (podman's default) fails on these machines (cgroups in hybrid mode, setrlimit not permitted).
conf="$(mktemp)"
trap 'rm -f "$conf"' EXIT
printf '[containers]\ndefault_ulimits = []\n' > "$conf"
export CONTAINERS_CONF="$conf"
podman_() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

if ! podman_ image exists "$BASE"; then
    mirror="$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' \
        /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null || true)"
    [[ -n "$mirror" ]] || { echo "podman-image.sh: no Debian mirror in /etc/apt sources" >&2; exit 2; }
    rootfs="$(mktemp -d)"
    start=$SECONDS
    echo "podman-image.sh: debootstrap bookworm from $mirror ..." >&2
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$mirror" >/dev/null
    # The base trusts what this machine trusts (local CAs, e.g. a proxy's), so pip inside the build reaches PyPI.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null
    fi
    tar -C "$rootfs" -c . | podman_ import - "$BASE" >/dev/null
    rm -rf "$rootfs"
    echo "podman-image.sh: base $BASE made in $((SECONDS - start)) s" >&2
fi

start=$SECONDS
podman_ build --network=host --build-arg "PYTHON_IMAGE=$BASE" --target "$TARGET" -t "$IMAGE" "$ROOT"
echo "podman-image.sh: $IMAGE built in $((SECONDS - start)) s" >&2
