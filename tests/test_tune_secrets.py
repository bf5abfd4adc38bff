"""A password in a storage URL is never shown nor stored (issue 30 §1): not by `tune`, `tune --status`,
the dashboard line, .tune/study.json, the spec copy, worker logs, trial run dirs or errors; a wrong
password says "authentication failed". The study runs on the real PostgreSQL server with the
stand-in trainer (armorlab.tune.synthetic_trainer), under a role whose password is distinctive
enough to grep for."""

from __future__ import annotations

import os
import shlex
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from pg_support import postgres_db, postgres_server  # noqa: F401 (fixtures)
from sweep_support import run_cli

pytest.importorskip("optuna")
from tune_support import spec, standin  # noqa: E402, F401 (fixture)

from armorlab.tune.secrets import redact, scrub, split_password  # noqa: E402

pytestmark = pytest.mark.usefixtures("standin")


@pytest.fixture
def role_url(postgres_db):  # noqa: F811 (fixture)
    """(URL of a fresh database with its password, the password as written in it). The test server's
    password (that of its role `armorlab`) is also its user and database name, so it is written
    percent-encoded, character by character: that spelling appears nowhere else, and a URL shown
    or stored with its password in it would show it."""
    user, password = postgres_db.partition("://")[2].partition("@")[0].split(":", 1)
    spelled = "".join(f"%{ord(c):02X}" for c in unquote(password))
    return postgres_db.replace(f"{user}:{password}@", f"{user}:{spelled}@"), spelled


