#!/usr/bin/env bash
# Chromium, for the report test (tests/unit/test_doctor_report.py opens the doctor's report in
# headless Chromium). Called by `make test`. Nothing to do when `chromium` (or
# `chromium-browser`) is on PATH; else installed with apt-get when this user may (root, or
# passwordless sudo); else one line saying the exact command to run, and exit status 1, before
# any test starts.
set -euo pipefail

have_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
have_chromium && exit 0

# One line: what is missing and what to do; $1 is the command to run, or with -h, the advice.
fail() {
    local what="run \`$1\`"
    [ "$1" = -h ] && what=$2
    echo "install-browser: the report test needs Chromium, which is not installed: $what, then \`make test\` again" >&2
    exit 1
}

if ! command -v apt-get >/dev/null 2>&1; then
    # Not Debian or Ubuntu: name the package manager's own command where there is one.
    if command -v dnf >/dev/null 2>&1; then fail "sudo dnf install -y chromium"
    elif command -v zypper >/dev/null 2>&1; then fail "sudo zypper install -y chromium"
    elif command -v pacman >/dev/null 2>&1; then fail "sudo pacman -S --noconfirm chromium"
    else fail -h "install it with your system's package manager so that \`chromium\` is on PATH"
    fi
fi

if [ "$(id -u)" -eq 0 ]; then
    as_root=(env)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n env)
else
    fail "sudo apt-get update && sudo apt-get install -y chromium"
fi

echo "install-browser: installing Chromium with apt-get (for the report test)"
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -q ||
    fail "sudo apt-get update && sudo apt-get install -y chromium"
# Debian names the package chromium; Ubuntu has only chromium-browser (which installs the snap).
pkg=chromium
if ! apt-cache show chromium >/dev/null 2>&1 && apt-cache show chromium-browser >/dev/null 2>&1; then
    pkg=chromium-browser
fi
"${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" ||
    fail "sudo apt-get update && sudo apt-get install -y $pkg"
have_chromium || fail "sudo apt-get install -y $pkg"
echo "install-browser: $(command -v chromium || command -v chromium-browser) installed"
