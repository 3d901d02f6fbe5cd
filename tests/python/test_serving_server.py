"""The OpenAI-compatible HTTP server end to end on loopback, with the official `openai` client:
completions and chat (plain and streaming SSE with usage), stop strings, errors, disconnects,
metrics. A tiny random Llama on one virtual NPU keeps it fast; greedy decoding is deterministic."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _serving import require

MAX_LEN = 128


@pytest.fixture(scope="module")
def server(npu_devices):
    require("fastapi", "uvicorn", "openai", "httpx", "prometheus_client")
    import uvicorn

    from flexnpu.serving.engine import Engine, EngineConfig, ModelSteps
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.metrics import ServingMetrics
    from flexnpu.serving.server import ServerState, create_app

    m = load_model("random:tiny", seed=3, log=lambda *_: None)
    metrics = ServingMetrics("tiny")
    eng = Engine(ModelSteps(m.config), m.params,
                 EngineConfig(max_batch=4, max_seq_len=MAX_LEN, buckets=[16, 64]),
                 devices=npu_devices[:1], metrics=metrics)
    eng.warmup()
    eng.start()
    app = create_app(ServerState(eng, m.tokenizer, "tiny", None, metrics))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield f"http://127.0.0.1:{port}", eng
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
        assert h.get("/health").status_code == 200
    assert [m.id for m in client.models.list().data] == ["tiny"]


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
    ({"prompt": "x" * 100}, 400, "prompt"),  # longest bucket is 64 tokens
    ({"prompt": "x" * 60, "max_tokens": 100}, 400, "max_tokens"),  # 160 > context 128
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "x", "n": 2}, 400, "n"),
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


def test_bad_chat_requests_and_openai_error(server, client) -> None:
    import openai

    with _http(server) as h:
        for body in ({}, {"messages": []}, {"messages": "hi"}, {"messages": [{"content": "x"}]},
                     {"messages": [{"role": "user", "content": 3}]}):
            r = h.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == "messages", body
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny", prompt=[1] * 65, max_tokens=1)


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


def test_serving_benchmark_client(server, tmp_path, capsys) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "bench" / "serving.py"
    spec = importlib.util.spec_from_file_location("bench_serving", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_serving"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
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
