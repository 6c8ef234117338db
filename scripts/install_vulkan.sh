#!/usr/bin/env bash
# Installs a software Vulkan driver (Mesa's lavapipe) so embedder_rs's wgpu backend
# can be tested without a GPU. Idempotent: does nothing when the packages are
# present; quietly does nothing when not root or when apt-get is unavailable.
set -u

packages=(mesa-vulkan-drivers libvulkan1)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
else
    exit 0
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_vulkan.sh: not root or no apt-get; skipping ${missing[*]}" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { echo "install_vulkan.sh: could not install ${missing[*]}" >&2; exit 0; }
fi
echo "install_vulkan.sh: installed ${missing[*]}"
