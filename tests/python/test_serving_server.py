"""The OpenAI-compatible HTTP server end to end on loopback, with the official `openai` client:
completions and chat (plain and streaming SSE with usage), stop strings, errors, disconnects,
metrics. A tiny random Llama on one virtual NPU keeps it fast; greedy decoding is deterministic."""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _serving import FakeEngine, require, serve_app_in_thread

MAX_LEN = 128


@pytest.fixture(scope="module")
def server(npu_devices):
    require("fastapi", "uvicorn", "openai", "httpx", "prometheus_client")
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.metrics import ServingMetrics
    from flexnpu.serving.server import ServerState, create_app

    m = load_model("random:tiny", seed=3, log=lambda *_: None)
    metrics = ServingMetrics("tiny")
    eng = Engine(None, m.params, EngineConfig(max_num_seqs=4, max_model_len=MAX_LEN,
                                              max_num_batched_tokens=64),
                 devices=npu_devices[:1], metrics=metrics, eos_ids=m.eos_ids,
                 model_config=m.config)
    eng.warmup()
    eng.start()
    app = create_app(ServerState(eng, m.tokenizer, "tiny", metrics=metrics))
    url, srv, th = serve_app_in_thread(app)
    yield url, eng
    srv.should_exit = True
    th.join(10)
    eng.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", timeout=30, max_retries=0)


def _http(server):
    import httpx

    return httpx.Client(base_url=server[0], timeout=30)


def test_health_and_models(server, client) -> None:
    with _http(server) as h:
        r = h.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert [(x["name"], x["state"]) for x in r.json()["instances"]] == [("mixed-0",
                                                                             "serving")]
        # Fault injection is off unless the server was started with it.
        assert h.post("/debug/fail-instance/mixed-0").status_code == 404
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_a_stream_through_an_instance_failure_keeps_every_token(npu_devices) -> None:
    """POST /debug/fail-instance (FLEXNPU_FAULT_INJECTION=1) fails an instance mid-stream: the
    stream goes on at the other instance and carries exactly its tokens (the same text as a
    run without the fault); /health names the restarted instance."""
    require("fastapi", "uvicorn", "httpx")
    import httpx

    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.server import ServerState, create_app

    m = load_model("random:tiny", seed=3, log=lambda *_: None)
    eng = Engine(None, m.params, EngineConfig(max_num_seqs=2, max_model_len=MAX_LEN,
                                              max_num_batched_tokens=32),
                 devices=npu_devices[:2], eos_ids=m.eos_ids, model_config=m.config)
    eng.warmup()
    eng.start()
    app = create_app(ServerState(eng, m.tokenizer, "tiny", fault_injection=True))
    url, srv, th = serve_app_in_thread(app)
    body = {"prompt": "once upon", "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    try:
        with httpx.Client(base_url=url, timeout=60) as h:
            def stream(fault: bool) -> tuple[str, int, str | None]:
                text, usage, finish = "", 0, None
                with h.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        ev = json.loads(line[6:])
                        for c in ev["choices"]:
                            text += c["text"]
                            finish = c["finish_reason"] or finish
                            if fault and text:
                                fault = False
                                failing = [x.name for x in eng.instances if x.sched.has_work]
                                assert h.post(f"/debug/fail-instance/{failing[0]}").json() \
                                    == {"injected": failing[0]}
                        if ev.get("usage"):
                            usage = ev["usage"]["completion_tokens"]
                return text, usage, finish

            clean = stream(False)
            assert clean[1:] == (60, "length")
            assert stream(True) == clean
            health = h.get("/health").json()
            assert health["status"] == "ok"
            assert sorted(x["restarts"] for x in health["instances"]) == [0, 1]
            assert h.post("/debug/fail-instance/nope").status_code == 404
    finally:
        srv.should_exit = True
        th.join(10)
        eng.stop()


def test_completion_plain_and_streaming_agree(client) -> None:
    kw = dict(model="tiny", prompt="Hello there", max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == len(b"Hello there")
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_plain_and_streaming_agree(client) -> None:
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi!"}], max_tokens=10,
              temperature=0, seed=1, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sse_wire_format_and_unknown_fields(server) -> None:
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0,
            "repetition_penalty": 1.0, "logprobs": None, "best_of": 1, "whatever": {"x": 1}}
    with _http(server) as h:
        r = h.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert usage["usage"]["prompt_tokens"] == 3


def test_stop_string_truncates(client) -> None:
    kw = dict(model="tiny", prompt="abc", max_tokens=30, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    starts = [i for i in range(1, len(full) - 1)
              if "\ufffd" not in full[i:i + 2] and full.index(full[i:i + 2]) == i]
    if not starts:
        pytest.skip("random output has no usable stop string")
    stop = full[starts[0]:starts[0] + 2]
    for stream in (False, True):
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(
                stream=True, stop=[stop], **kw))
        else:
            r = client.completions.create(stop=stop, **kw)
            text = r.choices[0].text
            assert r.choices[0].finish_reason == "stop"
        assert text == full[:full.index(stop)]


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "stop": 5}, 400, "stop"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x" * MAX_LEN}, 400, "prompt"),  # no room for one output token
    ({"prompt": "x" * 60, "max_tokens": 100}, 400, "max_tokens"),  # 160 > context 128
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "n": 65}, 400, "n"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": 1}, 400, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 1.2}, 400, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"5": 10}}, 400, "logit_bias"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"prompt": "x", "echo": True}, 400, "echo"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"prompt": "x", "top_k": -2}, 400, "top_k"),
    # int32 on the device: found by bench.soak's bad-http fault, they failed the engine (500s,
    # then /health 503 for good)
    ({"prompt": "x", "top_k": 2**64}, 400, "top_k"),
    ({"prompt": "x", "top_k": 2**31}, 400, "top_k"),
    ({"prompt": "x", "stop_token_ids": [2**64], "min_tokens": 1}, 400, "stop_token_ids"),
    ({"prompt": "x", "stop_token_ids": [-1], "min_tokens": 1}, 400, "stop_token_ids"),
    # A lone surrogate escape: valid JSON, not Unicode; the tokenizer raised TypeError (a 500).
    (b'{"prompt": "\\udcff lone"}', 400, "prompt"),
    (b'{"prompt": ["ok", "\\ud800"]}', 400, "prompt"),
    (b'{"prompt": "x", "stop": ["\\udfff"]}', 400, "stop"),
    ({"prompt": "x", "min_p": 1.5}, 400, "min_p"),
    ({"prompt": [1, 100000]}, 400, "prompt"),
    ({"prompt": ["a", 5]}, 400, "prompt"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream"),
])
def test_bad_completion_requests(server, client, body, status, param) -> None:
    with _http(server) as h:
        r = (h.post("/v1/completions", content=body) if isinstance(body, bytes)
             else h.post("/v1/completions", json=body))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["param"] == param and err["code"] == status
    # The server keeps serving.
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=2).usage


