#!/usr/bin/env bash
# System packages holdover's demo and tests need: Mosquitto (the tests start their own on
# loopback; the system service is never used) and Python's venv module.
# `ensure-system-deps.sh demo` checks only what the demo needs; `site`, what the site tier adds.
set -euo pipefail
for_what=${1:-test}
need=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# gcore (gdb) dumps a training process that cannot checkpoint in time; tmux hosts `holdover launch`;
# iproute2 (ip, and unshare from util-linux) seals the tests off the network.
if [ "$for_what" = site ]; then
  # The site tier: mmdebstrap builds its Debian 12 image, systemd-nspawn boots it.
  command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
  command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
elif [ "$for_what" != demo ]; then
  command -v gdb >/dev/null 2>&1 || need+=(gdb)
  command -v tmux >/dev/null 2>&1 || need+=(tmux)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  # nft imposes random packet loss inside the failover tests' own namespaces (no netem here).
  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
  # NUT's own upsd and dummy-ups stand in for the host's UPS (tests start them on loopback).
  [ -x /lib/nut/upsd ] && [ -x /lib/nut/dummy-ups ] || need+=(nut-server)
  command -v upsc >/dev/null 2>&1 || need+=(nut-client)
  # Debian's Slurm and munge: the cluster tests start their own controller and nodes in network
  # namespaces (holdover.lab.slurm); the packages' own services are kept from starting below.
  [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || need+=(slurmd)
  command -v scontrol >/dev/null 2>&1 || need+=(slurm-client)
  [ -x /usr/sbin/munged ] || need+=(munge)
  # Tools the tests run from Debian packages that are unpacked, not installed, into .cache/PKG: the
  # packages would enable daemons (apcupsd hunting a USB UPS at boot, a Prometheus server).
  # apcaccess reads the tests' stand-in for apcupsd's NIS; promtool checks /metrics.
  cache="$(cd "$(dirname "$0")/.." && pwd)/.cache"
  for pair in apcupsd:sbin/apcaccess prometheus:usr/bin/promtool; do
    pkg=${pair%%:*} tool=${pair#*:}
    command -v "$(basename "$tool")" >/dev/null 2>&1 && continue
    [ -x "$cache/$pkg/root/$tool" ] && continue
    rm -rf "${cache:?}/$pkg" && mkdir -p "$cache/$pkg/deb"
    (cd "$cache/$pkg/deb" && { apt-get download -qq "$pkg" >/dev/null 2>&1 || { apt-get update -qq && apt-get download -qq "$pkg"; }; }) &&
      dpkg-deb -x "$cache/$pkg"/deb/"$pkg"_*.deb "$cache/$pkg/root" && echo "unpacked: $(basename "$tool")"
  done
  # The dashboard test drives Debian's chromium through Playwright (no browser download).
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "holdover needs: ${need[*]}. Install them with:  sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No package's daemon is started by installing it (slurmctld, slurmd, munge, mosquitto): the tests
# start their own, and a system slurmd would hunt for a controller. policy-rc.d is Debian's switch.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq "${need[@]}" >/dev/null
echo "installed: ${need[*]}"
