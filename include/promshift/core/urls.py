"""Where the migration board lives under the Airflow UI: owned here, below the board and the Airflow shell, so
both link to it without the shell importing the board."""

from __future__ import annotations

# Where Airflow's API server mounts the board's FastAPI app.
URL_PREFIX = "/promshift"