def test_lone_surrogates_are_400s_and_surrogate_pairs_are_text(server, client) -> None:
    with _http(server) as h:
        r = h.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", '
                   b'"content": "hi \\udcff"}], "max_tokens": 2}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        r = h.post("/v1/completions", content=b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}')
        assert r.status_code == 200, r.text  # a pair: one emoji


def test_bad_chat_requests_and_openai_error(server, client) -> None:
    import openai

    with _http(server) as h:
        for body in ({}, {"messages": []}, {"messages": "hi"}, {"messages": [{"content": "x"}]},
                     {"messages": [{"role": "user", "content": 3}]}):
            r = h.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages", body
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny", prompt=[1] * 100, max_tokens=50)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       top_logprobs=2)


def test_concurrent_requests(client) -> None:
    def one(i: int) -> int:
        r = client.completions.create(model="tiny", prompt=f"request {i}", max_tokens=5 + i,
                                      temperature=0, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(one, range(6))) == [5 + i for i in range(6)]


def test_client_disconnect_frees_the_slot(server) -> None:
    import httpx

    _, eng = server
    body = {"model": "tiny", "prompt": "long", "max_tokens": 120, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=server[0], timeout=30) as h:
        with h.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            deadline = time.time() + 10
            while eng.num_running() != 1 and time.time() < deadline:
                time.sleep(0.01)  # the first token is streamed just before the slot fills
            assert eng.num_running() == 1
    deadline = time.time() + 10
    while eng.num_running() and time.time() < deadline:
        time.sleep(0.05)
    assert eng.num_running() == 0


def test_metrics(server, client) -> None:
    client.completions.create(model="tiny", prompt="metrics", max_tokens=4)
    with _http(server) as h:
        text = h.get("/metrics").text
    for name in ("flexnpu:time_to_first_token_seconds_count", "flexnpu:inter_token_latency_seconds",
                 "flexnpu:e2e_request_latency_seconds_bucket", "flexnpu:num_requests_running",
                 "flexnpu:num_requests_waiting", "flexnpu:kv_cache_usage_perc",
                 "flexnpu:prompt_tokens_total", "flexnpu:generation_tokens_total"):
        assert name in text, name
    ttft = [ln for ln in text.splitlines()
            if ln.startswith("flexnpu:time_to_first_token_seconds_count")]
    assert float(ttft[0].split()[-1]) >= 1
    # One registry: the placer's collector and the process's memory on the same endpoint.
    executions = [ln for ln in text.splitlines() if ln.startswith("flexnpu_executions_total")]
    assert executions and float(executions[0].split()[-1]) > 0
    assert "flexnpu_physical_queue_length{" in text and "flexnpu_placement_info{" in text
    assert "process_resident_memory_bytes" in text


