"""`serve --ray [ADDRESS]`: serve over every host of a Ray cluster that offers FlexNPU devices
(`ray start ... --resources '{"flexnpu_devices": 4}'`): one engine replica per such host, each
a named Ray actor in its own process on that host (the same model and engine options as plain
`serve`, its host's backend: FLEXNPU_BACKEND of `ray start`'s environment, or `--ray-env`), and
the OpenAI-compatible server here in front of them (docs/multihost.md). With --ray, --layout
is how the cluster layer uses the hosts (colocated, split with --prefill-hosts, adaptive); each
host's engine is colocated over its own devices."""

from __future__ import annotations

import argparse
import dataclasses
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
        "--prefill-hosts",
        type=int,
        default=0,
        metavar="N",
        help="--ray --layout split: the first N hosts prefill, the others decode, each "
        "prompt's KV moved between hosts through Ray (default 1; implies --layout split)",
    )
    g.add_argument(
        "--ray-recompute",
        action="store_true",
        help="a request running on a replica that dies (or whose KV handoff fails) is "
        "computed again on another, from its prompt and the tokens streamed so far, instead "
        "of failing",
    )
    g.add_argument(
        "--ray-discover-s",
        type=float,
        default=2.0,
        metavar="S",
        help="how often to look for nodes that joined the cluster with devices (default 2)",
    )


def replica_engine_config(
    options: argparse.Namespace, devices: Sequence[Any], kv_handoff: bool = False
) -> Any:
    """The EngineConfig plain `serve` would build for `devices` (run on each replica);
    `kv_handoff`: with the programs that hand prefilled sequences to other hosts."""
    from flexnpu.cli.launch import engine_config
    from flexnpu.serving.layout import default_instances

    choice = default_instances(devices)
    ec = engine_config(options, len(devices), default_instances=choice.instances)
    return dataclasses.replace(ec, kv_handoff=kv_handoff)


def check_single_host(args: argparse.Namespace) -> None:
    """Multi-host options without --ray."""
    if args.prefill_hosts:
        raise CliError("--prefill-hosts splits the hosts of a Ray cluster: it needs --ray")


def host_layout(args: argparse.Namespace) -> tuple[str, int]:
    """(how the cluster layer uses the hosts, prefill hosts) from --layout / --prefill-hosts;
    each host's engine is colocated over its devices."""
    from flexnpu.serving.multihost.front import HOST_LAYOUTS

    layout = args.layout or ("split" if args.prefill_hosts else "colocated")
    if layout not in HOST_LAYOUTS:
        raise CliError(
            f"--ray --layout {layout}: across hosts the layouts are {', '.join(HOST_LAYOUTS)} "
            "(each host's engine is colocated over its devices)"
        )
    if args.prefill_devices or args.decode_devices:
        raise CliError(
            "--ray: --prefill-devices/--decode-devices split one host's devices; across hosts "
            "use --layout split --prefill-hosts N (each host's engine is colocated)"
        )
    if args.prefill_hosts < 0 or (args.prefill_hosts and layout != "split"):
        raise CliError(f"--prefill-hosts {args.prefill_hosts}: expected N >= 1 with --layout split")
    return layout, args.prefill_hosts or 1


def check_hosts(layout: str, prefill_hosts: int, hosts: int) -> None:
    """The host layout against the hosts that offer devices now."""
    from flexnpu.serving.multihost.replica import DEVICES_RESOURCE

    if layout != "colocated" and hosts < 2:
        raise CliError(
            f"--layout {layout} across hosts needs at least 2 hosts offering "
            f"{DEVICES_RESOURCE}; the cluster has {hosts}"
        )
    if layout == "split" and prefill_hosts >= hosts:
        raise CliError(
            f"--prefill-hosts {prefill_hosts}: the cluster has {hosts} hosts offering "
            f"{DEVICES_RESOURCE}; expected 1 to {hosts - 1} (the others decode)"
        )


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
    layout, prefill_hosts = host_layout(args)
    from flexnpu.serving.multihost.ray_replicas import RayMissingError, import_ray

    try:
        ray = import_ray()
    except RayMissingError as e:
        raise CliError(str(e)) from None
    options = argparse.Namespace(**{k: getattr(args, k) for k in _ENGINE_OPTIONS})
    options.layout = "colocated"  # each host's engine; --layout is the hosts'
    options.prefill_devices = options.decode_devices = 0
    # Bad engine options are reported here, before any replica loads (checked against one
    # device: the replicas resolve the device-dependent defaults themselves).
    from flexnpu.cli.launch import engine_config

    engine_config(options, 1)
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
        return _serve(args, sock, tokenizer, env, options, ray, layout, prefill_hosts)
    finally:
        ray.shutdown()


def _serve(
    args: argparse.Namespace,
    sock: socket.socket,
    tokenizer: Any,
    env: dict[str, str],
    options: argparse.Namespace,
    ray: Any,
    layout: str,
    prefill_hosts: int,
) -> int:
    from flexnpu.cli.launch import fault_injection, serve_state
    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig
    from flexnpu.serving.multihost.ray_replicas import RayLauncher
    from flexnpu.serving.multihost.replica import DEVICES_RESOURCE, ReplicaSpec
    from flexnpu.serving.server import ServerState

    spec = ReplicaSpec(
        model=args.model,
        engine_config=functools.partial(
            replica_engine_config, options, kv_handoff=layout != "colocated"
        ),
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
        measure_prefill=layout == "adaptive",
    )
    live = [n for n in ray.nodes() if n.get("Alive")]
    offering = [n for n in live if n.get("Resources", {}).get(DEVICES_RESOURCE, 0) > 0]
    print(
        f"Ray cluster: {len(live)} live nodes, {len(offering)} offer {DEVICES_RESOURCE}; "
        "starting a replica on each",
        flush=True,
    )
    check_hosts(layout, prefill_hosts, len(offering))
    config = FrontConfig(
        discover_interval_s=args.ray_discover_s,
        layout=layout,
        prefill_hosts=prefill_hosts,
        split_hold_s=args.split_hold,
        split_colocate=args.split_colocate,
        recompute=args.ray_recompute,
    )
    front = ClusterFront(RayLauncher(spec), None, config)
    try:
        front.start()
    except RuntimeError as e:
        front.stop()
        raise CliError(str(e)) from e
    roles = ", ".join(f"{replica} {role}" for _, replica, role in front.host_roles())
    print(f"hosts ({layout}): {roles}", flush=True)
    name = front.replicas()[0].model_name  # --served-model-name, else the replicas' model
    metrics = ClusterMetrics(name)
    metrics.attach(front)
    front.metrics = metrics
    state = ServerState(front, tokenizer, name, metrics=metrics, fault_injection=fault_injection())
    try:
        serve_state(state, args, sock, f" over {len(front.replicas())} replicas")
    finally:
        front.stop()
    return 0
