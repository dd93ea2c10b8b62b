#!/usr/bin/env bash
# Build ratchet's container image without a Docker engine, as root:
#
#   1. a minimal Debian root filesystem (debootstrap) with Python 3.11, cached as a tarball;
#   2. in it (chroot): ratchet's wheel and its dependencies from deploy/requirements.lock,
#      binary wheels only, each checked against its hash, into /opt/ratchet/venv; then the
#      build tools are removed and the non-root user created;
#   3. `buildah from scratch` + that filesystem + the image config (entrypoint `tini -s --
#      ratchet`, user, env,
#      volume, labels) -> `buildah commit` to the OCI archive dist/ratchet-<version>.oci.tar.
#
# deploy/Dockerfile builds the same image with Docker: same lock, user, paths, entrypoint
# (tests/unit/test_image_definition.py compares the two and deploy/k8s).
#
# usage: deploy/build-image.sh [OUTPUT_DIR]          (default OUTPUT_DIR: dist)
# environment:
#   RATCHET_IMAGE_CACHE       cached base filesystem and wheels (default ~/.cache/ratchet/image)
#   RATCHET_IMAGE_BASE_DAYS   rebuild the cached base when older, for Debian's security
#                             updates (default 7)
#   RATCHET_IMAGE_MIRROR      Debian mirror URL (default: debootstrap's own)
#   RATCHET_IMAGE_SECURITY    Debian security mirror URL (default: <mirror>-security)
set -euo pipefail
cd "$(dirname "$0")/.."

# --- the image's fixed facts (deploy/Dockerfile states the same; a unit test checks)
SUITE=bookworm                        # Debian 12: its python3.11 is the Python we lock for
USER_NAME=ratchet
USER_ID=10001
VENV=/opt/ratchet/venv
DATA=/var/lib/ratchet                 # RATCHET_HOME: worker health files, Faust data dir
LOCK=deploy/requirements.lock
BUILD_LOCK=deploy/build-requirements.lock   # the build backend of ratchet's own wheel
# libstdc++6: the C++ driver's wheel (acsylla) links it, as manylinux allows (apt needs it
# too, so it is there today; named so that it stays). tini: the entrypoint's PID 1, which
# forwards a stop to ratchet (a SIGTERM to a PID 1 with no handler yet is dropped).
BASE_PACKAGES="python3.11 python3.11-venv ca-certificates libstdc++6 tini"
BASE_RECIPE=2                         # bump when the base recipe below changes

OUT_DIR=${1:-dist}
CACHE=${RATCHET_IMAGE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ratchet/image}
BASE_DAYS=${RATCHET_IMAGE_BASE_DAYS:-7}
t0=$SECONDS
say() { printf '==> [%4ds] %s\n' $((SECONDS - t0)) "$*"; }
die() { echo "build-image: $*" >&2; exit 1; }

# --- prerequisites: root, Debian's debootstrap and buildah (installed when missing)
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and buildah need it)"
case "$(uname -m)" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) die "unsupported $(uname -m)" ;; esac
if ! command -v debootstrap >/dev/null || ! command -v buildah >/dev/null; then
  command -v apt-get >/dev/null || die "install debootstrap and buildah first"
  say "installing debootstrap and buildah from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap buildah >/dev/null
fi
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
[ -n "$VERSION" ] || die "no version in pyproject.toml"
ARCHIVE=$OUT_DIR/ratchet-$VERSION.oci.tar

