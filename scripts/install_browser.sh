#!/usr/bin/env bash
# Installs Debian's headless browser (chromium and its WebDriver, chromium-driver) when
# missing: tests/console/ drive the operator's console in a real browser through Selenium,
# pointed at /usr/bin/chromedriver (Selenium Manager would download a browser, which an
# offline machine cannot). Idempotent: does nothing when both are there; says why it
# installed nothing when not root or without apt-get (the browser tests then skip, or fail
# where CI / RAGPLANE_REQUIRE_BROWSER=1 says a browser is expected).
set -u

packages=(chromium chromium-driver)

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$p")
        fi
    done
else
    echo "install_browser.sh: no dpkg here; install chromium and its chromedriver" \
         "(the console's browser tests need them)" >&2
    exit 0
fi

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser.sh: not root or no apt-get; not installing ${missing[*]}" \
         "(the console's browser tests need them)" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { echo "install_browser.sh: could not install ${missing[*]}" >&2; exit 0; }
fi
echo "install_browser.sh: installed ${missing[*]}"
