"""Shutting the server down (serving/shutdown.py, `serve --shutdown-grace-s`): the drain in one
process with a fake engine (no signals: uvicorn's should_exit, as a signal sets it), then
`python -m flexnpu serve` in a subprocess with real SIGINT and SIGTERM (the random tiny model
on one virtual device, compiled once per server)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _serving import FakeEngine, require

WAIT_S = 60  # the bound on every wait for the server or a client (a loaded 2-core machine)
START_S = 500  # compiling the tiny model's programs on a loaded machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(lines) -> list[str]:
    """The data of SSE lines, up to and including [DONE] (or the end of the stream)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            out.append(line[6:])
            if out[-1] == "[DONE]":
                break
    return out


def _first_event(lines) -> str:
    seen = []
    for line in lines:
        if line.startswith("data: "):
            return line[6:]
        seen.append(line)
    raise AssertionError(f"the stream ended before its first event: {seen}")


def _finish_reasons(events: list[str]) -> list[str | None]:
    return [json.loads(e)["choices"][0]["finish_reason"] for e in events if e != "[DONE]"]


# ---- in process: the drain with a fake engine -----------------------------------------------


def test_shutting_down_refuses_new_requests_and_health() -> None:
    require("fastapi", "uvicorn", "httpx")
    from fastapi.testclient import TestClient

    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.tokenizer import ByteTokenizer

    eng = FakeEngine()
    state = ServerState(eng, ByteTokenizer(), "fake")
    client = TestClient(create_app(state))
    assert client.get("/health").status_code == 200
    assert state.in_flight.close(grace_s=10) == 0
    r = client.get("/health")
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
    for stream in (False, True):
        r = client.post("/v1/completions", json={"prompt": "q", "stream": stream})
        assert r.status_code == 503, r.text
        assert r.json()["error"] == {
            "message": "The server is shutting down and takes no new requests",
            "type": "service_unavailable_error",
            "param": None,
            "code": 503,
        }
    assert eng.live == []  # nothing reached the engine


def test_drain_finishes_what_ends_in_time_and_aborts_the_rest() -> None:
    require("fastapi", "uvicorn", "httpx")
    import httpx
    import uvicorn

    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.shutdown import DrainingServer
    from flexnpu.serving.tokenizer import ByteTokenizer

    eng = FakeEngine()
    eng.mode = "slow"  # a token every 10 ms: 100 tokens end within the grace, 4000 do not
    state = ServerState(eng, ByteTokenizer(), "fake")
    port = _free_port()
    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="error")
    srv = DrainingServer(config, state.in_flight, grace_s=5)
    th = threading.Thread(target=srv.run, daemon=True)  # not the main thread: no signals
    th.start()
    deadline = time.time() + WAIT_S
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started
    url = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=url, timeout=WAIT_S) as h,
        ThreadPoolExecutor(1) as pool,
        h.stream(
            "POST", "/v1/completions", json={"prompt": "q", "max_tokens": 100, "stream": True}
        ) as short,
        h.stream(
            "POST", "/v1/completions", json={"prompt": "q", "max_tokens": 4000, "stream": True}
        ) as long,
    ):
        plain = pool.submit(
            httpx.post,
            url + "/v1/completions",
            json={"prompt": "q", "max_tokens": 4000},
            timeout=WAIT_S,
        )
        short_lines, long_lines = short.iter_lines(), long.iter_lines()
        first = [_first_event(short_lines), _first_event(long_lines)]
        deadline = time.time() + WAIT_S
        while len(eng.live) < 3 and time.time() < deadline:  # the plain request is in too
            time.sleep(0.05)
        assert len(eng.live) == 3
        srv.should_exit = True  # what the first SIGINT or SIGTERM does
        short_events, long_events = _events(short_lines), _events(long_lines)
        r = plain.result(WAIT_S)
    th.join(WAIT_S)
    assert not th.is_alive()
    assert _finish_reasons(first) == [None, None]
    assert _finish_reasons(short_events)[-1] == "length" and short_events[-1] == "[DONE]"
    assert _finish_reasons(long_events)[-1] == "abort" and long_events[-1] == "[DONE]"
    assert r.status_code == 503, r.text
    assert "shut down before the request finished" in r.json()["error"]["message"]
    assert len(eng.aborted) == 2 and all(req["done"] for req in eng.live)


# ---- python -m flexnpu serve, real signals ------------------------------------------------


