#!/usr/bin/env bash
# install-packages.sh PKG... installs Debian packages with apt-get, for
# scripts/dev.sh and .ci/run, and leaves no system configuration behind:
#   - services are not started during the install: a /usr/sbin/policy-rc.d
#     that refuses is written only when none exists, and removed afterwards;
#   - a PostgreSQL cluster the install created (Debian's "main") is dropped
#     (never one that existed before); createcluster.conf is not touched.
# Runs apt-get as root, or through sudo when not root.
set -euo pipefail
(($#)) || exit 0

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "install-packages.sh: need root (or sudo) to install: $*" >&2
		exit 1
	fi
	SUDO=(sudo)
fi

clusters_before="$(compgen -G '/etc/postgresql/*/*' || true)"
created_policy=0
cleanup() {
	if ((created_policy)); then
		"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
	fi
}
trap cleanup EXIT

if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\n# lockpool scripts/install-packages.sh: no service starts during its apt-get install (removed afterwards)\nexit 101\n' |
		"${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
	"${SUDO[@]}" chmod 0755 /usr/sbin/policy-rc.d
	created_policy=1
fi

echo "installing with apt-get: $*" >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >/dev/null

# Debian's postgresql-NN package creates and (without policy-rc.d) starts a
# "main" cluster on port 5432. lockpool's scripts and tests run their own:
# drop a cluster this install created, never one that was there before.
for conf in /etc/postgresql/*/*; do
	[[ -d $conf ]] || continue
	if ! grep -qxF "$conf" <<<"$clusters_before"; then
		ver="$(basename "$(dirname "$conf")")"
		name="$(basename "$conf")"
		echo "install-packages.sh: dropping cluster $ver/$name, which the package install created" >&2
		"${SUDO[@]}" pg_dropcluster --stop "$ver" "$name"
	fi
done
