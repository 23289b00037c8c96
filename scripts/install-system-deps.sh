#!/usr/bin/env bash
# Install the Debian packages iepm runs on, only those missing. Safe to re-run.
set -euo pipefail

# command -> Debian package
declare -A NEEDED=(
  [iperf3]=iperf3
  [ping]=iputils-ping
  [traceroute]=traceroute
  [fping]=fping
  [ip]=iproute2
  [tc]=iproute2
  [ps]=procps
  [/usr/lib/postgresql/15/bin/initdb]=postgresql
  [chromium]=chromium            # browser tests (Playwright drives Debian's chromium)
  [/usr/sbin/sshd]=openssh-server  # SSH-mode lab tests start private sshd instances
  [wrk]=wrk                      # benchmarks/web.py's load generator (C, light on the CPU)
  [xrdcp]=xrootd-client          # the xrdcp_mem / xrdcp_disk probes (monitor side)
  [xrootd]=xrootd-server         # the agent's xrootd server kind (target side)
  [/usr/lib/python3/dist-packages/XRootD]=python3-xrootd  # commit step of xrdcp_disk
  [rsync]=rsync                  # rsync_mem / rsync_disk (monitor, and SSH targets need it too)
  [ssh]=openssh-client           # rsync_mem / rsync_disk log in with OpenSSH's client
  [globus-url-copy]=globus-gass-copy-progs  # gridftp_mem / gridftp_disk (monitor side)
  [/usr/sbin/globus-gridftp-server]=globus-gridftp-server-progs  # the agent's gridftp kind (target side)
  [nfdump]=nfdump                # `iepm flows import` reads nfcapd files; nfcapd: benchmarks/flows.py
  [sqlite3]=sqlite3              # benchmarks/flows.py: the archive's own ceiling (.import)
  [/usr/sbin/softflowd]=softflowd  # the lab's flow exporter (tests/flows/test_lab_flows.py)
)
missing=()
for cmd in "${!NEEDED[@]}"; do
  if [[ "$cmd" == /* ]]; then [[ -x "$cmd" ]] && continue
  else command -v "$cmd" >/dev/null 2>&1 && continue; fi
  missing+=("${NEEDED[$cmd]}")
done
# A virtualenv needs python3-venv on Debian's own Python.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then missing+=(python3-venv); fi
if [[ ${#missing[@]} -eq 0 ]]; then exit 0; fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]]; then
  echo "iepm needs these Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# iperf3 asks whether to start a system-wide daemon; we never want one.
echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian's nfdump package enables an nfcapd service of its own; iepm collects itself.
if printf '%s\n' "${missing[@]}" | grep -qx nfdump && command -v systemctl >/dev/null; then
  systemctl disable --now nfdump.service >/dev/null 2>&1 || true
fi
# Debian's postgresql package starts a cluster of its own; the tests run private ones.
if printf '%s\n' "${missing[@]}" | grep -qx postgresql && command -v pg_ctlcluster >/dev/null; then
  pg_ctlcluster 15 main stop >/dev/null 2>&1 || true
fi
