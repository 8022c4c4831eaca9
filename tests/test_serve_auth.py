"""Who may use the server (issue 36): the access token on the ``/v1`` routes (401 without it,
200 with it; ``/healthz`` and ``/metrics`` open), where the token comes from (environment or
file, never the command line), ``gru4rec serve`` refusing a non-loopback address without one,
and a password-protected redis-server, whose password never shows in a message."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gru4rec import GRU4Rec  # noqa: E402
from gru4rec.cli import main  # noqa: E402
from gru4rec.errors import ConfigError  # noqa: E402
from gru4rec.serve import ServeSettings, create_app  # noqa: E402
from gru4rec.serve.state import StoreUnavailable  # noqa: E402
from serve_helpers import httpx, recommend, redis_process, running, train_small  # noqa: E402

TOKEN = "tok-8c1f0e5b7d2a4e69b3c1"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[GRU4Rec, Path]:
    model = train_small(seed=2)
    path = tmp_path_factory.mktemp("serve_auth") / "model.safetensors"
    model.save(path)
    return model, path


def test_the_v1_routes_need_the_token_and_health_and_metrics_do_not(model_file: tuple[GRU4Rec, Path]) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    good = {"Authorization": f"Bearer {TOKEN}"}
    with running(create_app(path, ServeSettings(device="cpu", token=TOKEN))) as url, httpx.Client(base_url=url) as client:
        for method, route, body in (("POST", "/v1/recommend", {"items": [ids[1]], "k": 3}),
                                    ("POST", "/v1/sessions/x/events", {"item": ids[1], "k": 3}),
                                    ("DELETE", "/v1/sessions/x", None), ("GET", "/v1/model", None)):
            for headers in ({}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Bearer {TOKEN[:-1]}"},
                            {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}):
                r = client.request(method, route, json=body, headers=headers)
                assert r.status_code == 401, (route, headers, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert r.json()["error"] == ("this route needs an access token: send the header 'Authorization: Bearer TOKEN'"
                                             if not headers else "the access token is not valid")
        # Nothing happened without the token: the session's first authorised click starts it.
        first = client.post("/v1/sessions/x/events", json={"item": ids[1], "k": 3}, headers=good)
        assert first.status_code == 200 and first.json()["new_session"] is True
        r = client.post("/v1/recommend", json={"items": [ids[1], ids[4]], "k": 3}, headers={"authorization": f"bearer {TOKEN}"})
        assert r.status_code == 200 and r.json()["items"] == recommend(model, [ids[1], ids[4]], 3)[0]
        assert client.get("/v1/model", headers=good).json()["n_items"] == len(ids)
        assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200
        assert 'route="unmatched",status="401"' in client.get("/metrics").text


def test_the_token_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    settings = ServeSettings.from_env({"GRU4REC_TOKEN": TOKEN})
    assert settings.access_token() == TOKEN and TOKEN not in repr(settings)
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    assert ServeSettings.from_env({"GRU4REC_TOKEN_FILE": str(file)}).access_token() == TOKEN
    with pytest.raises(ConfigError, match="not both"):
        ServeSettings(token=TOKEN, token_file=str(file))
    with pytest.raises(ConfigError, match="has 5 characters; it needs at least 16"):
        ServeSettings(token="short")
    file.write_text("short\n")
    with pytest.raises(ConfigError, match=rf"the token in {file} has 5 characters; an access token needs at least 16"):
        ServeSettings(token_file=str(file)).access_token()
    with pytest.raises(ConfigError, match=rf"cannot read the token file {tmp_path / 'nope'}: No such file"):
        ServeSettings(token_file=str(tmp_path / "nope")).access_token()


def test_serve_refuses_a_public_address_without_a_token(model_file: tuple[GRU4Rec, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import gru4rec.cli.serve as serve_cli
    from gru4rec.cli.serve import _listen

    _, path = model_file
    monkeypatch.delenv("GRU4REC_TOKEN", raising=False)
    # A host that resolves beyond loopback, faked: nothing is ever bound outside 127.0.0.1 here.
    public, real = "public.invalid", socket.getaddrinfo

    def resolve(host: str, port: int, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        if host == public:
            return [(socket.AF_INET, socket.SOCK_STREAM, 0, "", (public, port))]
        return real(host, port, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(serve_cli.socket, "getaddrinfo", resolve)
    assert main(["serve", str(path), "--host", public, "--port", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gru4rec: error: --host {public} listens beyond this machine without an access token")
    assert "--insecure" in err and "GRU4REC_TOKEN" in err and len(err.splitlines()) == 1
    assert main(["serve", str(path), "--host", public, "--port", "0", "--token-file", str(tmp_path / "nope")]) == 2
    assert f"cannot read the token file {tmp_path / 'nope'}" in capsys.readouterr().err
    # With a token, or --insecure, the refusal is passed (the fake host then fails to bind); loopback binds.
    with pytest.raises(Exception, match=f"cannot listen on {public}:0"):
        _listen(public, 0, open_to_all=True)
    for host in ("127.0.0.1", "localhost"):
        sock = _listen(host, 0, open_to_all=False)
        assert isinstance(sock, socket.socket)
        sock.close()
    with pytest.raises(Exception, match="--insecure"):
        _listen(public, 0, open_to_all=False)


def test_a_password_protected_redis(model_file: tuple[GRU4Rec, Path], tmp_path: Path) -> None:
    model, path = model_file
    ids = model.item_map.to_list()
    password = "pw-6f2e9a41c07d"
    with redis_process(tmp_path, password=password) as redis:
        settings = ServeSettings(device="cpu", state=redis.url)
        assert password in redis.url
        with running(create_app(path, settings)) as url, httpx.Client(base_url=url) as client:
            body = client.post("/v1/sessions/p/events", json={"item": ids[3], "k": 4}).json()
            assert body["new_session"] is True and body["items"] == recommend(model, [ids[3]], 4)[0]
            assert client.post("/v1/sessions/p/events", json={"item": ids[5], "k": 4}).json()["new_session"] is False
        wrong = redis.url.replace(password, "not-the-password")
        with pytest.raises(StoreUnavailable, match=r"Redis at redis://:\*\*\*@127\.0\.0\.1:\d+/0 failed on PING") as caught:
            create_app(path, ServeSettings(device="cpu", state=wrong))
        assert "not-the-password" not in str(caught.value)
        with pytest.raises(StoreUnavailable, match=r"Redis at redis://127\.0\.0\.1:\d+/0 failed on PING"):
            create_app(path, ServeSettings(device="cpu", state=f"redis://127.0.0.1:{redis.port}/0"))
