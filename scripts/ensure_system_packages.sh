#!/usr/bin/env bash
# Debian packages the sandbox and its tests need, installed when missing (a no-op otherwise):
# - bubblewrap: every sandboxed run's namespaces, private /tmp and /dev/shm and no-new-privileges
#   (docs/operations.md, "Isolation of one run");
# - libseccomp2: compiles every sandboxed run's syscall filter (through the pyseccomp package);
# - openssl: the sandbox service's TLS tests make their certificates with it;
# - python3-pytest: pytest for the sandbox's interpreter (the system python3, which the sandbox
#   uid can run), so the SWE service can score pytest repositories;
# - chromium: the headless browser the dashboard's tests load the page in (charts drawn, content);
# - iproute2: ip and tc, for the two-site tests over network namespaces and a tc-tbf-capped veth
#   (tests/netns_link.py);
# - slurm-wlm and munge: the one-host Slurm cluster (munged, slurmctld, slurmd) that the
#   launcher's end-to-end test submits to (tests/slurm_cluster.py); without their recommended
#   plugins (3.5 MB, ≈8 s to install; with them ≈35 packages more).
# Installing needs root and apt (Debian/Ubuntu).
set -euo pipefail
missing=()
bare=()  # installed without their recommendations
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
/sbin/ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 ' || missing+=(libseccomp2)
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c "import pytest" >/dev/null 2>&1; then
    missing+=(python3-pytest)
fi
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
{ command -v ip && command -v tc; } >/dev/null 2>&1 || missing+=(iproute2)
{ command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null 2>&1 ||
    bare+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || bare+=(munge)
if [ ${#missing[@]} -eq 0 ] && [ ${#bare[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_system_packages.sh: missing ${missing[*]} ${bare[*]}; install them (needs root and apt)" >&2
    exit 1
fi
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if [ ${#bare[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${bare[@]}"
fi
