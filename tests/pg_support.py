"""The PostgreSQL server fixture for tests marked `postgres` (slurm/postgres/start.sh)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT_URL = "postgresql://armorlab:armorlab@127.0.0.1:16832/armorlab"


def reachable(url: str) -> str | None:
    """None when ``url`` accepts a connection, else why not."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]
    return None


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """URL of the server of slurm/postgres/start.sh ($ARMORLAB_POSTGRES_URL, else its default).
    Skips when unreachable, unless ARMORLAB_REQUIRE_POSTGRES=1 (set by .ci/run): then it fails."""
    url = os.environ.get("ARMORLAB_POSTGRES_URL", DEFAULT_URL)
    why = reachable(url)
    if why is not None:
        msg = f"no PostgreSQL at {url} ({why}); start one with: eval \"$(slurm/postgres/start.sh)\""
        if os.environ.get("ARMORLAB_REQUIRE_POSTGRES") == "1":
            pytest.fail(msg + " but ARMORLAB_REQUIRE_POSTGRES=1")
        pytest.skip(msg)
    return url


@pytest.fixture
def postgres_db(postgres_server):
    """A fresh database on that server for one test (dropped afterwards): its URL."""
    import psycopg

    name = f"armorlab_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = postgres_server.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