WORK=$(mktemp -d /var/tmp/ratchet-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE/wheels" "$OUT_DIR"

# Run a command inside root filesystem $1 with /proc and /dev mounted, plus the binds
# "host_path:path_in_root" listed in $BINDS. Everything is mounted in a private mount
# namespace, so nothing stays mounted when the command ends, however it ends. The
# environment is reset: nothing of the host's (pip settings, say) leaks into the build.
in_root() {
  local root=$1; shift
  BINDS=${BINDS:-} unshare --mount --propagation private -- /bin/bash -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    for pair in $BINDS; do
      if [ -d "${pair%%:*}" ]; then mkdir -p "$root/${pair#*:}"; else touch "$root/${pair#*:}"; fi
      mount --bind "${pair%%:*}" "$root/${pair#*:}"
    done
    exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
      LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 \
      PIP_PROGRESS_BAR=off ${PIP_CERT:+PIP_CERT=$PIP_CERT} "$@"' bash "$root" "$@"
}

# pip inside the root trusts the host's CA bundle (a proxy in the way has its own CA);
# the bundle is bind-mounted for the build only, never copied into the image.
HOST_CA=/etc/ssl/certs/ca-certificates.crt
CA_BIND=""
if [ -f "$HOST_CA" ]; then CA_BIND="$HOST_CA:/run/build-ca.crt"; export PIP_CERT=/run/build-ca.crt; fi

# --- 1. the base root filesystem, cached ------------------------------------------------
build_base() {
  local base=$1
  say "debootstrap $SUITE ($ARCH, minbase): about a minute, progress below"
  # shellcheck disable=SC2086 # an empty mirror must vanish from the command
  debootstrap --variant=minbase --arch="$ARCH" "$SUITE" "$base" ${RATCHET_IMAGE_MIRROR:-} 2>&1 \
    | grep --line-buffered -E '^I: (Retrieving (Release|Packages) |Resolving dependencies of base|Installing core|Unpacking the base|Configuring the base|Base system installed)' || true
  [ -x "$base/usr/bin/apt-get" ] || die "debootstrap failed (see $base/debootstrap/debootstrap.log)"
  local mirror security
  mirror=$(awk '$1 == "deb" {print $2; exit}' "$base/etc/apt/sources.list")
  security=${RATCHET_IMAGE_SECURITY:-${mirror%/}-security}
  cat > "$base/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security $SUITE-security main
EOF
  # Like Debian's slim images: no manuals, docs (copyright files kept) or translations.
  cat > "$base/etc/dpkg/dpkg.cfg.d/01-ratchet-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  cp -L /etc/resolv.conf "$base/etc/resolv.conf"
  say "apt-get: security updates, then $BASE_PACKAGES"
  in_root "$base" /bin/sh -ec "
    apt-get update -qq
    apt-get upgrade -y -qq >/dev/null
    apt-get install -y -qq --no-install-recommends $BASE_PACKAGES >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/cache/debconf/*-old
    find /usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete
    rm -rf /usr/share/man/* /usr/share/info/* /usr/share/locale/*"
  rm -rf "$base/debootstrap"
}

key=$(printf '%s\n' "$SUITE" "$ARCH" "$BASE_PACKAGES" "$BASE_RECIPE" "${RATCHET_IMAGE_MIRROR:-}" \
      | sha256sum | cut -c1-12)
BASE_TAR=$CACHE/base-$SUITE-$ARCH-$key.tar
if [ -f "$BASE_TAR" ] && [ -z "$(find "$BASE_TAR" -mtime "+$BASE_DAYS")" ]; then
  say "base filesystem from cache: $BASE_TAR"
else
  build_base "$WORK/base"
  say "caching the base filesystem: $BASE_TAR"
  tar --numeric-owner -C "$WORK/base" -cf "$BASE_TAR.tmp" .
  mv "$BASE_TAR.tmp" "$BASE_TAR"
  rm -rf "$WORK/base"
fi
ROOT=$WORK/rootfs
mkdir "$ROOT"
tar --numeric-owner -C "$ROOT" -xf "$BASE_TAR"

# --- 2. ratchet inside it ------------------------------------------------------------------
# The source is the work tree's files known to git (tracked, or new and not ignored);
# the revision label says "-dirty" when they differ from the commit.
mkdir -p "$ROOT/build/src"
if REVISION=$(git rev-parse HEAD 2>/dev/null); then
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -x -C "$ROOT/build/src"
  [ -z "$(git status --porcelain)" ] || REVISION="$REVISION-dirty"
  SOURCE=${RATCHET_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || echo unknown)}
else
  tar --exclude=.venv --exclude=.git --exclude=dist --exclude=.ratchet -cf - . | tar -x -C "$ROOT/build/src"
  REVISION=unknown SOURCE=${RATCHET_IMAGE_SOURCE:-unknown}
fi
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
# ratchet's wheel compiles its C module (ratchet/_speedups.c): a compiler, Python's and
# OpenSSL's headers, for this step only (removed below, with the other build tools).
BUILD_PACKAGES="gcc libc6-dev python3.11-dev libssl-dev"
say "build tools for ratchet's C module: $BUILD_PACKAGES"
in_root "$ROOT" /bin/sh -ec "
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $BUILD_PACKAGES >/dev/null"
say "wheels: ratchet's, and the locked dependencies (downloads cached in $CACHE/wheels)"
BINDS="$CACHE/wheels:/build/wheels $CA_BIND" in_root "$ROOT" /bin/bash -ec "
  set -o pipefail
  python3.11 -m venv /build/venv
  /build/venv/bin/pip install --quiet --require-hashes --only-binary=:all: \
    --requirement /build/src/$BUILD_LOCK
  /build/venv/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /build/dist \
    /build/src
  fetch() { /build/venv/bin/pip download --require-hashes --only-binary=:all: \
              --dest /build/wheels --requirement /build/src/$LOCK \"\$@\"; }
  # Every locked wheel already cached: no index to ask (61 lookups cost a minute).
  fetch --quiet --no-index --find-links /build/wheels 2>/dev/null \
    || fetch | { grep -E '^Saved' || true; }"
say "installing into $VENV: hashes required, binary wheels only, no index"
BINDS="$CACHE/wheels:/build/wheels" in_root "$ROOT" /bin/sh -ec "
  python3.11 -m venv $VENV
  $VENV/bin/pip install --quiet --no-index --find-links /build/wheels --require-hashes \
    --only-binary=:all: --requirement /build/src/$LOCK
  $VENV/bin/pip install --quiet --no-index --no-deps /build/dist/ratchet-*.whl
  $VENV/bin/pip check
  $VENV/bin/pip uninstall --quiet --yes pip setuptools
  $VENV/bin/ratchet --version
  $VENV/bin/python -c 'import ratchet._speedups'  # the C module was built"
say "removing build tools and caches; user $USER_NAME ($USER_ID) owns $DATA"
in_root "$ROOT" /bin/sh -ec "
  # ensurepip's wheels, the C module's build tools and what only they needed
  # (python3-distutils, lib2to3, binutils, ...)
  # (binutils by name: python3.11 suggests it, so autoremove would keep it)
  apt-get purge -y -qq --autoremove python3.11-venv python3-pip-whl python3-setuptools-whl \
    $BUILD_PACKAGES binutils binutils-common libbinutils >/dev/null
  apt-get clean
  rm -rf /build /root/.cache /tmp/* /var/tmp/* /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log
  groupadd --gid $USER_ID $USER_NAME
  useradd --uid $USER_ID --gid $USER_ID --home-dir $DATA --no-create-home \
    --shell /usr/sbin/nologin $USER_NAME
  install -d -o $USER_ID -g $USER_ID -m 0750 $DATA"
# The runtime provides these; the build's copy names the build machine's resolver.
rm -f "$ROOT/etc/resolv.conf" "$ROOT/etc/hostname"
# What is inside, for the record: the venv's Python packages and the Debian packages.
SBOM=$OUT_DIR/ratchet-$VERSION.sbom.txt
{
  echo "# Python packages in $VENV"
  in_root "$ROOT" "$VENV/bin/python" -c 'import importlib.metadata as m
for line in sorted(f"{d.name}=={d.version}" for d in m.distributions()):
    print(line)'
  echo "# Debian packages"
  in_root "$ROOT" dpkg-query --show --showformat '${Package}=${Version}\n'
} > "$SBOM"

# --- 3. the OCI image ----------------------------------------------------------------------
ROOT_SIZE=$(du -sh "$ROOT" | cut -f1)
say "committing with buildah (root filesystem $ROOT_SIZE)"
tar --numeric-owner -C "$ROOT" -cf "$WORK/rootfs.tar" .
rm -rf "$ROOT"
# A storage of its own under $WORK: the build leaves nothing in /var/lib/containers.
B=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
ctr=$("${B[@]}" from scratch)
"${B[@]}" add --quiet "$ctr" "$WORK/rootfs.tar" /
"${B[@]}" config \
  --entrypoint '["tini", "-s", "--", "ratchet"]' --cmd '["--help"]' \
  --user "$USER_ID:$USER_ID" --workingdir "$DATA" --volume "$DATA" \
  --env "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --env "RATCHET_HOME=$DATA" --env RATCHET_API_HOST=0.0.0.0 \
  --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
  --port 8080/tcp --port 9108/tcp \
  --label org.opencontainers.image.title=ratchet \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.revision="$REVISION" \
  --label org.opencontainers.image.source="$SOURCE" \
  --created-by "deploy/build-image.sh" "$ctr"
rm -f "$ARCHIVE"
"${B[@]}" commit --quiet --format oci --disable-compression=false --rm "$ctr" \
  "oci-archive:$ARCHIVE:$VERSION" >/dev/null
DIGEST=$(tar -xOf "$ARCHIVE" index.json | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')
say "built $ARCHIVE"
echo "image:    ratchet:$VERSION (revision $REVISION)"
echo "digest:   $DIGEST"
echo "size:     $(stat -c %s "$ARCHIVE") bytes compressed ($(du -h "$ARCHIVE" | cut -f1)), root filesystem $ROOT_SIZE"
echo "packages: $SBOM"
