#!/usr/bin/env bash
# `make image` where no Docker engine runs: the project's Dockerfile built with podman + runc.
# No registry image can be pulled, so the base (the Dockerfile's PYTHON_IMAGE) is a Debian bookworm
# made with debootstrap from the machine's own apt mirror, with python3 and venv; it is built once and
# kept as localhost/rollout-router-base:bookworm. Usage: podman-image.sh [IMAGE [TARGET]] (TARGET: the
# Dockerfile's router (default) or operator stage).
# Cached: the image carries a label with a hash of what goes into it (the Dockerfile, the build context's files,
# the target and the base's id); when an image of that name already has the same hash, nothing is built.
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
export CONTAINERS_CONF="$ROOT/tests/realk8s/containers.conf"
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
    tar -C "$rootfs" -c . | podman_ import --quiet - "$BASE" >/dev/null
    rm -rf "$rootfs"
    echo "podman-image.sh: base $BASE made in $((SECONDS - start)) s" >&2
fi

# What the image is made of: the files the build context holds (.dockerignore keeps only these), the
# Dockerfile, the target and the base.
inputs_hash() {
    (cd "$ROOT" && find Dockerfile pyproject.toml hatch_build.py README.md router operator -type f \
        ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.so' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
     echo "target=$TARGET base=$(podman_ image inspect --format '{{.Id}}' "$BASE")") | sha256sum | cut -c1-16
}

start=$SECONDS
inputs="$(inputs_hash)"
label="io.rolloutrouter.build-inputs"
if [[ "$(podman_ image inspect --format "{{index .Labels \"$label\"}}" "$IMAGE" 2>/dev/null)" == "$inputs" ]]; then
    echo "podman-image.sh: $IMAGE is up to date (inputs $inputs), not rebuilt; checked in $((SECONDS - start)) s" >&2
    exit 0
fi
podman_ build --network=host --build-arg "PYTHON_IMAGE=$BASE" --target "$TARGET" --label "$label=$inputs" \
    -t "$IMAGE" "$ROOT"
echo "podman-image.sh: $IMAGE built in $((SECONDS - start)) s (inputs $inputs)" >&2
