"""NATS credentials as operators give them, and never printed: real nats-servers that
admit a user with a password, an NKEY and a token; real ``twistd -n eventbus --store
jetstream`` and ``twistd -n emqp --store jetstream`` processes given them in files and
in the environment; every output (the log, ``/status``, status.json, the error of a
wrong password, the process's command line as ``ps`` shows it) searched for the secret.
Spark's source is read with them in tests/spark/test_spark_stream_source.py."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.python import usage

from bus.application.statusjson import config_json
from bus.nats.credentials import (
    ENV_PASSWORD,
    ENV_TOKEN,
    Credentials,
    CredentialsError,
    Secret,
    redacted,
    shown,
    split,
)
from bus.nats.settings import NatsSettings
from tests.ports import nats_cluster
from tests.processes import TWISTD, BrokerProcess, ServerProcess, reported

nkeys = pytest.importorskip("nkeys")

PASSWORD = "pw-" + secrets.token_hex(8)
TOKEN = "tk-" + secrets.token_hex(8)
SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
SECRETS: tuple[str, ...] = (PASSWORD, TOKEN, SEED.decode())


# -- what the credentials are, without servers -------------------------------------------------


def test_a_secret_shows_as_stars_wherever_it_is_printed() -> None:
    secret = Secret(PASSWORD)
    assert secret.reveal() == PASSWORD
    said = f"{secret} {secret!r} {secret:>40} {[secret]} {Credentials(user='u', password=secret)}"
    assert PASSWORD not in said and "***" in said
    assert config_json(NatsSettings(("nats://u:" + PASSWORD + "@h:4222",))) == {
        **config_json(NatsSettings(("nats://h:4222",))),
        "credentials": {
            **config_json(Credentials()),
            "user": "u",
            "password": "***",
        },
    }


def test_urls_lose_their_credentials_to_the_settings() -> None:
    settings = NatsSettings((f"nats://alice:{PASSWORD}@h1:4222", "nats://h2:4222"))
    assert settings.servers == ("nats://h1:4222", "nats://h2:4222")
    assert settings.credentials.fields("") == {"user": "alice", "pass": PASSWORD}
    token = NatsSettings((f"tls://{TOKEN}@h1", f"tls://{TOKEN}@h2:4223"))
    assert token.servers == ("tls://h1", "tls://h2:4223")
    assert token.credentials.fields("") == {"auth_token": TOKEN}
    with pytest.raises(CredentialsError, match="different credentials"):
        split(["nats://a:b@h1", "nats://a:c@h2"])
    with pytest.raises(CredentialsError, match="give them once"):
        split(["nats://a:b@h1"], Credentials(token=Secret("t")))
    assert shown(f"nats://alice:{PASSWORD}@h1:4222") == "nats://alice:***@h1:4222"
    assert shown(f"{TOKEN}@h1:4222") == "***@h1:4222"
    assert shown("nats://h1:4222") == "nats://h1:4222"
    text = f"cannot reach nats://alice:{PASSWORD}@h1:4222, tls://{TOKEN}@h2: refused"
    assert redacted(text) == "cannot reach nats://alice:***@h1:4222, tls://***@h2: refused"


def test_options_and_the_environment_name_one_way_in(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    given = Credentials.from_options(user="alice", password_file=password, environ={})
    assert given.fields("") == {"user": "alice", "pass": PASSWORD}
    assert given.kind == "user alice"
    # The environment's secrets: a password for a user without a file, a token for none.
    env = {ENV_PASSWORD: PASSWORD, ENV_TOKEN: TOKEN}
    assert Credentials.from_options(user="alice", environ=env).fields("")["pass"] == PASSWORD
    assert Credentials.from_options(environ=env).fields("") == {"auth_token": TOKEN}
    assert Credentials.from_options(environ={}).fields("") == {}
    for wrong, said in (
        ({"user": "alice"}, "needs its password"),
        ({"password_file": password}, "needs its user"),
        ({"user": "alice", "password_file": password, "nkey": password}, "one way"),
    ):
        with pytest.raises(CredentialsError, match=said):
            Credentials.from_options(environ={}, **wrong)  # type: ignore[arg-type]
    seed = tmp_path / "user.nk"
    seed.write_text(SEED.decode() + "\n")
    signed = Credentials(nkey_file=seed).fields("a-nonce")
    pair = nkeys.from_seed(SEED)
    assert signed["nkey"] == pair.public_key.decode()
    signature = signed["sig"] + "=" * (-len(signed["sig"]) % 4)
    import base64

    assert pair.verify(b"a-nonce", base64.urlsafe_b64decode(signature))
    missing = Credentials(token_file=tmp_path / "nothing")
    with pytest.raises(CredentialsError, match="cannot read"):
        missing.check()


def test_the_services_options_refuse_a_secret_given_twice() -> None:
    from bus.eventbus.tap import Options

    options = Options()
    with pytest.raises(usage.UsageError, match="give them once"):
        options.parseOptions(
            ["--store", "jetstream", "--nats", "nats://t@h:4222", "--nats-token-file", "x"]
        )


# -- real servers, real processes ------------------------------------------------------------


USERS = f"""authorization {{
  users: [
    {{ user: alice, password: "{PASSWORD}" }}
    {{ nkey: {nkeys.from_seed(SEED).public_key.decode()} }}
  ]
}}"""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _key(prefix: int) -> tuple[bytes, Any]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed, nkeys.from_seed(seed)


def _jwt(issuer: Any, subject: str, kind: str, claims: dict[str, Any]) -> str:
    """A JWT as nats-server's operator mode reads it: ed25519-nkey, signed by ``issuer``
    (nsc makes them; the test makes its own, for an operator, two accounts and a user)."""
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = {
        "jti": secrets.token_hex(16).upper(),
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": kind,
        "sub": subject,
        "nats": {"type": kind, "version": 2, **claims},
    }
    payload = _b64(json.dumps(body).encode())
    return f"{head}.{payload}.{_b64(issuer.sign(f'{head}.{payload}'.encode()))}"


USER_SEED, _USER = _key(nkeys.PREFIX_BYTE_USER)
SECRETS += (USER_SEED.decode(),)


def operator_mode() -> tuple[str, str]:
    """nats-server's settings for an operator, a system account and an account with
    JetStream; and the ``.creds`` file of a user of that account."""
    _, operator = _key(nkeys.PREFIX_BYTE_OPERATOR)
    _, account = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    _, system = _key(nkeys.PREFIX_BYTE_ACCOUNT)
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                 "wildcards": True, "conn": -1, "leaf": -1}  # fmt: skip
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    ids = {name: pair.public_key.decode() for name, pair in (("a", account), ("s", system))}
    settings = "\n".join([
        f'operator: "{_jwt(operator, operator.public_key.decode(), "operator", {})}"',
        f"system_account: {ids['s']}",
        "resolver: MEMORY",
        "resolver_preload: {",
        f'  {ids["a"]}: "{_jwt(operator, ids["a"], "account", {"limits": {**unlimited, **jetstream}})}"',
        f'  {ids["s"]}: "{_jwt(operator, ids["s"], "account", {"limits": unlimited})}"',
        "}",
    ])  # fmt: skip
    user = _jwt(account, _USER.public_key.decode(), "user", {"pub": {}, "sub": {}, **unlimited})
    creds = (
        f"-----BEGIN NATS USER JWT-----\n{user}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{USER_SEED.decode()}\n------END USER NKEY SEED------\n"
    )
    return settings, creds


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A nats-server admitting alice (password) and an NKEY user, one admitting a token,
    one in operator mode (a user's .creds file)."""
    settings, creds = operator_mode()
    users = nats_cluster(tmp_path_factory.mktemp("users"), size=1, extra=USERS)
    token = nats_cluster(tmp_path_factory.mktemp("token"), size=1, token=TOKEN)
    operator = nats_cluster(tmp_path_factory.mktemp("operator"), size=1, extra=settings)
    started = [users, token, operator]
    for each in started:
        each.start()
    yield {"users": users.urls[0], "token": token.urls[0], "operator": operator.urls[0],
           "creds": creds}  # fmt: skip
    for each in started:
        each.stop()