class _Server:
    """`python -m flexnpu serve` on a free port, stdout and stderr in files."""

    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out, self.err = tmp_path / "serve.out", tmp_path / "serve.err"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("FLEXNPU_") and k != "TF_CPP_MIN_LOG_LEVEL"
        }
        env["JAX_PLATFORMS"] = "flexnpu"
        # max-model-len 1024: a 1000-token stream outlasts the test's steps many times over
        cmd = [sys.executable, "-m", "flexnpu", "serve", "--model", "random:tiny"]
        cmd += ["--port", str(self.port), "--max-model-len", "1024", "--max-num-seqs", "2"]
        cmd += ["--max-num-batched-tokens", "32", "--chunk-buckets", "32", "--devices", "1"]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([*cmd, *flags], stdout=out, stderr=err, env=env)

    def logs(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_healthy(self) -> None:
        import httpx

        deadline = time.time() + START_S
        while time.time() < deadline:
            assert self.proc.poll() is None, self.logs()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail("the server did not come up:\n" + self.logs())

    def wait_running(self, n: int) -> None:
        """Until the engine holds n requests (running or waiting)."""
        import httpx

        deadline = time.time() + WAIT_S
        while time.time() < deadline:
            text = httpx.get(self.url + "/metrics", timeout=WAIT_S).text
            gauges = [
                float(ln.split()[-1])
                for ln in text.splitlines()
                if ln.startswith(("flexnpu:num_requests_running{", "flexnpu:num_requests_waiting{"))
            ]
            if sum(gauges) >= n:
                return
            time.sleep(0.05)
        pytest.fail(f"{n} requests did not reach the engine:\n" + self.logs())

    def wait_for_stderr(self, text: str) -> None:
        """Until the server has written `text` on stderr."""
        deadline = time.time() + WAIT_S
        while text not in self.err.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"the server did not say {text!r}:\n" + self.logs())
            time.sleep(0.05)

    def exit_code(self) -> int:
        try:
            return self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(WAIT_S)
            pytest.fail("the server did not exit:\n" + self.logs())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)

    def assert_no_traceback(self) -> None:
        err = self.err.read_text()
        for bad in ("Traceback", "CancelledError", "Exception in ASGI application"):
            assert bad not in err, err


def _stream_body(max_tokens: int) -> dict:
    return {"prompt": "hi", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}


def test_sigint_with_no_grace_aborts_in_flight_requests_then_exits_0(tmp_path) -> None:
    require("fastapi", "uvicorn", "httpx")
    import httpx

    srv = _Server(tmp_path, "--shutdown-grace-s", "0")
    try:
        srv.wait_healthy()
        plain_body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
        with (
            httpx.Client(base_url=srv.url, timeout=WAIT_S) as h,
            ThreadPoolExecutor(1) as pool,
            h.stream("POST", "/v1/completions", json=_stream_body(1000)) as stream,
        ):
            plain = pool.submit(
                httpx.post, srv.url + "/v1/completions", json=plain_body, timeout=WAIT_S
            )
            lines = stream.iter_lines()
            first = [_first_event(lines)]
            srv.wait_running(2)
            srv.proc.send_signal(signal.SIGINT)
            events = first + _events(lines)
            r = plain.result(WAIT_S)
        assert srv.exit_code() == 0, srv.logs()
    finally:
        srv.stop()
    reasons = _finish_reasons(events)
    assert reasons[0] is None and reasons[-1] == "abort" and events[-1] == "[DONE]", events[-3:]
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "service_unavailable_error"
    assert "shut down before the request finished" in r.json()["error"]["message"]
    srv.assert_no_traceback()
    assert "aborted 2 request(s)" in srv.err.read_text()


def test_sigterm_drains_and_a_second_sigint_exits_at_once(tmp_path) -> None:
    require("fastapi", "uvicorn", "httpx")
    import httpx

    srv = _Server(tmp_path)  # the default grace period
    try:
        srv.wait_healthy()
        with (
            httpx.Client(base_url=srv.url, timeout=WAIT_S) as h,
            h.stream("POST", "/v1/completions", json=_stream_body(1000)) as long,
            h.stream("POST", "/v1/completions", json=_stream_body(16)) as short,
        ):
            long_lines, short_lines = long.iter_lines(), short.iter_lines()
            _first_event(long_lines)
            _first_event(short_lines)
            srv.proc.send_signal(signal.SIGTERM)
            # The SIGINT goes only once the server has handled the SIGTERM: two signals pending
            # at once (a busy machine may not run the server in between) reach its handlers in
            # signal-number order, SIGINT first, and the process cannot know which was sent first.
            srv.wait_for_stderr("to finish (Ctrl-C again to exit now)")
            short_events = _events(short_lines)  # drained: it runs to its end
            assert srv.proc.poll() is None, srv.logs()  # the long stream keeps the drain on
            srv.proc.send_signal(signal.SIGINT)
            code = srv.exit_code()
            try:  # the long stream's connection is closed under it
                long_events = _events(long_lines)
            except httpx.HTTPError:
                long_events = []
    finally:
        srv.stop()
    assert code == 128 + signal.SIGINT, srv.logs()
    assert _finish_reasons(short_events)[-1] == "length" and short_events[-1] == "[DONE]"
    assert "[DONE]" not in long_events
    srv.assert_no_traceback()
    assert "second SIGINT: exiting without draining" in srv.err.read_text()
