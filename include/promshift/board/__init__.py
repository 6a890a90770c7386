"""The migration board: an Airflow UI plugin over the audit log (see ``plugins/promshift_board.py``)."""
