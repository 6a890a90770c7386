# The Airflow image promshift runs in: the pinned requirements plus the promshift package,
# so the triggerer can import promshift.orchestration.triggers. Mirrors what the Makefile installs.
FROM apache/airflow:3.3.2-python3.11

USER root
# WITH_BROWSER_TEST=1 adds what `make chromium` installs (Debian's chromium + chromium-driver) for the
# migration board's browser test; a production image leaves it out.
ARG WITH_BROWSER_TEST=0
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus victoria-metrics \
 && if [ "$WITH_BROWSER_TEST" = "1" ]; then apt-get install -y --no-install-recommends chromium chromium-driver; fi \
 && rm -rf /var/lib/apt/lists/*
USER airflow

COPY --chown=airflow:root requirements.txt /opt/promshift/requirements.txt
RUN pip install --no-cache-dir -r /opt/promshift/requirements.txt

COPY --chown=airflow:root pyproject.toml /opt/promshift/
COPY --chown=airflow:root include /opt/promshift/include
COPY --chown=airflow:root catalog /opt/airflow/catalog
RUN pip install --no-cache-dir --no-deps /opt/promshift

COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins
ENV PROMSHIFT_CATALOG=/opt/airflow/catalog/metric_groups.yaml
