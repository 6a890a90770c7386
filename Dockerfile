# The production image: Airflow 3.3.2, the pinned production requirements (requirements.txt) and the promshift
# wheel, which leaves out the lab (promshift.local: stand-in servers, demo drivers). Build from the repo root:
#   docker build --build-arg PROMETHEUS_VERSION=<your fleet's Prometheus version> -t promshift .
# The fleet's version is what its source answers on /api/v1/status/buildinfo (data.version); validate refuses a
# promtool older than the source (docs/deployment.md#promtool).
# No container engine runs in CI: tests/package/test_wheel.py builds the same wheel from the same two inputs
# (pyproject.toml, include/), installs it with --no-deps over requirements.txt in a fresh venv, and loads the
# provider, the DAGs and the CLI there; it also reads this file, so the two cannot drift apart silently.
# tests/package/test_image_layer.py carries out this file's own COPY/ENV/pip steps, stage by stage, in fresh venvs.

# promtool comes from the official Prometheus image of this version: set it to your fleet's (3.5.0 is a default).
ARG PROMETHEUS_VERSION=3.5.0

# Stage 1: the wheel, built as the test builds it (setuptools at requirements.txt's pin, no build isolation).
FROM apache/airflow:3.3.2-python3.11 AS wheel
WORKDIR /tmp/promshift
COPY requirements.txt pyproject.toml README.md LICENSE ./
COPY include ./include
RUN pip install --no-cache-dir "$(grep -E '^setuptools==' requirements.txt)" \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/dist .

# Stage 2: promtool, as the Prometheus project builds it (a static binary at /bin/promtool).
FROM prom/prometheus:v${PROMETHEUS_VERSION} AS promtool

# Stage 3: the image.
FROM apache/airflow:3.3.2-python3.11

# promtool: production checks a config with `promtool check config` before it deploys a source's config file,
# and rule files with `promtool check rules` before a rules move (adapters/deploy.py, adapters/rules_deploy.py),
# against its own version's schema: the fleet's version, never an older one (validate refuses that in one line).
COPY --from=promtool /bin/promtool /usr/local/bin/promtool

COPY --chown=airflow:root requirements.txt /opt/promshift/requirements.txt
RUN pip install --no-cache-dir -r /opt/promshift/requirements.txt

COPY --from=wheel --chown=airflow:root /tmp/dist/ /opt/promshift/dist/
RUN pip install --no-cache-dir --no-deps /opt/promshift/dist/promshift-*.whl

COPY --chown=airflow:root catalog /opt/airflow/catalog
COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins
ENV PROMSHIFT_CATALOG=/opt/airflow/catalog/metric_groups.yaml
# Fail closed: every store named, none defaulted (docs/deployment.md#production-fails-closed)
ENV PROMSHIFT_ENV=production
