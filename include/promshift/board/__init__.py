"""The migration board: an Airflow UI plugin over the audit log (see ``plugins/promshift_board.py``)."""

from promshift.core.urls import URL_PREFIX  # noqa: F401 - where Airflow's API server mounts the board