def test_serving_benchmark_client(server, tmp_path, capsys) -> None:
    from bench import serving as bench

    out = tmp_path / "r.json"
    rc = bench.main(["--base-url", server[0], "--num-prompts", "6", "--request-rate", "20",
                     "--burstiness", "0.5", "--length-scale", "0.1", "--max-prompt-len", "8",
                     "--max-output-len", "8", "--goodput", "ttft:60000", "tpot:60000",
                     "--result-json", str(out), "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in text
    assert "Median TTFT (ms)" in text and "P99 ITL (ms)" in text
    r = json.loads(out.read_text())
    assert r["completed"] == 6 and r["failed"] == 0 and r["request_goodput"] > 0, r["errors"]
    lengths = bench.sample_lengths(6, np.random.default_rng(0), argparse.Namespace(
        length_scale=0.1, min_len=4, max_prompt_len=8, max_output_len=8))
    assert r["total_output_tokens"] == sum(o for _, o in lengths)  # ignore_eos: all tokens


def test_logprobs_completions_plain_and_streaming(client) -> None:
    kw = dict(model="tiny", prompt="log", max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert len(lp.text_offset) == 6
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and chosen <= 0
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the argmax
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
    streamed = [v for c in chunks if c.choices[0].logprobs
                for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)


def test_logprobs_chat(client) -> None:
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
              temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert len(item.top_logprobs) == 2 and item.logprob <= 0
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert all(0 <= b < 256 for b in item.bytes)
        if len(item.token) == 1 and item.token.isascii():
            assert item.bytes == [ord(item.token)]
    no_top = client.chat.completions.create(**{**kw, "top_logprobs": None})
    assert all(item.top_logprobs == [] for item in no_top.choices[0].logprobs.content)
    plain = client.chat.completions.create(**{**kw, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content


def test_prompt_lists_and_n(client) -> None:
    kw = dict(model="tiny", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    one = [client.completions.create(prompt=p, **kw).choices[0].text for p in ("ab", "xyz")]
    r = client.completions.create(prompt=["ab", "xyz"], **kw)
    assert [c.index for c in r.choices] == [0, 1] and [c.text for c in r.choices] == one
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 10
    ids = client.completions.create(prompt=[list(b"ab"), list(b"xyz")], **kw)
    assert [c.text for c in ids.choices] == one
    chunks = list(client.completions.create(prompt=["ab", "xyz"], stream=True, **kw))
    by_index = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            by_index[ch.index] += ch.text
    assert [by_index[0], by_index[1]] == one
    n = client.completions.create(prompt="ab", n=3, **kw)
    assert [c.index for c in n.choices] == [0, 1, 2] and {c.text for c in n.choices} == {one[0]}
    chat = client.chat.completions.create(messages=[{"role": "user", "content": "q"}], n=2,
                                          seed=5, **{**kw, "temperature": 1.0})
    assert len(chat.choices) == 2 and chat.usage.completion_tokens == 10


def test_error_bodies_for_every_status(server) -> None:
    with _http(server) as h:
        for method, path, status in (("GET", "/nope", 404), ("GET", "/v1/completions", 405),
                                     ("DELETE", "/v1/chat/completions", 405),
                                     ("POST", "/v1/models", 405)):
            r = h.request(method, path)
            assert r.status_code == status, (method, path, r.text)
            err = r.json()["error"]
            assert err["code"] == status and path in err["message"] and err["type"]


def _fake_app(engine, timeout: float | None = None):
    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.tokenizer import ByteTokenizer

    app = create_app(ServerState(engine, ByteTokenizer(), "fake", request_timeout=timeout))

    @app.get("/probe/{n}")
    async def probe(n: int) -> dict:  # a declared parameter: FastAPI validates it (422)
        if n == 13:
            raise RuntimeError("unlucky")
        return {"n": n}

    return app


@pytest.fixture()
def fake():
    require("fastapi", "uvicorn", "httpx")
    eng = FakeEngine()
    url, srv, th = serve_app_in_thread(_fake_app(eng, timeout=1.0))
    yield url, eng
    srv.should_exit = True
    th.join(10)


def test_fake_engine_answers(fake) -> None:
    with _http(fake) as h:
        r = h.post("/v1/completions", json={"prompt": "q", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fake"


def test_422_and_500_bodies(fake) -> None:
    with _http(fake) as h:
        r = h.get("/probe/abc")
        assert r.status_code == 422 and r.json()["error"]["code"] == 422
        assert r.json()["error"]["param"] == "path.n"
        r = h.get("/probe/13")
        assert r.status_code == 500 and "unlucky" in r.json()["error"]["message"]
        assert h.get("/probe/2").json() == {"n": 2}  # still serving


def test_queue_full_is_503(fake) -> None:
    import openai

    url, eng = fake
    eng.mode = "full"
    with _http(fake) as h:
        r = h.post("/v1/completions", json={"prompt": "q", "stream": True})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["code"] == 503 and "at capacity" in err["message"]
    assert "max_waiting" in err["message"]
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="at capacity"):
        c.completions.create(model="fake", prompt="q")


def test_dead_engine_is_503_on_health_and_requests(fake) -> None:
    _, eng = fake
    with _http(fake) as h:
        assert h.get("/health").status_code == 200
        eng.healthy, eng.error = False, "engine-mixed-0: RuntimeError: device lost"
        r = h.get("/health")
        assert r.status_code == 503 and "device lost" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and "device lost" in r.json()["error"]["message"]


def test_failed_generation_is_500_plain_and_an_error_event_streaming(fake) -> None:
    _, eng = fake
    eng.mode = "fail"
    with _http(fake) as h:
        r = h.post("/v1/completions", json={"prompt": "q"})
        assert r.status_code == 500 and "device lost" in r.json()["error"]["message"]
        r = h.post("/v1/completions", json={"prompt": "q", "stream": True})
    events = [e for e in r.text.split("\n\n") if e]
    assert "device lost" in json.loads(events[0][6:])["error"]["message"]
    assert events[-1] == "data: [DONE]"


def test_request_timeout_is_504_and_aborts(fake, monkeypatch) -> None:
    _, eng = fake
    eng.mode = "hang"  # the engine never answers: the server's guard (timeout + grace) ends it
    import flexnpu.serving.streaming as server_lib

    monkeypatch.setattr(server_lib, "TIMEOUT_GRACE_S", 0.2)
    with _http(fake) as h:
        r = h.post("/v1/completions", json={"prompt": "q"}, timeout=30)
    assert r.status_code == 504 and "timeout" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == 504 and len(eng.aborted) == 1
    assert server_lib.DISCONNECT_POLL_S < 1


def test_non_streaming_disconnect_aborts(fake) -> None:
    import httpx

    _, eng = fake
    eng.mode = "hang"
    with pytest.raises(httpx.ReadTimeout):
        with _http(fake) as h:
            h.post("/v1/completions", json={"prompt": "q"}, timeout=0.5)
    deadline = time.time() + 5
    while not eng.aborted and time.time() < deadline:
        time.sleep(0.05)
    assert len(eng.aborted) == 1 and eng.aborted[0] is eng.live[0]


def test_non_streaming_disconnect_aborts_while_tokens_flow(fake) -> None:
    import httpx

    _, eng = fake
    eng.mode = "slow"  # 1000 tokens would take 10 s; the client leaves after 0.5 s
    t0 = time.time()
    with pytest.raises(httpx.ReadTimeout):
        with _http(fake) as h:
            h.post("/v1/completions", json={"prompt": "q", "max_tokens": 1000}, timeout=0.5)
    while not eng.aborted and time.time() < t0 + 8:
        time.sleep(0.05)
    assert len(eng.aborted) == 1 and eng.live[0]["done"]


def test_sse_events_stay_one_line_for_line_reading_clients(fake) -> None:
    # U+0085, U+2028, U+2029 are line breaks to str.splitlines (httpx's aiter_lines) that JSON
    # does not escape; a random model emits them.
    _, eng = fake
    eng.text = "a\x85b\u2028c\u2029d é"
    with _http(fake) as h:
        with h.stream("POST", "/v1/completions",
                      json={"prompt": "q", "max_tokens": 20, "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]  # every line is a whole event
    assert "".join(c["choices"][0]["text"] for c in chunks) == eng.text


def test_the_fault_route_exists_only_with_fault_injection_on() -> None:
    require("fastapi", "httpx")
    from fastapi.testclient import TestClient

    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.tokenizer import ByteTokenizer

    for on in (False, True):
        app = create_app(ServerState(FakeEngine(), ByteTokenizer(), "fake", fault_injection=on))
        r = TestClient(app).post("/debug/fail-instance/fake-0")
        assert r.status_code == 404
        msg = r.json()["error"]["message"]
        # On, the engine answers (the fake has no such instance); off, there is no route.
        assert ("no instance 'fake-0'" in msg) is on and ("Not found" in msg) is not on


def test_a_client_that_leaves_mid_body_is_not_an_internal_error(fake, caplog) -> None:
    import socket

    host, port = fake[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:  # found by bench.soak's slow clients
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
        time.sleep(0.3)
    time.sleep(0.5)
    assert not [r for r in caplog.records if "request failed" in r.getMessage()]
    with _http(fake) as h:
        assert h.get("/health").status_code == 200
