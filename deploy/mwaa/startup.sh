#!/usr/bin/env bash
# MWAA startup script (the environment's StartupScriptS3Path): puts promtool on PATH for promshift's file deploys
# (`promtool check config`) and rules moves (`promtool check rules`), and points promshift at its catalog.
# MWAA runs it on every scheduler, worker and web server before Airflow starts; it must finish in 5 minutes.
#
# Nothing is downloaded: MWAA workers usually have no route out. Put a Prometheus release tarball in plugins.zip
# (plugins/promtool/prometheus-<version>.linux-<arch>.tar.gz) and its sha256 in PROMTOOL_SHA256 (an environment
# variable of the MWAA environment, or edit the default below). A missing tarball or a wrong sum fails loudly.
set -euo pipefail

PLUGINS_DIR="${AIRFLOW_HOME:-/usr/local/airflow}/plugins"
PROMTOOL_DIR="${PROMTOOL_DIR:-${AIRFLOW_HOME:-/usr/local/airflow}/promtool}"
PROMTOOL_SHA256="${PROMTOOL_SHA256:-}"

if [[ "${MWAA_AIRFLOW_COMPONENT:-worker}" == "webserver" ]]; then
  exit 0  # the web server runs no task: no promtool needed
fi

shopt -s nullglob
tarballs=("${PLUGINS_DIR}"/promtool/prometheus-*.tar.gz)
if (( ${#tarballs[@]} != 1 )); then
  echo "promshift startup: expected one prometheus-*.tar.gz in ${PLUGINS_DIR}/promtool, found ${#tarballs[@]}" >&2
  exit 1
fi
tarball="${tarballs[0]}"
if [[ -z "${PROMTOOL_SHA256}" ]]; then
  echo "promshift startup: set PROMTOOL_SHA256 to the sha256 of $(basename "${tarball}")" >&2
  exit 1
fi
if ! echo "${PROMTOOL_SHA256}  ${tarball}" | sha256sum --check --status; then
  echo "promshift startup: sha256 of $(basename "${tarball}") is not PROMTOOL_SHA256" >&2
  exit 1
fi

mkdir -p "${PROMTOOL_DIR}"
tar -xzf "${tarball}" -C "${PROMTOOL_DIR}" --strip-components=1 --wildcards '*/promtool'
"${PROMTOOL_DIR}/promtool" --version >/dev/null

export PATH="${PROMTOOL_DIR}:${PATH}"
export PROMSHIFT_CATALOG="${PROMSHIFT_CATALOG:-${AIRFLOW_HOME:-/usr/local/airflow}/dags/catalog/metric_groups.yaml}"
