# The production image: Airflow 3.3.2, the pinned production requirements (requirements.txt) and the promshift
# wheel, which leaves out the lab (promshift.local: stand-in servers, demo drivers). Build from the repo root:
#   docker build -t promshift .
#   docker build --build-arg WITH_PROMTOOL=0 -t promshift .   # without promtool (see below)
# No container engine runs in CI: tests/package/test_wheel.py builds the same wheel from the same two inputs
# (pyproject.toml, include/), installs it with --no-deps over requirements.txt in a fresh venv, and loads the
# provider, the DAGs and the CLI there; it also reads this file, so the two cannot drift apart silently.
# tests/package/test_image_layer.py carries out this file's own COPY/ENV/pip steps, stage by stage, in fresh venvs.

# Stage 1: the wheel, built as the test builds it (setuptools at requirements.txt's pin, no build isolation).
FROM apache/airflow:3.3.2-python3.11 AS wheel
WORKDIR /tmp/promshift
COPY requirements.txt pyproject.toml README.md LICENSE ./
COPY include ./include
RUN pip install --no-cache-dir "$(grep -E '^setuptools==' requirements.txt)" \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /tmp/dist .

# Stage 2: the image.
FROM apache/airflow:3.3.2-python3.11

# promtool: production checks a config with `promtool check config` before it deploys a source's config file,
# and rule files with `promtool check rules` before a rules move (adapters/deploy.py, adapters/rules_deploy.py).
# Debian's prometheus package is what provides promtool (2.42, the version the tests check against); the
# Prometheus server it also ships is never started here. WITH_PROMTOOL=0 leaves it out: only for deployments
# whose sources are all deployed through Kubernetes (extra.deploy a ConfigMap or Prometheus CR) and that move no
# rule files; a file deploy or rules move without promtool fails with "'promtool' not found".
ARG WITH_PROMTOOL=1
USER root
RUN if [ "$WITH_PROMTOOL" = "1" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends prometheus \
      && rm -rf /var/lib/apt/lists/*; \
    fi
USER airflow

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
