#!/usr/bin/env bash
# Debian packages the tests use: Chromium (browser tests, driven by Playwright; never a
# downloaded browser) and hdf5-tools (h5dump reads our profiles without popviz).
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v h5dump >/dev/null 2>&1 || need+=(hdf5-tools)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
        echo "install-system-deps: need root to apt-get install ${need[*]}" >&2; exit 1
    fi
else SUDO=; fi
echo "install-system-deps: apt-get install ${need[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
