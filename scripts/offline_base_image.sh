#!/usr/bin/env bash
# Build a stand-in for `python:3.11-slim` from Debian's packages, for machines that reach
# Debian's and PyPI's mirrors but not Docker Hub (how the Dockerfile was verified here).
# The image is Debian bookworm (minbase) with its python3.11, python3-venv and CA
# certificates, tagged python:3.11-slim so that `docker build .` uses it without pulling.
# HOST_CA (default: this machine's bundle) is copied in, for networks that intercept TLS.
set -euo pipefail
ROOTFS=${ROOTFS:-$(mktemp -d)}
HOST_CA=${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
command -v debootstrap >/dev/null || apt-get install -y debootstrap
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" http://deb.debian.org/debian
ln -sf python3 "$ROOTFS/usr/bin/python"
cp "$HOST_CA" "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
tar -C "$ROOTFS" -c . | docker import \
  -c 'ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  - python:3.11-slim
