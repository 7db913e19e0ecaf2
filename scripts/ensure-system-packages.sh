#!/usr/bin/env bash
# Installs the Debian packages the test suite needs when they are missing:
# prometheus (promtool and the server, for the alert-rule tests), a Java runtime
# (for the local Spark session), etcd-server (the metadata log's HA backend and its
# tests) and kcat (a real Kafka client against the brokers' Kafka listener). Safe to run
# repeatedly; does nothing when all are present.
set -euo pipefail
need=()
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  need+=(prometheus)
fi
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
echo "installing Debian packages: ${need[*]}"
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
