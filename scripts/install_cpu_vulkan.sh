#!/usr/bin/env bash
# SAPIEN needs a Vulkan device even for CPU simulation. On Debian 12 the Mesa software
# driver (lavapipe) in the main suite is too old for SAPIEN; the one in bookworm-backports
# works. The backports suite is derived from this machine's own Debian apt source, so no
# mirror is named here. On Ubuntu the main archive's Mesa is recent enough.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

. /etc/os-release
if [ "${ID:-}" = "debian" ] && [ "${VERSION_CODENAME:-}" = "bookworm" ]; then
  backports=/etc/apt/sources.list.d/bookworm-backports.sources
  if [ ! -f "$backports" ]; then
    uri=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      uri=$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ {print u; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
      uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list)
    fi
    if [ -z "$uri" ]; then
      echo "error: no Debian bookworm apt source found to derive bookworm-backports from" >&2
      exit 1
    fi
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$uri" \
      | $sudo_cmd tee "$backports" >/dev/null
  fi
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers libvulkan1
else
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq mesa-vulkan-drivers libvulkan1
fi