def _every_file_text(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.postgres
def test_a_tune_run_shows_and_stores_no_password(tmp_path, role_url):
    url, password = role_url
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    env["HOME"] = str(tmp_path / "home")  # no ~/.pgpass to fall back on
    p = spec(tmp_path, "secretstudy", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n")
    root = tmp_path / "runs"
    outputs = []
    run = run_cli("tune", str(p), "--root", str(root), "--workers", "2", "--storage", url, env=env)
    outputs.append(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dashboard: optuna-dashboard '" in run.stdout  # single-quoted: the shell expands nothing
    # a later command reads the password where libpq looks for it (here $PGPASSWORD)
    status = run_cli("tune", str(root / "secretstudy"), "--status", env={**env, "PGPASSWORD": unquote(password)})
    outputs.append(status.stdout + status.stderr)
    assert status.returncode == 0 and "2 " in status.stdout, status.stdout + status.stderr
    # resumed with the password as libpq's query parameter and another option: the "stored in X;
    # now using Y" warning, then the finished study's table
    other = url.replace(f":{password}@", "@") + f"?sslmode=disable&password={password}"
    again = run_cli("--verbose", "tune", str(p), "--root", str(root), "--storage", other, env=env)
    outputs.append(again.stdout + again.stderr)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "now using postgresql://" in again.stderr and "already has 2 finished trials" in again.stdout
    files = _every_file_text(root)
    assert any(name.endswith("study.json") for name in files)
    user = url.partition("://")[2].partition(":")[0]
    for text in outputs:
        assert password not in text and f"{user}:" not in text and "password=" not in text, text
    for name, data in files.items():
        assert password.encode() not in data and f"{user}:".encode() not in data, name
    # the stored URL opens the study with the password from the environment only
    line = next(w for w in status.stdout.splitlines() if w.startswith("dashboard: "))
    argv = shlex.split(line.removeprefix("dashboard: "))
    assert argv[0] == "optuna-dashboard" and argv[1].startswith(f"postgresql+psycopg://{user}@")


@pytest.mark.postgres
def test_a_wrong_password_says_authentication_failed_and_hides_it(tmp_path, role_url):
    url, password = role_url
    wrong = url.replace(password, "Wrong-" + uuid.uuid4().hex[:10])
    wrong_pw = split_password(wrong)[1]
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    env["HOME"] = str(tmp_path / "home")
    p = spec(tmp_path, "wrongpw", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n")
    out = run_cli("tune", str(p), "--root", str(tmp_path / "runs"), "--storage", wrong, env=env, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "authentication failed" in out.stderr and "unreachable" not in out.stderr
    assert wrong_pw not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert "key '--storage'" in out.stderr


def test_passwords_are_split_redacted_and_scrubbed():
    assert split_password("postgresql://me:s3cret@h:5432/db") == ("postgresql://me@h:5432/db", "s3cret")
    # '@' in a password is not the host, and not a port: split at the '@' before the host
    assert split_password("postgresql://me:p@ss@h:5432/db") == ("postgresql://me@h:5432/db", "p@ss")
    assert split_password("postgresql://me@h/db?password=s3cret&sslmode=require") == \
        ("postgresql://me@h/db?sslmode=require", "s3cret")
    assert split_password("postgresql://me:p%40ss@h/db") == ("postgresql://me@h/db", "p@ss")
    assert split_password("postgresql://h/db") == ("postgresql://h/db", None)
    assert split_password("sqlite:///x.db") == ("sqlite:///x.db", None)
    assert redact("postgresql://me:p@ss@h/db") == "postgresql://me:***@h/db"
    assert redact("postgresql://h/db?password=x") == "postgresql://h/db?password=***"
    assert scrub("invalid port 'ss@h'; p%40ss", "postgresql://me:p@ss@h/db") == "invalid port 'ss@h'; ***"


def test_a_password_in_a_non_postgres_url_is_refused_not_stored(tmp_path):
    p = spec(tmp_path, "mysqlpw", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\nstorage: mysql://u:Pw-mysql-1@h/db\n")
    out = run_cli("tune", str(p), "--root", str(tmp_path / "runs"), timeout=120)
    assert out.returncode == 2 and "Pw-mysql-1" not in out.stdout + out.stderr
    assert "search.storage" in out.stderr and "$VAR" in out.stderr
    assert not (tmp_path / "runs" / "mysqlpw" / ".tune" / "study.json").exists()


# --------------------------------------------------------------------------- issue 41 §2: every URL form
from armorlab.tune.secrets import conninfo_pairs, redact_value, secrets_of  # noqa: E402

FORMS = {  # (how it is written, the secret in it)
    "user@server:password@host": ("postgresql://ann@srv:Pw-azure-1@db.example/x", "Pw-azure-1"),
    "libpq key=value": ("host=db.example dbname=x user=ann password='Pw lib\\'pq-2'", "Pw lib'pq-2"),
    "?sslpassword=": ("postgresql://ann@db.example/x?sslmode=require&sslpassword=Pw-ssl-3", "Pw-ssl-3"),
    "?PASSWORD=": ("postgresql://ann@db.example/x?PASSWORD=Pw-upper-4", "Pw-upper-4"),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_url_form_is_masked_when_shown(form):
    url, secret = FORMS[form]
    assert secrets_of(url) == [secret]
    shown = redact(url)
    assert secret not in shown and "***" in shown and "db.example" in shown
    assert scrub(f"could not connect: {url}", url).count(secret) == 0


def test_the_forms_parse_by_their_own_rules():
    # the user holds '@' (written %40 when the password is taken out); libpq's quoting and escapes
    assert split_password(FORMS["user@server:password@host"][0]) == \
        ("postgresql://ann%40srv@db.example/x", "Pw-azure-1")
    assert conninfo_pairs("host = h  password='a b\\\\c\\'d' port=5") == \
        [("host", "h"), ("password", "a b\\c'd"), ("port", "5")]
    assert conninfo_pairs("not a conninfo") is None and redact("not a password=x at all") == "***"
    # a '@' in the query of a URL whose user holds none is no password
    assert split_password("postgresql://me@h:5432/db?application_name=a@b") == \
        ("postgresql://me@h:5432/db?application_name=a@b", None)
    assert redact_value({"url": "postgresql://u:Pw-5@h/db", "Password": "Pw-6", "n": 3}) == \
        {"url": "postgresql://u:***@h/db", "Password": "***", "n": 3}


@pytest.mark.parametrize("storage, secret", [
    (FORMS["libpq key=value"][0], "Pw lib'pq-2"),
    (FORMS["?sslpassword="][0], "Pw-ssl-3"),
    ({"url": "postgresql://ann:Pw-dict-7@h/x"}, "Pw-dict-7"),
    (["postgresql://ann:Pw-list-8@h/x"], "Pw-list-8"),
], ids=["conninfo", "sslpassword", "a mapping", "a list"])
@pytest.mark.parametrize("where", ["spec", "--storage"])
def test_a_storage_that_cannot_be_kept_secret_is_refused_masked_and_not_stored(tmp_path, storage, secret, where):
    import json

    if where == "--storage" and not isinstance(storage, str):
        pytest.skip("the command line gives strings only")
    search = "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n"
    if where == "spec":
        search += f"storage: {json.dumps(storage)}\n"
    p = spec(tmp_path, "masked", search)
    extra = ["--storage", storage] if where == "--storage" else []
    out = run_cli("tune", str(p), "--root", str(tmp_path / "runs"), *extra, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert secret not in out.stdout + out.stderr and "***" in out.stderr and "Traceback" not in out.stderr
    assert ("search.storage" if where == "spec" else "--storage") in out.stderr
    assert not (tmp_path / "runs" / "masked" / ".tune" / "study.json").exists()


def test_the_study_file_and_spec_copy_are_their_owners_only(tmp_path):
    import stat

    from armorlab.tune.study import STUDY_FILE, TUNE_DIR, prepare_study

    p = spec(tmp_path, "private", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n")
    old = os.umask(0o022)
    try:
        ctx = prepare_study(p, root=tmp_path / "runs", storage=f"sqlite:///{tmp_path / 'a.db'}")
    finally:
        os.umask(old)
    for name in (STUDY_FILE, "spec.yaml"):
        assert stat.S_IMODE((ctx.study_dir / TUNE_DIR / name).stat().st_mode) == 0o600, name
