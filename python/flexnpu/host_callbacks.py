"""Host callbacks (jax.debug.print, jax.pure_callback, io_callback, ...) on flexnpu over a CPU
PJRT plugin.

jaxlib's own CPU callback handler cannot run inside a PJRT plugin (it needs an FFI
'instantiate' stage that PJRT's register_handler cannot register) and XLA:CPU has no
send/recv. So flexnpu lowers each host callback to a custom call of FlexNPU's own
execute-only FFI handler (pjrt_flexnpu/runtime/host_callback.cc), registered with the physical
backend under the target names jaxlib uses for its own CPU callbacks (XLA's Shardy passes
recognise Python callbacks by name, so their sharding reaches the SPMD partitioner; jaxlib's
handler is never mirrored there), with the callback's id as the attribute `callback_id`. The
handler calls the trampoline installed here (flexnpu._native's, which calls `_trampoline`
under the GIL), and that runs the Python callable:

* operands arrive as numpy arrays (copied out of the device buffers: the callable may keep
  them, the buffers do not outlive the call); results are written straight into the result
  buffers after their shapes and dtypes are checked;
* a Python exception becomes the execution's error, carrying the exception's text;
* ordering is JAX's: ordered effects (io_callback(ordered=True)) thread a token through the
  custom calls, as on cpu.

The callable lives as long as the executable: its registration is a keepalive of the module
(JAX keeps those with the executable). Ids are unique per process (a random base), because
they are part of the program and so of its persistent-cache key.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

# runtime/host_callback.h's kHostCallbackTargets: (unpartitioned, partitioned).
TARGET_NAMES = ("xla_ffi_python_cpu_callback", "xla_ffi_partitioned_python_cpu_callback")
CALLBACK_ID_ATTRIBUTE = "callback_id"
logger = logging.getLogger(__name__)


class _Buffer(NamedTuple):
    """runtime/host_callback.h's HostCallbackBuffer, as flexnpu._native's trampoline passes it."""

    dtype: int  # XLA_FFI_DataType code
    data: int  # address
    shape: tuple[int, ...]


def _numpy_dtypes() -> dict[int, np.dtype[Any]]:
    import ml_dtypes

    # XLA_FFI_DataType codes (xla/ffi/api/c_api.h).
    by_code: dict[int, Any] = {
        1: np.bool_,
        2: np.int8,
        3: np.int16,
        4: np.int32,
        5: np.int64,
        6: np.uint8,
        7: np.uint16,
        8: np.uint32,
        9: np.uint64,
        10: np.float16,
        11: np.float32,
        12: np.float64,
        15: np.complex64,
        18: np.complex128,
        16: ml_dtypes.bfloat16,
        19: ml_dtypes.float8_e5m2,
        20: ml_dtypes.float8_e4m3fn,
        23: ml_dtypes.float8_e4m3b11fnuz,
        24: ml_dtypes.float8_e5m2fnuz,
        25: ml_dtypes.float8_e4m3fnuz,
    }
    return {code: np.dtype(t) for code, t in by_code.items()}


def _sub_byte_dtypes() -> dict[int, tuple[np.dtype[Any], int]]:
    import ml_dtypes

    # XLA packs these in memory, the first element in the lowest bits; numpy holds one a byte.
    by_code: dict[int, tuple[Any, int]] = {
        26: (ml_dtypes.int2, 2),
        27: (ml_dtypes.uint2, 2),
        21: (ml_dtypes.int4, 4),
        22: (ml_dtypes.uint4, 4),
        32: (ml_dtypes.float4_e2m1fn, 4),
    }
    return {code: (np.dtype(t), bits) for code, (t, bits) in by_code.items()}


_DTYPES = _numpy_dtypes()
_SUB_BYTE_DTYPES = _sub_byte_dtypes()
_lock = threading.Lock()
_callables: dict[int, Callable[..., Sequence[Any]]] = {}
_next_id = secrets.randbits(40) << 20
_installed = False


class Registration:
    """A registered callable; unregistered when this object (a module keepalive) goes."""

    __slots__ = ("callback_id",)

    def __init__(self, callback_id: int) -> None:
        self.callback_id = callback_id

    def __del__(self) -> None:
        _callables.pop(self.callback_id, None)


def register(fn: Callable[..., Sequence[Any]]) -> Registration:
    """Registers `fn` (arrays in, a sequence of arrays out) under a fresh id."""
    global _next_id
    with _lock:
        callback_id = _next_id
        _next_id += 1
        _callables[callback_id] = fn
    return Registration(callback_id)


def _numpy_dtype(code: int) -> np.dtype[Any]:
    if code in _SUB_BYTE_DTYPES:
        return _SUB_BYTE_DTYPES[code][0]
    if code not in _DTYPES:
        raise TypeError(f"XLA FFI data type {code} has no numpy equivalent here")
    return _DTYPES[code]


def _raw(buffer: _Buffer, nbytes: int) -> np.ndarray:
    from flexnpu._native_loader import native

    memory = native("host_callback_memory", "host callbacks").host_callback_memory
    return np.frombuffer(memory(buffer.data, nbytes), np.uint8)


def _array(buffer: _Buffer) -> np.ndarray:
    """A numpy view of `buffer` (a copy for packed sub-byte types; empty without elements)."""
    shape = buffer.shape
    count = int(np.prod(shape, dtype=np.int64))
    sub_byte = _SUB_BYTE_DTYPES.get(buffer.dtype)
    if sub_byte is not None:
        dtype, bits = sub_byte
        if count == 0 or not buffer.data:
            return np.empty(shape, dtype)
        per_byte = 8 // bits
        packed = _raw(buffer, -(-count // per_byte))
        shifts = np.arange(per_byte, dtype=np.uint8) * bits
        values = (packed[:, None] >> shifts) & ((1 << bits) - 1)
        return values.reshape(-1)[:count].astype(np.uint8).view(dtype).reshape(shape)
    dtype = _numpy_dtype(buffer.dtype)
    if count == 0 or not buffer.data:
        return np.empty(shape, dtype)
    return _raw(buffer, count * dtype.itemsize).view(dtype).reshape(shape)


def _write(buffer: _Buffer, value: np.ndarray) -> None:
    """Writes `value` (already checked against `buffer`'s shape and dtype) into `buffer`."""
    sub_byte = _SUB_BYTE_DTYPES.get(buffer.dtype)
    if sub_byte is None:
        target = _array(buffer)
        if target.size:
            np.copyto(target, value)
        return
    _, bits = sub_byte
    if value.size == 0 or not buffer.data:
        return
    per_byte = 8 // bits
    nibbles = np.ascontiguousarray(value).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    padded = np.zeros(-(-nibbles.size // per_byte) * per_byte, np.uint8)
    padded[: nibbles.size] = nibbles
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    packed = np.bitwise_or.reduce(padded.reshape(-1, per_byte) << shifts, axis=1)
    _raw(buffer, packed.size)[:] = packed.astype(np.uint8)


def _run(callback_id: int, args: list[_Buffer], rets: list[_Buffer]) -> None:
    fn = _callables.get(callback_id)
    if fn is None:
        raise RuntimeError(
            f"host callback {callback_id} is not registered (its executable "
            "was freed, or the program was compiled in another process)"
        )
    outs = fn(*(_array(arg).copy() for arg in args))
    if len(outs) != len(rets):
        raise RuntimeError(
            f"the callback returned {len(outs)} values, the program expects {len(rets)}"
        )
    for i, out in enumerate(outs):
        value = np.asarray(out)
        shape = rets[i].shape
        dtype = _numpy_dtype(rets[i].dtype)
        if value.shape != shape or value.dtype != dtype:
            raise RuntimeError(
                f"result #{i} is {value.dtype}{list(value.shape)}, the program "
                f"expects {dtype}{list(shape)}"
            )
        _write(rets[i], value)


_BufferTuple = tuple[int, int, tuple[int, ...]]


def _trampoline(
    callback_id: int, args: list[_BufferTuple], rets: list[_BufferTuple]
) -> bytes | None:
    """Runs a callback for flexnpu._native's trampoline: None, or the failure's message (the
    execution's error). Nothing may propagate into C."""
    try:
        _run(callback_id, [_Buffer(*arg) for arg in args], [_Buffer(*ret) for ret in rets])
        return None
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the FFI error
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return text.encode("utf-8", "replace")


def install() -> None:
    """Installs the trampoline and FlexNPU's handler in the physical backends (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        from flexnpu._native_loader import plugin_library

        error = plugin_library().install_host_callbacks(_trampoline)
        if error is not None:
            raise RuntimeError(f"flexnpu: installing host callbacks: {error}")
        _installed = True


def ensure_host_cpu_backend() -> None:
    """JAX runs every host callback's Python with its inputs on a "cpu" device (on any
    platform); under JAX_PLATFORMS=flexnpu there is none, so FlexNPU adds jaxlib's CPU
    backend to JAX's backends the first time a host callback is lowered. The default backend
    stays flexnpu."""
    from jax._src import xla_bridge

    backends = xla_bridge.backends()
    if "cpu" in backends:
        return
    cpu = xla_bridge._init_backend("cpu")
    with xla_bridge._backend_lock:
        xla_bridge._backends.setdefault("cpu", cpu)


def add_host_backend_with_flexnpu(requested_platforms: Sequence[str] | None) -> None:
    """Called from flexnpu's backend factory, which JAX runs inside `xla_bridge.backends()`
    holding `_backend_lock`: when JAX will not create a "cpu" backend itself (jax_platforms
    names flexnpu but not cpu), adds jaxlib's CPU backend next to flexnpu (~25 ms; the default
    backend stays flexnpu).

    Why at backend creation: an eager jax.debug.print / debug.callback that is the process's
    first JAX call runs JAX's impl before any backend exists; that impl itself asks for the
    "cpu" backend, which starts plugin discovery and backend creation, and looks "cpu" up right
    after they return. FlexNPU's code first runs inside that call (discovery), too late to wrap
    the impl already running; a backend created during it is what the lookup finds."""
    from jax._src import xla_bridge

    if requested_platforms is None or "cpu" in requested_platforms:
        return  # JAX creates its cpu backend itself
    if "cpu" in xla_bridge._backends:
        return
    try:
        cpu = xla_bridge._init_backend("cpu")
    except Exception as error:  # noqa: BLE001 - callbacks then fail as JAX says; flexnpu works
        logger.warning("flexnpu: jaxlib's cpu backend for host callbacks: %s", error)
        return
    xla_bridge._backends.setdefault("cpu", cpu)  # the caller holds _backend_lock


def give_eager_callbacks_a_host_device() -> None:
    """Eager jax.debug.print / debug.callback run their impl in Python without lowering: it
    wants the "cpu" device too (ensure_host_cpu_backend), so their impls ask for it first.
    Installed when JAX registers flexnpu (flexnpu/jax_plugin.py), idempotent."""
    from jax._src import debugging

    for primitive in (debugging.debug_callback_p, debugging.debug_print_p):
        impl = primitive.impl
        if getattr(impl, "_flexnpu_host_device", False):
            continue

        def with_host_device(*args: Any, _impl: Any = impl, **params: Any) -> Any:
            ensure_host_cpu_backend()
            return _impl(*args, **params)

        with_host_device._flexnpu_host_device = True  # type: ignore[attr-defined]
        with_host_device.__wrapped__ = impl  # type: ignore[attr-defined]
        primitive.def_impl(with_host_device)


def _set_sharding(mlir: Any, module_context: Any, op: Any, sharding: Any) -> None:
    """mlir.set_sharding: jax >= 0.10 takes the module context first, jax 0.9 does not."""
    import inspect

    if len(inspect.signature(mlir.set_sharding).parameters) == 2:
        mlir.set_sharding(op, sharding)
    else:
        mlir.set_sharding(module_context, op, sharding)


def emit(
    ctx: Any,
    callback: Callable[..., Any],
    token: Any,
    operands: Sequence[Any],
    operand_avals: Sequence[Any],
    result_avals: Sequence[Any],
    *,
    has_side_effect: bool,
    returns_token: bool = True,
    partitioned: bool = False,
    sharding: Any = None,
) -> tuple[Sequence[Any], Any, Any]:
    """jax._src.callback.emit_python_callback for flexnpu over a CPU plugin: the same checks
    and token handling, lowered to FlexNPU's handler instead of jaxlib's."""
    del returns_token, operand_avals  # the token is threaded whenever one is given, as on cpu
    from jax._src import config, core, dtypes
    from jax._src import ffi as jax_ffi
    from jax._src.interpreters import mlir
    from jax._src.sharding_impls import SdyArray, SdyArrayList

    if len(ctx.module_context.platforms) > 1:
        raise NotImplementedError("multi-platform lowering for python_callback")
    if partitioned and result_avals:
        raise ValueError("Partitioned callback not supported with return values.")

    def checked_callback(*args: Any) -> tuple[Any, ...]:
        # jaxlib's checks and messages (jax._src.callback.emit_python_callback).
        out_vals = callback(*args)
        if len(out_vals) != len(result_avals):
            raise RuntimeError(
                "Mismatched number of outputs from callback. "
                f"Expected: {len(result_avals)}, Actual: {len(out_vals)}"
            )
        out_vals = tuple(dtypes.canonicalize_value(np.asarray(a)) for a in out_vals)
        for i, (out_val, out_aval) in enumerate(zip(out_vals, result_avals, strict=True)):
            if out_val.shape != out_aval.shape:
                raise RuntimeError(
                    f"Incorrect output shape for return value #{i}: "
                    f"Expected: {out_aval.shape}, Actual: {out_val.shape}"
                )
            if out_val.dtype != out_aval.dtype:
                raise RuntimeError(
                    f"Incorrect output dtype for return value #{i}: "
                    f"Expected: {out_aval.dtype}, Actual: {out_val.dtype}"
                )
        return out_vals

    ensure_host_cpu_backend()
    registration = register(checked_callback)
    ctx.module_context.add_keepalive(registration)
    # Listed as JAX lists its own: JAX then never writes the program to its persistent cache
    # (the callback's id is only valid in this process), as on cpu.
    ctx.module_context.add_host_callback(checked_callback)
    if token:
        operands = [token, *operands]
        if (
            config.use_shardy_partitioner.value
            and isinstance(sharding, SdyArrayList)
            and len(ctx.avals_out) > 0
        ):
            # As jaxlib: the token gets a sharding of its own when there are outputs.
            sharding = SdyArrayList(
                (
                    SdyArray(
                        mesh_shape=(),
                        dim_shardings=(),
                        logical_device_ids=sharding.shardings[0].logical_device_ids,
                    ),
                    *sharding.shardings,
                )
            )
        ctx = dataclasses.replace(
            ctx,
            avals_in=[core.abstract_token, *ctx.avals_in],
            avals_out=[core.abstract_token, *ctx.avals_out],
        )
    target = TARGET_NAMES[1] if partitioned else TARGET_NAMES[0]
    result = jax_ffi.build_ffi_lowering_function(target, has_side_effect=has_side_effect)(
        ctx, *operands, **{CALLBACK_ID_ATTRIBUTE: np.uint64(registration.callback_id)}
    )
    if sharding is not None:
        _set_sharding(mlir, ctx.module_context, result, sharding)
    results = list(result.results)
    if token:
        token, *results = results
    return results, token, None
