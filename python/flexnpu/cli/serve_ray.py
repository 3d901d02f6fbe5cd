"""`serve --ray [ADDRESS]`: serve over every host of a Ray cluster that offers FlexNPU devices
(`ray start ... --resources '{"flexnpu_devices": 4}'`): one engine replica per such host, each
a named Ray actor in its own process on that host (the same model and engine options as plain
`serve`, its host's backend: FLEXNPU_BACKEND of `ray start`'s environment, or `--ray-env`), and
the OpenAI-compatible server here in front of them (docs/multihost.md)."""

from __future__ import annotations

import argparse
import functools
import os
import socket
from collections.abc import Sequence
from typing import Any

from flexnpu.cli.errors import CliError

# The serve options an EngineConfig is made of (sent to the replicas, which resolve them
# against their own devices as plain `serve` does).
_ENGINE_OPTIONS = (
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "block_size",
    "num_kv_blocks",
    "chunk_buckets",
    "decode_widths",
    "layout",
    "devices",
    "prefill_devices",
    "decode_devices",
    "max_waiting",
    "request_timeout",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-host (Ray)")
    g.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="serve over a Ray cluster: one engine replica per node that offers the custom "
        "resource flexnpu_devices, this server in front (ADDRESS: the cluster's, e.g. "
        "HEAD:6379, or 'auto'; default RAY_ADDRESS, else auto). Needs pip install "
        "'flexnpu[ray]'",
    )
    g.add_argument(
        "--ray-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of every replica's process (over its node's), e.g. "
        "FLEXNPU_BACKEND=emulate:910c; repeatable",
    )
    g.add_argument(
        "--ray-discover-s",
        type=float,
        default=2.0,
        metavar="S",
        help="how often to look for nodes that joined the cluster with devices (default 2)",
    )


def replica_engine_config(options: argparse.Namespace, devices: Sequence[Any]) -> Any:
    """The EngineConfig plain `serve` would build for `devices` (run on each replica)."""
    from flexnpu.cli.serve import engine_config
    from flexnpu.serving.layout import default_instances

    choice = default_instances(devices)
    return engine_config(options, len(devices), default_instances=choice.instances)


def _check_reachable(address: str) -> None:
    """A HOST:PORT that nothing answers on is reported at once (ray.init would retry for
    minutes)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise CliError(
            f"--ray {address}: cannot reach the Ray cluster's head there ({e}); "
            "expected HOST:PORT of `ray start --head --port PORT`, or auto"
        ) from None


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--ray-env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def run(args: argparse.Namespace, sock: socket.socket | None) -> int:
    if args.export or args.from_export or sock is None:
        raise CliError(
            "--ray serves --model on every host; --export and --from-export are single-host only"
        )
    env = _env(args.ray_env)
    from flexnpu.serving.multihost.ray_replicas import RayMissingError, import_ray

    try:
        ray = import_ray()
    except RayMissingError as e:
        raise CliError(str(e)) from None
    options = argparse.Namespace(**{k: getattr(args, k) for k in _ENGINE_OPTIONS})
    # Bad engine options are reported here, before any replica loads (checked against one
    # device: the replicas resolve the device-dependent defaults themselves).
    from flexnpu.cli.serve import engine_config

    engine_config(options, max(1, (args.prefill_devices or 0) + (args.decode_devices or 0)))
    from flexnpu.serving.loading import load_tokenizer

    try:
        tokenizer = load_tokenizer(args.model, args.tokenizer)
    except (ValueError, FileNotFoundError) as e:
        raise CliError(f"--model {args.model}: {e}") from e

    address = args.ray or os.environ.get("RAY_ADDRESS") or "auto"
    _check_reachable(address)
    try:
        ray.init(address=address, namespace="flexnpu", log_to_driver=True)
    except Exception as e:  # noqa: BLE001 - ConnectionError, ValueError, ...
        raise CliError(f"--ray {address}: cannot connect to the Ray cluster: {e}") from e
    try:
        return _serve(args, sock, tokenizer, env, options, ray)
    finally:
        ray.shutdown()


def _serve(
    args: argparse.Namespace,
    sock: socket.socket,
    tokenizer: Any,
    env: dict[str, str],
    options: argparse.Namespace,
    ray: Any,
) -> int:
    from flexnpu.cli.serve import serve_state
    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig
    from flexnpu.serving.multihost.ray_replicas import RayLauncher
    from flexnpu.serving.multihost.replica import DEVICES_RESOURCE, ReplicaSpec
    from flexnpu.serving.server import ServerState

    spec = ReplicaSpec(
        model=args.model,
        engine_config=functools.partial(replica_engine_config, options),
        dtype=args.dtype,
        seed=args.seed,
        tokenizer=args.tokenizer,
        policy=args.policy,
        served_model_name=args.served_model_name,
        warmup=not args.no_warmup,
        compilation_cache=None
        if args.no_compilation_cache
        else (args.compilation_cache or "default"),
        backend_log_level=args.backend_log_level,
        env=env,
    )
    live = [n for n in ray.nodes() if n.get("Alive")]
    offering = [n for n in live if n.get("Resources", {}).get(DEVICES_RESOURCE, 0) > 0]
    print(
        f"Ray cluster: {len(live)} live nodes, {len(offering)} offer {DEVICES_RESOURCE}; "
        "starting a replica on each",
        flush=True,
    )
    front = ClusterFront(
        RayLauncher(spec), None, FrontConfig(discover_interval_s=args.ray_discover_s)
    )
    try:
        front.start()
    except RuntimeError as e:
        front.stop()
        raise CliError(str(e)) from e
    name = front.replicas()[0].model_name  # --served-model-name, else the replicas' model
    metrics = ClusterMetrics(name)
    metrics.attach(front)
    front.metrics = metrics
    state = ServerState(front, tokenizer, name, metrics=metrics)
    try:
        serve_state(state, args, sock, f" over {len(front.replicas())} replicas")
    finally:
        front.stop()
    return 0
