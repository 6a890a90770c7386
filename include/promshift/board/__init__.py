"""The migration board: an Airflow UI plugin over the audit log (see ``plugins/promshift_board.py``)."""

# Where Airflow's API server mounts the board's FastAPI app.
URL_PREFIX = "/promshift"
