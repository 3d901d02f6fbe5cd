"""What `serve` and `serve --ray` both need to launch: the EngineConfig of the command line
and serving a ServerState on a bound socket (each subcommand module imports this one, never
the other)."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from flexnpu.cli.errors import CliError

# Engine shapes an export fixes (None here: take the export's, or the EngineConfig default).
SHAPE_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "num_kv_blocks": "--num-kv-blocks",
    "chunk_buckets": "--chunk-buckets",
    "decode_widths": "--decode-widths",
}


def engine_config(
    args: argparse.Namespace,
    num_devices: int,
    exported: dict | None = None,
    default_instances: int = 0,
):
    """The EngineConfig of the command line (shapes from `exported` when serving an export;
    `default_instances`: the co-located instances when --devices is not given, 0: one per
    device)."""
    from flexnpu.serving.engine import EngineConfig

    shapes = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None}
    for key in ("chunk_buckets", "decode_widths"):
        if isinstance(shapes.get(key), str):
            shapes[key] = [int(b) for b in shapes[key].split(",")]
    if exported is not None:
        clash = {k: v for k, v in shapes.items() if exported.get(k) != v}
        if clash:
            raise CliError(
                f"--from-export: {', '.join(SHAPE_FLAGS[k] for k in clash)} "
                f"differ from the export's shapes {exported}; drop them"
            )
        shapes = dict(exported)
    layout = args.layout or ("split" if args.prefill_devices else "colocated")
    if layout == "split":
        pre = args.prefill_devices or 1
        dec = args.decode_devices or max(1, num_devices - pre)
        layout_kw = dict(layout="split", prefill_devices=pre, decode_devices=dec)
    elif layout == "static-colocate":
        layout_kw = dict(layout=layout, num_devices=args.devices)
    elif layout == "adaptive":
        layout_kw = dict(
            layout="adaptive",
            num_devices=args.devices,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            split_hold_s=args.split_hold,
            split_colocate=args.split_colocate,
            split_tpot_target_s=args.split_tpot_target,
        )
    else:
        layout_kw = dict(layout="colocated", num_devices=args.devices or default_instances)
    ec = EngineConfig(
        **shapes,
        **layout_kw,
        max_waiting=args.max_waiting,
        request_timeout=args.request_timeout or None,
    )
    try:
        ec.validate()
    except ValueError as e:
        raise CliError(f"bad engine options: {e}") from e
    return ec


def fault_injection() -> bool:
    """Whether the server takes POST /debug/fail-instance (FLEXNPU_FAULT_INJECTION=1: fault
    tests and bench.soak only)."""
    return os.environ.get("FLEXNPU_FAULT_INJECTION") == "1"


def serve_state(state: Any, args: argparse.Namespace, sock: socket.socket, where: str = "") -> None:
    """Serves the app of `state` on `sock` until Ctrl-C or SIGTERM (then drains), saying
    "serving NAME on URL" + `where` once it listens."""
    from flexnpu.serving.server import create_app
    from flexnpu.serving.shutdown import serve

    host, port = args.host, sock.getsockname()[1]  # --port 0: the port the system chose

    def listening() -> None:
        print(f"serving {state.model_name} on http://{host}:{port}/v1{where}", flush=True)

    serve(
        create_app(state),
        state.in_flight,
        args.shutdown_grace_s,
        sockets=[sock],
        on_listening=listening,
        log_level=args.log_level,
    )
