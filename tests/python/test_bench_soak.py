"""bench.soak: its judgement of single requests and metrics (pure), then a few seconds of soak
with faults and a small fuzz campaign against a tiny random model on the CPU plugin, whose
invariants must all pass."""

from __future__ import annotations

import json

import pytest
from _serving import require

from bench import soak
from bench.soak_client import Record, judge

TINY_SERVER = [
    "--backend", "cpu", "--backend-options", "", "--model", "random:tiny", "--dtype", "float32",
    "--max-model-len", "128", "--num-kv-blocks", "16", "--max-num-seqs", "4",
    "--serve-arg=--max-num-batched-tokens", "--serve-arg=64",  # one prompt-chunk program
]  # fmt: skip


def _completed(k: int = 3, **kw: object) -> Record:
    r = Record(0, "client", "/v1/completions", True, expected_tokens=k, max_tokens=k, **kw)
    r.status, r.done_markers, r.usage_tokens = 200, 1, k
    r.tokens[0] = k
    r.finishes[0] = ["length"]
    return r


def test_a_whole_stream_is_completed_without_violations() -> None:
    assert judge(_completed()) == ("completed", [])


def test_lost_duplicated_or_twice_ended_tokens_are_violations() -> None:
    short = _completed()
    short.tokens[0] = 2
    assert any("2 tokens streamed, 3 asked" in v for v in judge(short)[1])
    twice = _completed()
    twice.finishes[0] = ["length", "length"]
    assert any("ended 2 times" in v for v in judge(twice)[1])
    no_done = _completed()
    no_done.done_markers = 0
    assert any("0 [DONE]" in v for v in judge(no_done)[1])
    usage = _completed()
    usage.usage_tokens = 4
    assert any("usage.completion_tokens 4" in v for v in judge(usage)[1])


def test_statuses_are_judged_by_name() -> None:
    overload = Record(0, "client", "/v1/completions", True, status=503,
                      error="The server is at capacity: 64 requests waiting. Retry later.")
    assert judge(overload) == ("rejected", [])
    dead = Record(0, "client", "/v1/completions", True, status=503, error="The engine has failed")
    assert judge(dead) == ("named-error", ["server error 503: The engine has failed"])
    crash = Record(0, "client", "/v1/completions", True, status=500, error="Generation failed")
    assert judge(crash)[0] == "named-error" and "server error 500" in judge(crash)[1][0]
    unnamed = Record(0, "client", "/v1/completions", True, status=400)
    assert "without an OpenAI-shaped error body" in judge(unnamed)[1][0]
    gone = Record(0, "client", "/v1/completions", True, client_error="ReadError: reset")
    assert judge(gone) == ("lost", ["lost: ReadError: reset"])
    hung = Record(0, "client", "/v1/completions", True, hung_up="storm", max_tokens=3)
    assert judge(hung) == ("hung-up", [])


def test_token_bounds_and_start_up_line() -> None:
    hung = Record(1, "client", "/v1/completions", True, hung_up="storm", max_tokens=5)
    hung.tokens[0] = 2
    refused = Record(2, "bad-http", "/v1/completions", False, status=400, error="bad")
    assert soak.token_bounds([_completed(), hung, refused]) == (5, 8)
    line = "engine: colocated: mixed on flexnpu:0, mixed on flexnpu:1; ... 64 KV blocks of 16 per"
    assert soak.kv_capacity(line + " device\n") == (2 * 64 * 16, 2)


def test_metrics_are_summed_over_labels() -> None:
    text = (
        "# TYPE flexnpu:request_success counter\n"
        'flexnpu:request_success_total{model_name="m",finished_reason="length"} 3.0\n'
        'flexnpu:request_success_total{model_name="m",finished_reason="abort"} 1.0\n'
    )
    m = soak.parse_metrics(text)
    assert m['flexnpu:request_success_total{finished_reason="length"}'] == 3.0
    assert m["flexnpu:request_success_total"] == 4.0


@pytest.fixture(scope="module")
def tiny_server():
    """One server for the soak and the fuzz campaign, started as the soak starts its own (with
    the fault hook's variable, as for instance-failure)."""
    require("fastapi", "uvicorn", "httpx", "prometheus_client", "hypothesis")
    options = soak.parse_args([*TINY_SERVER, "--faults", "instance-failure"])
    server, _ = soak.start_soak_server(options, ["instance-failure"])
    yield ["--base-url", server.base_url, "--server-pid", str(server.pid)]
    server.stop()


def test_a_short_soak_with_faults_passes_its_invariants(tiny_server, tmp_path) -> None:
    rc = soak.main([
        *TINY_SERVER, *tiny_server, "--clients", "3", "--duration", "6", "--min-tokens", "2",
        "--max-tokens", "8", "--prompt-words", "4", "--fault-every", "1.5",
        "--fault-quiet-s", "1", "--faults", "instance-failure,disconnect-storm,bad-http,"
        "kv-exhaustion", "--slow-client-s", "1", "--huge-body-mb", "0.2", "--fuzz-bodies",
        "4", "--long-requests", "3", "--long-output-tokens", "8", "--out", str(tmp_path),
    ])  # fmt: skip
    doc = json.loads((tmp_path / "soak.json").read_text())
    failed = {k: v for k, v in doc["invariants"].items() if not v["ok"]}
    assert rc == 0 and not failed, (failed, doc["facts"]["violations"])
    injected = {f["fault"] for f in doc["faults"]}
    assert {"instance-failure", "disconnect-storm"} <= injected
    failure = next(f for f in doc["faults"] if f["fault"] == "instance-failure")
    assert failure["status"] == 200, failure  # the instance failed, restarted, served on
    assert doc["facts"]["outcomes"].get("client:completed", 0) > 0
    assert (tmp_path / "soak.md").read_text().startswith("# Soak")


def test_a_small_fuzz_campaign_finds_no_server_error(tiny_server, tmp_path) -> None:
    rc = soak.main([*TINY_SERVER, *tiny_server, "--fuzz", "60", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "fuzz.json").read_text())
    assert rc == 0, doc["failures"]
    assert doc["requests"] == 60 and sum(doc["statuses"].values()) == 60


@pytest.mark.parametrize(
    "bad", [["--faults", "nope"], ["--min-tokens", "0"], ["--base-url", "http://10.0.0.1:8000"]]
)
def test_bad_options_are_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        soak.parse_args(bad)
    assert e.value.code == 2