def secret_file(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def shown_by_ps(pid: int) -> str:
    """The process's command line as every user of the host sees it."""
    listed = subprocess.run(
        ["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return listed + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def whole_status(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
        return str(response.read().decode())


def without_secrets(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret in {where}"


def streaming(process: BrokerProcess) -> bool:
    return process.ready() and bool((process.status().get("jetstream") or {}).get("ready"))


@pytest_twisted.inlineCallbacks
def test_front_ends_and_brokers_connect_with_secrets_they_never_print(
    servers: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    keys = tmp_path / "keys"
    keys.mkdir()
    password = secret_file(keys, "alice.password", PASSWORD)
    token = secret_file(keys, "token", TOKEN)
    seed = secret_file(keys, "user.nk", SEED.decode())
    creds = secret_file(keys, "user.creds", servers["creds"])
    jetstream = ("--store", "jetstream", "--nats-stream")
    front_ends = {
        "password file": ServerProcess(
            tmp_path / "e1", *jetstream, "E1", "--nats-subject-prefix", "e1",
            "--nats", servers["users"], "--nats-user", "alice",
            "--nats-password-file", str(password), http=True,
        ),
        "token file": ServerProcess(
            tmp_path / "e2", *jetstream, "E2", "--nats", servers["token"],
            "--nats-token-file", str(token), http=True,
        ),
        "credentials file": ServerProcess(
            tmp_path / "e4", *jetstream, "E4", "--nats", servers["operator"],
            "--nats-creds", str(creds), http=True,
        ),
        # The old way, a password in the URL: on the command line by the operator's
        # choice, and printed nowhere else.
        "password in the URL": ServerProcess(
            tmp_path / "e3", *jetstream, "E3", "--nats-subject-prefix", "e3",
            "--nats", servers["users"].replace("nats://", f"nats://alice:{PASSWORD}@"),
            http=True,
        ),
    }  # fmt: skip
    brokers = {
        "NKEY seed file": BrokerProcess(
            tmp_path / "b1", None, *jetstream, "Q1", "--nats-subject-prefix", "q1",
            "--nats", servers["users"], "--nats-nkey", str(seed),
        ),
    }  # fmt: skip
    with monkeypatch.context() as env:
        env.setenv(ENV_PASSWORD, PASSWORD)
        brokers["password in the environment"] = BrokerProcess(
            tmp_path / "b2", None, *jetstream, "Q2", "--nats-subject-prefix", "q2",
            "--nats", servers["users"], "--nats-user", "alice",
        )  # fmt: skip
    started = [*front_ends.values(), *brokers.values()]
    try:
        for name, front_end in front_ends.items():
            yield reported(front_end.ready, what=f"the front-end with a {name}")
        for name, broker in brokers.items():
            yield reported(lambda b=broker: streaming(b), what=f"the broker with a {name}")
        for name, front_end in front_ends.items():
            status = whole_status(front_end.http_port)
            assert '"connected": true' in status, name
            without_secrets(f"/status of the front-end with a {name}", status)
            without_secrets(f"status.json of the front-end with a {name}", str(front_end.status()))
            if name != "password in the URL":
                without_secrets(
                    f"ps of the front-end with a {name}", shown_by_ps(front_end.process.pid)
                )
        for name, broker in brokers.items():
            assert broker.status()["jetstream"]["connected"], name
            without_secrets(f"status.json of the broker with a {name}", str(broker.status()))
            without_secrets(f"ps of the broker with a {name}", shown_by_ps(broker.process.pid))
        assert "nats://alice:***@" in str(front_ends["password in the URL"].status()) or (
            servers["users"] in str(front_ends["password in the URL"].status())
        )
    finally:
        for process in started:
            process.stop()
    for name, front_end in front_ends.items():
        log = front_end.output()
        assert "connected to NATS server" in log, name
        without_secrets(f"the log of the front-end with a {name}", log)
    for name, broker in brokers.items():
        log = broker.log_path.read_text()
        assert "connected to NATS server" in log, name
        without_secrets(f"the log of the broker with a {name}", log)


def test_a_wrong_password_ends_the_start_in_one_line_without_the_secret(
    servers: dict[str, str], tmp_path: Path
) -> None:
    wrong = secret_file(tmp_path, "wrong", TOKEN)  # a secret too: it must not show either
    common = [TWISTD, "-n", "--pidfile=", "eventbus", "--services", "eventbus", "--port", "0"]
    jetstream = ["--store", "jetstream"]
    cases = {
        "from a file": [
            "--nats", servers["users"], "--nats-user", "alice", "--nats-password-file", str(wrong),
        ],
        "in the URL": ["--nats", servers["users"].replace("nats://", f"nats://alice:{TOKEN}@")],
    }  # fmt: skip
    for name, given in cases.items():
        data = tmp_path / name.replace(" ", "-")
        ended = subprocess.run(
            [*common, "--data-dir", str(data), "--http-port", "0", *jetstream, *given],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        said = ended.stdout + ended.stderr
        assert ended.returncode == 1, said
        line = [each for each in said.splitlines() if "cannot start eventbus" in each]
        assert len(line) == 1 and "Authorization Violation" in line[0], said
        without_secrets(f"the output of a start with a wrong password {name}", said)
