"""EasyDeL's OpenAI-compatible server (eSurgeApiServer), unchanged, on whatever JAX backend the
environment selects, asked over HTTP by a plain client.

    serve: the tiny random LLaMA of easydel_esurge.py behind eSurgeApiServer (uvicorn), as a
           user would run it;
    ask:   a plain HTTP client (no EasyDeL): waits for /health, sends greedy
           /v1/chat/completions requests and streaming /v1/completions requests (server-sent
           events), 4 at once each, prints one JSON line with the texts, their token ids (the
           texts encoded with the same tokenizer: the OpenAI API returns text), tokens/s;
    run:   serve in a child process with this environment, ask it, stop it; adds the
           start-up time (launch to the first answer, compiles included).

Run it in a venv with `easydel==0.3.0` (and flexnpu for the FlexNPU runs):
    S=examples/third_party/easydel_esurge_server.py
    JAX_PLATFORMS=cpu python $S run --tokenizer-dir /tmp/tiny-tok
    FLEXNPU_PLATFORM_NAME=cpu FLEXNPU_POLICY=dynamic python $S run --tokenizer-dir /tmp/tiny-tok
docs/own-serving-stack.md compares the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from easydel_esurge import PROMPTS, make_model, make_tokenizer

T = TypeVar("T")
MODEL_NAME = "tiny-llama"
# The tiny tokenizer has no chat template; a plain one (each message on its own line).
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def load_tokenizer(directory: Path) -> Any:
    import transformers

    if not (directory / "tokenizer.json").exists():
        make_tokenizer(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def serve(tokenizer_dir: Path, port: int, hbm_utilization: float) -> None:
    import easydel as ed
    import jax.numpy as jnp

    engine = ed.eSurge(
        model=make_model(),
        tokenizer=load_tokenizer(tokenizer_dir),
        dtype=jnp.float32,
        max_model_len=256,
        max_num_seqs=4,
        hbm_utilization=hbm_utilization,
        page_size=16,
        esurge_name=MODEL_NAME,
        silent_mode=True,
    )
    server = ed.eSurgeApiServer(
        engine, enable_persistence=False, enable_response_store=False, enable_audit_logging=False
    )
    server.run(host="127.0.0.1", port=port, log_level="warning")


def _wait_ready(client: httpx.Client, deadline_s: float) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            answer = client.get("/health")
            if answer.status_code == 200:
                return answer.json()
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"the server did not answer /health within {deadline_s:.0f} s")


def _chat(client: httpx.Client, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    answer = client.post("/v1/chat/completions", json=body)
    answer.raise_for_status()
    data = answer.json()
    return {
        "text": data["choices"][0]["message"]["content"] or "",
        "completion_tokens": int(data["usage"]["completion_tokens"]),
    }


def _stream_completion(client: httpx.Client, prompt: str, max_tokens: int) -> str:
    """/v1/completions with stream=true: the text deltas of its server-sent events, joined
    (OpenAI's completion chunks carry `text`; eSurge sends chat-style `delta.content`)."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    parts: list[str] = []
    with client.stream("POST", "/v1/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            for choice in event.get("choices", []):
                parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def _all_at_once(request: Callable[[str], T]) -> list[T]:
    """`request` for every prompt, all in flight together (eSurge batches them)."""
    answers: list[Any] = [None] * len(PROMPTS)

    def one(i: int) -> None:
        answers[i] = request(PROMPTS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(a is None for a in answers):
        raise RuntimeError("a request failed (see its thread's error above)")
    return answers


def ask(url: str, tokenizer_dir: Path, max_tokens: int, wait_s: float) -> dict[str, Any]:
    tokenizer = load_tokenizer(tokenizer_dir)
    with httpx.Client(base_url=url, timeout=wait_s) as client:
        health = _wait_ready(client, wait_s)
        t_ready = time.perf_counter()
        _chat(client, PROMPTS[0], max_tokens)  # compiles what the timed requests need
        first_answer_at = time.perf_counter()
        t0 = time.perf_counter()
        chats = _all_at_once(lambda p: _chat(client, p, max_tokens))
        chat_elapsed = time.perf_counter() - t0
        streamed = _all_at_once(lambda p: _stream_completion(client, p, max_tokens))
    texts = [c["text"] for c in chats]
    return {
        "health_status": health.get("status"),
        "first_answer_s": round(first_answer_at - t_ready, 2),
        "first_answer_at": first_answer_at,
        "chat_tokens_per_s": round(sum(c["completion_tokens"] for c in chats) / chat_elapsed, 2),
        "chat_texts": texts,
        "chat_ids": [tokenizer.encode(t, add_special_tokens=False) for t in texts],
        "completion_texts": streamed,
        "completion_ids": [tokenizer.encode(t, add_special_tokens=False) for t in streamed],
    }


def _bytes_limit(device: Any) -> int:
    return int((device.memory_stats() or {}).get("bytes_limit", 0))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """serve in a child process (this environment), ask it, stop it."""
    import jax

    launched = time.perf_counter()
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "serve",
            f"--tokenizer-dir={args.tokenizer_dir}",
            f"--port={args.port}",
            f"--hbm-utilization={args.hbm_utilization}",
        ],
        env=os.environ.copy(),
    )
    try:
        url = f"http://127.0.0.1:{args.port}"
        result = ask(url, args.tokenizer_dir, args.max_tokens, args.wait_s)
        result["startup_s"] = round(result.pop("first_answer_at") - launched, 2)
    finally:
        child.terminate()  # uvicorn's graceful shutdown waits for requests in flight
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    # What the server's environment selects, seen from a process with the same environment.
    devices = jax.devices()
    return {
        "default_backend": jax.default_backend(),
        "platform_version": devices[0].client.platform_version,
        "num_devices": len(devices),
        "bytes_limit_sum": sum(_bytes_limit(d) for d in devices),
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["serve", "ask", "run"])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=11556)
    parser.add_argument("--url", default=None, help="ask: the server (default: 127.0.0.1:--port)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--hbm-utilization", type=float, default=0.06)
    parser.add_argument("--wait-s", type=float, default=1800.0)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.tokenizer_dir, args.port, args.hbm_utilization)
        return
    if args.mode == "ask":
        url = args.url or f"http://127.0.0.1:{args.port}"
        result = ask(url, args.tokenizer_dir, args.max_tokens, args.wait_s)
        result.pop("first_answer_at")
    else:
        result = run(args)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
