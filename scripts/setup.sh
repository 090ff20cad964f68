#!/usr/bin/env bash
# Installs what pagewise's tests and benchmarks need on a fresh Debian machine:
# the Rust components for lint checks, Redis for LDT's experiment (d), CRIU
# for SimGrid's experiment (c) (which skips with the reason where CRIU cannot
# run on the kernel), Memcached and its load generator (libmemcached-tools'
# memaslap) for DiME's Memcached experiment, a C compiler for the C API's
# tests, make, pkg-config and man-db for installing and packaging, Python's
# venv for the wheel, Chromium for the HTML report's test, Prometheus for the
# node agent's scrape test, AFL++ for the
# fuzzer driven through resets, and the nightly toolchain for counting the
# public API.
set -euo pipefail
if command -v rustup >/dev/null; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
    # The nightly toolchain, for rustdoc's JSON (scripts/public-api).
    rustup run nightly rustc --version >/dev/null 2>&1 ||
        rustup toolchain install nightly --profile minimal >/dev/null
fi
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v mkswap >/dev/null || need+=(util-linux)
command -v criu >/dev/null || need+=(criu)
command -v memcached >/dev/null || need+=(memcached)
command -v memcslap >/dev/null || command -v memaslap >/dev/null || need+=(libmemcached-tools)
command -v cc >/dev/null || need+=(gcc)
# Targets in containers with the runtime's defaults (podman with runc:
# Debian's crun refuses hybrid cgroups).
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
# The node agent's image (make image: a Debian base made with debootstrap)
# and the deployment's check (make deploy-check scrapes the agent's pod).
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
# The registry images reach the cluster of scripts/k8s-node through.
command -v docker-registry >/dev/null || need+=(docker-registry)
# The cluster's NetworkPolicy enforcer (kube-router's firewall) writes
# iptables rules and ipsets; its test's probe pods run Debian's static
# busybox (scripts/k8s-node).
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v ipset >/dev/null || [ -x /usr/sbin/ipset ] || need+=(ipset)
[ -x /bin/busybox ] && ! readelf -l /bin/busybox 2>/dev/null | grep -q INTERP || need+=(busybox-static)
# A real Prometheus (and promtool) scrapes the node agent in its tests.
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
# Certificates for the page server's TLS tests (CRIU's --tls).
command -v openssl >/dev/null || need+=(openssl)
# AFL++ for the fork server served by resets (pagewise snapshot afl), its
# test and its benchmark (afl-cc, afl-fuzz).
command -v afl-fuzz >/dev/null && command -v afl-cc >/dev/null || need+=(afl++)
# A command's own peak memory, as its parent cannot see it (wait4 counts
# the parent's memory before the exec): GNU time (pagewise bench sparse).
[ -x /usr/bin/time ] || need+=(time)
# Unpacking Debian's source packages (the real fuzz targets below).
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
# libFuzzer's runtime is C++ (scripts/fuzz).
command -v c++ >/dev/null || need+=(g++)
# Installing and packaging (make install, make deb and their checks).
command -v make >/dev/null || need+=(make)
command -v patchelf >/dev/null || need+=(patchelf)
command -v pkg-config >/dev/null || need+=(pkgconf)
command -v readelf >/dev/null || need+=(binutils)
command -v man >/dev/null || need+=(man-db)
[ -e /usr/share/bash-completion/bash_completion ] || need+=(bash-completion)
# The Python package (a wheel built in a virtual environment of the
# system's Python) and the HTML report's test (Debian's headless Chromium).
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v chromium >/dev/null || need+=(chromium)
if ((${#need[@]})); then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Real fuzz targets from Debian's source packages, unpacked once per
# machine outside the clone: cJSON, fuzzed through resets built with
# afl-cc (tests/afl_harness.rs), and cJSON and expat, fuzzed by the AFL++
# benchmark (experiments/src/afl.rs). A deb-src entry of the machine's
# own release is added where none is.
SRC_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/pagewise/src"
if { [ ! -f "$SRC_CACHE/cjson/cJSON.c" ] || [ ! -f "$SRC_CACHE/expat/expat/lib/xmlparse.c" ]; } \
    && [ "$(id -u)" -eq 0 ]; then
    if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
        cat >/etc/apt/sources.list.d/pagewise-deb-src.sources <<SRC
# Written by pagewise's scripts/setup.sh: source packages of real fuzz targets.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        apt-get update -qq
    fi
    mkdir -p "$SRC_CACHE"
    for package in cjson expat; do
        unpack=$(mktemp -d)
        (cd "$unpack" && apt-get source -qq "$package" >/dev/null 2>&1)
        rm -rf "${SRC_CACHE:?}/$package"
        mv "$unpack/$package"-*/ "$SRC_CACHE/$package"
        rm -rf "$unpack"
    done
fi
# CRIU 4.2, built once per machine outside the clone from the source the
# project is given (../shared/thirdparty; Debian's criu 3.17 does not run
# on this kernel): pagewise's page server is tested against CRIU itself
# (crates/faces/cli/tests/criu_cli.rs; testkit::criu finds it here).
CRIU_SHA256=28b727b9af07681a8173ea6f2bbadeaf603b03b50881f5ec69020e5ecf205412
CRIU_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/pagewise/criu-4.2"
if [ ! -x "$CRIU_DIR/criu/criu" ] && [ "$(id -u)" -eq 0 ]; then
    root=$(cd "$(dirname "$0")/.." && pwd)
    tarball=""
    for d in "${PAGEWISE_THIRDPARTY:-}" "$root/../shared/thirdparty" "$root/../../shared/thirdparty"; do
        if [ -n "$d" ] && [ -f "$d/criu-4.2.tar.gz" ]; then
            tarball="$d/criu-4.2.tar.gz"
            break
        fi
    done
    if [ -z "$tarball" ]; then
        echo "setup: no criu-4.2.tar.gz (PAGEWISE_THIRDPARTY or ../shared/thirdparty): CRIU's tests will skip" >&2
    elif ! echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet -; then
        echo "setup: $tarball is not CRIU 4.2 as given (sha256 differs)" >&2
        exit 1
    else
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            protobuf-compiler protobuf-c-compiler libprotobuf-dev libprotobuf-c-dev \
            libnet1-dev libnl-3-dev libcap-dev uuid-dev libbsd-dev libgnutls28-dev \
            pkg-config build-essential >/dev/null
        build=$(mktemp -d)
        tar -xzf "$tarball" -C "$build"
        make -s -C "$build/criu-4.2" -j"$(nproc)" criu >"$build/build.log" 2>&1 ||
            { tail -20 "$build/build.log" >&2; exit 1; }
        mkdir -p "$(dirname "$CRIU_DIR")"
        rm -rf "$CRIU_DIR"
        mv "$build/criu-4.2" "$CRIU_DIR"
        rm -rf "$build"
    fi
fi
# The documentation book's builder, a crate at a pinned version.
MDBOOK_VERSION=0.4.52
if ! mdbook --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
    cargo install --locked --quiet mdbook --version "$MDBOOK_VERSION"
fi
# Coverage-guided fuzzing (scripts/fuzz): cargo fuzz, a crate at a pinned
# version, on the nightly toolchain.
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
# Podman's defaults for this machine, where no containers.conf says
# otherwise: runc (Debian's crun refuses hybrid cgroups) and the limits
# runc needs said (it starts no container without nofile and nproc). The
# tests pass the same as flags; this makes a plain `podman run` work too.
if command -v podman >/dev/null && [ ! -e /etc/containers/containers.conf ] &&
    [ "$(id -u)" -eq 0 ]; then
    mkdir -p /etc/containers
    cat >/etc/containers/containers.conf <<'CONF'
# Written by pagewise's scripts/setup.sh.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
fi
# Debian's package may start a system redis; the benchmarks start their own.
# Debian's memcached package may start a system memcached too.
systemctl disable --now memcached >/dev/null 2>&1 || true
echo "setup: ok ($(redis-server --version | cut -d' ' -f3), memcached $(memcached -V | cut -d' ' -f2), $(mdbook --version), $(cargo --version))"
