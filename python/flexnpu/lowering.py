"""Lowering rules and FFI targets by physical backend kind: the one place that makes JAX lower
for `flexnpu` as it lowers for the physical backend's platform.

JAX picks lowering rules by platform name, and "flexnpu" has none of its own: LAPACK/FFT
custom calls, `jax.debug.print` and Python callbacks are registered for "cpu" (or "cuda").
`install(kind)` makes flexnpu use the rules of `kind`, the platform the physical backend
reports (`flexnpu X over <kind> (...)` in the client's platform_version):

* `mlir._platform_specific_lowerings["flexnpu"]` becomes a view: flexnpu's own rules first,
  then `kind`'s, live (rules registered for `kind` later are seen too). Each rule of `kind`
  runs with the module context's platforms set to `(kind,)`, as it would on `kind` itself.
* The callback rules (pure_callback, io_callback, buffer_callback, debug.callback/print) check
  the platform name themselves; flexnpu gets wrappers that run them as `kind`. Over a CPU
  plugin jaxlib's callback handler cannot run, so JAX's `emit_python_callback` is wrapped:
  while lowering for flexnpu over cpu it emits a call of FlexNPU's own FFI handler instead
  (flexnpu/host_callbacks.py); elsewhere it is JAX's, unchanged.
* `lax.platform_dependent` (platform_index and cond's branch pruning) takes `kind`'s branch
  on flexnpu, unless the program has a branch for flexnpu itself.
* FFI targets: `register_custom_call_handler("flexnpu", ...)` sends targets registered for
  "flexnpu" into FlexNPU's FFI registry (the plugin forwards them to the physical backend).
  For the cpu kind, jaxlib's own CPU targets (LAPACK, sparse, the Python-callback handlers),
  compiled into jaxlib and registered only with jaxlib's in-process XLA, are mirrored into
  it too, now and when registered later. A backend whose XLA FFI minor is older than a
  kernel's gets it through FlexNPU's FFI version adapter (runtime/ffi.h; `ffi_routes()` says
  which way each went); if LAPACK still cannot run there, linear algebra keeps JAX's
  platform-generic rules. A CUDA backend needs no mirror: JAX's CUDA plugin registers its
  targets into the same CUDA plugin library FlexNPU loads.

The JAX hooks used are listed in HOOKS; tests/python/test_lowering_hooks.py pins each, so a
JAX upgrade that removes one fails loudly rather than lowering silently differently.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flexnpu._native_loader import native, plugin_library

PLATFORM_NAME = "flexnpu"
logger = logging.getLogger(__name__)

# (module, attribute) of every JAX / jaxlib internal this module relies on.
HOOKS: tuple[tuple[str, str], ...] = (
    ("jax._src.interpreters.mlir", "_platform_specific_lowerings"),
    ("jax._src.interpreters.mlir", "_lowerings"),
    ("jax._src.interpreters.mlir", "LoweringRuleEntry"),
    ("jax._src.interpreters.mlir", "ModuleContext"),
    ("jax._src.interpreters.mlir", "LoweringRuleContext"),
    ("jax._src.callback", "pure_callback_p"),
    ("jax._src.callback", "io_callback_p"),
    ("jax._src.callback", "emit_python_callback"),
    ("jax._src.buffer_callback", "buffer_callback_p"),
    ("jax._src.debugging", "debug_callback_p"),
    ("jax._src.debugging", "debug_print_p"),
    ("jax._src.ffi", "build_ffi_lowering_function"),
    ("jax._src.interpreters.mlir", "set_sharding"),
    ("jax._src.xla_bridge", "register_backend_factory"),
    ("jax._src.xla_bridge", "expand_platform_alias"),
    ("jaxlib.xla_client", "load_pjrt_plugin_dynamically"),
    ("jax._src.xla_bridge", "_backends"),
    ("jax._src.xla_bridge", "_backend_lock"),
    ("jax._src.xla_bridge", "_init_backend"),
    ("jax._src.sharding_impls", "SdyArray"),
    ("jax._src.sharding_impls", "SdyArrayList"),
    ("jaxlib.xla_client", "register_custom_call_handler"),
    ("jaxlib.xla_client", "register_custom_type_handler"),
    ("jaxlib.xla_client", "_custom_callback_handler"),
    ("jaxlib.xla_client", "_custom_callback_lock"),
    ("jaxlib.xla_client", "xla_platform_names"),
    ("jaxlib._jax", "custom_call_targets"),
    ("jaxlib._jax", "register_custom_call_target"),
    ("jax._src.tpu.linalg.eigh", "_eigh_tpu_lowering"),
    ("jax._src.lax.control_flow.conditionals", "platform_index_p"),
    ("jax._src.lax.control_flow.conditionals", "cond_p"),
)

# Physical platforms (as PJRT clients name them) whose JAX lowering rules flexnpu can use.
SUPPORTED_KINDS = ("cpu", "cuda", "rocm")
# The XLA platform name JAX's custom-call registry files a kind's targets under.
_XLA_PLATFORM = {"cpu": "Host", "cuda": "CUDA", "rocm": "ROCM"}
# The platform-generic rules that decide on the platform name themselves.
_CALLBACK_PRIMITIVES = (
    ("jax._src.callback", "pure_callback_p"),
    ("jax._src.callback", "io_callback_p"),
    ("jax._src.buffer_callback", "buffer_callback_p"),
)
# Callback primitives with platform-specific rules (run as the kind, like the rest of them).
_KIND_CALLBACK_PRIMITIVES = (
    ("jax._src.debugging", "debug_callback_p"),
    ("jax._src.debugging", "debug_print_p"),
)

# jaxlib 0.10.2's LAPACK kernels speak XLA FFI 0.3; xla-cpu-pjrt 0.0.1 implements FFI 0.2 and
# drops them at registration, lammps-jax-pjrt-cpu implements 0.4. FlexNPU's FFI version adapter
# (runtime/ffi.h) registers them through a trampoline declaring the backend's version where the
# ABI allows. Whether one LAPACK kernel runs on every backend tells whether they all do (one
# jaxlib, one FFI version); if not, linear algebra keeps JAX's platform-generic rules.
LAPACK_PROBE_TARGET = "lapack_dgetrf_ffi"
_LINALG_MODULE = "jax._src.lax.linalg"

_lock = threading.Lock()
_installed_kind: str | None = None
# The platform name FlexNPU's client presents: "flexnpu", or (FLEXNPU_PLATFORM_NAME) the
# physical platform's, whose rules JAX then uses directly.
_presented_as: str = PLATFORM_NAME


def backend_kind(platform_version: str) -> str:
    """The physical platform in FlexNPU's platform_version ('flexnpu 0.1.0 over cpu (...)')."""
    marker = " over "
    at = platform_version.find(marker)
    if at < 0:
        raise ValueError(f"not a FlexNPU platform_version: {platform_version!r}")
    return platform_version[at + len(marker) :].split(" ", 1)[0].split("(", 1)[0].lower()


def installed_kind() -> str | None:
    """The kind whose rules flexnpu uses, or None before `install`."""
    return _installed_kind


def _module_context_as(kind: str) -> type:
    from jax._src.interpreters import mlir

    class KindModuleContext(mlir.ModuleContext):
        """A module context lowering for `kind` while compiling for the flexnpu client."""

        __slots__ = ()
        flexnpu_kind = kind

        def get_backend(self, optional: bool = False) -> Any:
            # The kind's rules only check that the backend matches the lowering platform.
            return self.backend if self.backend is not None else super().get_backend(optional)

    KindModuleContext.__name__ = f"ModuleContextAs_{kind}"
    return KindModuleContext


_context_classes: dict[str, type] = {}


def _as_kind(module_context: Any, kind: str) -> Any:
    if tuple(module_context.platforms) == (kind,):
        return module_context
    cls = _context_classes.get(kind)
    if cls is None:
        cls = _context_classes[kind] = _module_context_as(kind)
    copy = cls.__new__(cls)
    for field in dataclasses.fields(module_context):
        setattr(copy, field.name, getattr(module_context, field.name))
    copy.platforms = (kind,)
    return copy


def run_as(kind: str, rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule` run with the module context's platforms set to `(kind,)`."""

    def rule_as_kind(ctx: Any, *args: Any, **params: Any) -> Any:
        inner = ctx.replace(module_context=_as_kind(ctx.module_context, kind), platforms=None)
        out = rule(inner, *args, **params)
        if inner.tokens_out is not None:  # ordered effects: the caller reads its own ctx
            ctx.set_tokens_out(inner.tokens_out)
        return out

    rule_as_kind.__name__ = f"{getattr(rule, '__name__', 'rule')}_as_{kind}"
    rule_as_kind.__wrapped__ = rule  # type: ignore[attr-defined]
    return rule_as_kind


class KindRules(collections.abc.MutableMapping):  # type: ignore[type-arg]
    """flexnpu's platform-specific rules: its own first, then `kind`'s run as `kind` (live)."""

    def __init__(self, own: dict[Any, Any], kind_rules: dict[Any, Any], kind: str) -> None:
        self.own = own
        self.kind_rules = kind_rules
        self.kind = kind
        self._wrapped: dict[Any, tuple[Any, Any]] = {}

    def __getitem__(self, primitive: Any) -> Any:
        if primitive in self.own:
            return self.own[primitive]
        entry = self.kind_rules[primitive]
        cached = self._wrapped.get(primitive)
        if cached is None or cached[0] is not entry:
            from jax._src.interpreters import mlir

            wrapped = mlir.LoweringRuleEntry(run_as(self.kind, entry.rule), entry.inline)
            cached = self._wrapped[primitive] = (entry, wrapped)
        return cached[1]

    def __contains__(self, primitive: object) -> bool:
        return primitive in self.own or primitive in self.kind_rules

    def __setitem__(self, primitive: Any, entry: Any) -> None:
        self.own[primitive] = entry

    def __delitem__(self, primitive: Any) -> None:
        del self.own[primitive]

    def __iter__(self) -> Iterator[Any]:
        yield from self.own
        yield from (p for p in self.kind_rules if p not in self.own)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _linalg_primitives() -> list[Any]:
    import jax._src.lax.linalg as linalg
    from jax._src import core

    return [v for v in vars(linalg).values() if isinstance(v, core.Primitive)]


_LAPACK_DTYPES = ("float32", "float64", "complex64", "complex128")


def _lapack_dtypes_only(rule: Callable[..., Any]) -> Callable[..., Any]:
    """`rule`, refusing the floating dtypes LAPACK lacks as jaxlib's cpu rules do."""

    def checked(ctx: Any, *args: Any, **params: Any) -> Any:
        import numpy as np

        for aval in ctx.avals_in:
            dtype = getattr(aval, "dtype", None)
            if (
                dtype is not None
                and np.issubdtype(dtype, np.inexact)
                and str(dtype) not in _LAPACK_DTYPES
            ):
                raise NotImplementedError(f"Unsupported dtype {dtype}.")
        return rule(ctx, *args, **params)

    checked.__wrapped__ = rule  # type: ignore[attr-defined]
    return checked


def _generic_linalg_rules() -> dict[Any, Any]:
    """Linear algebra without LAPACK: JAX's platform-generic rules (plain HLO), and its QDWH
    eigh (pure JAX, the TPU's default algorithm; the rule reads only its `algorithm`
    parameter) for eigh, which svd builds on; dtypes refused as on cpu."""
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg
    from jax._src.tpu.linalg import eigh as qdwh_eigh

    rules = {p: mlir._lowerings[p] for p in _linalg_primitives() if p in mlir._lowerings}
    rules[linalg.eigh_p] = mlir.LoweringRuleEntry(qdwh_eigh._eigh_tpu_lowering, False)
    return {
        p: mlir.LoweringRuleEntry(_lapack_dtypes_only(e.rule), e.inline) for p, e in rules.items()
    }


def install_lowering_rules(kind: str, jaxlib_kernels: bool = True) -> None:
    """Makes JAX lower for flexnpu with the rules it registers for platform `kind`;
    `jaxlib_kernels` False (a CPU backend whose FFI cannot run them): linear algebra with a
    platform-generic rule keeps it."""
    import importlib

    from jax._src.interpreters import mlir

    if kind not in SUPPORTED_KINDS:
        raise ValueError(
            f"flexnpu: no JAX lowering rules for physical platform {kind!r} "
            f"(supported: {', '.join(SUPPORTED_KINDS)})"
        )
    table = mlir._platform_specific_lowerings
    current = table.get(PLATFORM_NAME)
    if isinstance(current, KindRules):
        if current.kind == kind:
            return
        own = current.own
    else:
        own = dict(current or {})
    if kind == "cpu" and not jaxlib_kernels:
        for primitive, entry in _generic_linalg_rules().items():
            own.setdefault(primitive, entry)
    rules = KindRules(own, table[kind], kind)
    for module_name, name in _CALLBACK_PRIMITIVES + _KIND_CALLBACK_PRIMITIVES:
        primitive = getattr(importlib.import_module(module_name), name)
        base = table[kind].get(primitive) or mlir._lowerings.get(primitive)
        if base is None or primitive in own:
            continue
        own[primitive] = mlir.LoweringRuleEntry(run_as(kind, base.rule), base.inline)
    for primitive, entry in _platform_dependent_rules(kind, table[kind]).items():
        own.setdefault(primitive, entry)
    table[PLATFORM_NAME] = rules
    if kind == "cpu":
        _route_host_callbacks_over_cpu()


def _branches_with_flexnpu(branches_platforms: Any, kind: str) -> Any:
    """`branches_platforms` with flexnpu added to `kind`'s branch, unless one names flexnpu."""
    named = [b for b in branches_platforms if b is not None]
    if any(PLATFORM_NAME in b for b in named) or not any(kind in b for b in named):
        return branches_platforms
    return tuple(
        b if b is None or kind not in b else (*b, PLATFORM_NAME) for b in branches_platforms
    )


def _platform_dependent_rules(kind: str, table: dict[Any, Any]) -> dict[Any, Any]:
    """lax.platform_dependent picks its branch by the lowering platform (platform_index, then
    cond prunes branches by it): on flexnpu the branch of `kind`, unless the program names
    flexnpu itself."""
    from jax._src.interpreters import mlir
    from jax._src.lax.control_flow import conditionals

    def with_flexnpu(rule: Callable[..., Any], param: str) -> Callable[..., Any]:
        def rule_for_flexnpu(ctx: Any, *args: Any, **params: Any) -> Any:
            if params.get(param) is not None:
                params[param] = _branches_with_flexnpu(params[param], kind)
            return rule(ctx, *args, **params)

        rule_for_flexnpu.__wrapped__ = rule  # type: ignore[attr-defined]
        return rule_for_flexnpu

    rules = {}
    for primitive, param in (
        (conditionals.platform_index_p, "platforms"),
        (conditionals.cond_p, "branches_platforms"),
    ):
        base = table.get(primitive) or mlir._lowerings[primitive]
        rules[primitive] = mlir.LoweringRuleEntry(with_flexnpu(base.rule, param), base.inline)
    return rules


def lowers_for_flexnpu_over_cpu(module_context: Any) -> bool:
    """Whether `module_context` is a kind rule's view of a flexnpu module over a CPU plugin, or
    a cpu module while FlexNPU presents itself as cpu (JAX's cpu backend is FlexNPU's then)."""
    if getattr(type(module_context), "flexnpu_kind", None) == "cpu":
        return True
    return _presented_as == "cpu" and tuple(getattr(module_context, "platforms", ())) == ("cpu",)


def _route_host_callbacks_over_cpu() -> None:
    """JAX's emit_python_callback, except while lowering for flexnpu over cpu, where jaxlib's
    handler cannot run: there the call goes to FlexNPU's (flexnpu/host_callbacks.py)."""
    from jax._src import callback

    from flexnpu import host_callbacks

    jax_emit = callback.emit_python_callback
    if getattr(jax_emit, "_flexnpu_route", False):
        return

    def emit_python_callback(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        if lowers_for_flexnpu_over_cpu(ctx.module_context):
            host_callbacks.install()
            return host_callbacks.emit(ctx, *args, **kwargs)
        return jax_emit(ctx, *args, **kwargs)

    emit_python_callback._flexnpu_route = True  # type: ignore[attr-defined]
    emit_python_callback.__wrapped__ = jax_emit  # type: ignore[attr-defined]
    callback.emit_python_callback = emit_python_callback


# ---- FFI targets ------------------------------------------------------------------------


def _capsule_pointer(capsule: Any) -> int:
    pointer = native("capsule_pointer", "the plugin entry points").capsule_pointer(capsule)
    if not pointer:
        raise ValueError("the FFI handler capsule holds a null pointer")
    return int(pointer)


def _execute_handler(name: str, fn: Any) -> int:
    if isinstance(fn, dict):
        unsupported = sorted(stage for stage in fn if stage != "execute")
        if unsupported:
            raise NotImplementedError(
                f"FFI target {name!r} on flexnpu: only the 'execute' stage is forwarded to the "
                f"physical backend (PJRT FFI register_handler), not {', '.join(unsupported)}"
            )
        if "execute" not in fn:
            raise ValueError(f"FFI target {name!r}: no 'execute' stage in {sorted(fn)}")
        fn = fn["execute"]
    return _capsule_pointer(fn)


def register_target(name: str, fn: Any, platform: str, api_version: int, traits: Any = 0) -> None:
    """Registers FFI target `name` with FlexNPU (which forwards it to the physical backend).

    `platform` "flexnpu" means the physical backend's own platform; the signature is jaxlib's
    CustomCallHandler, so this is what `jax.ffi.register_ffi_target(..., platform="flexnpu")`
    ends in.
    """
    handler = _execute_handler(name, fn)
    error = plugin_library().register_ffi_handler(
        name, platform, int(api_version), handler, int(traits)
    )
    if error is not None:
        raise RuntimeError(f"flexnpu: registering FFI target {name!r}: {error}")


def register_type(type_name: str, registration: Any) -> None:
    """Registers FFI type `type_name` with FlexNPU: `registration` is jax.ffi's
    TypeRegistration ({"type_id": capsule of an XLA_FFI_TypeId, "type_info": capsule}) or a
    bare type-id capsule. The id the backend assigns is written back into the capsule."""
    if isinstance(registration, dict):
        type_id, type_info = registration["type_id"], registration.get("type_info")
    else:
        type_id, type_info = registration, None
    pointer = _capsule_pointer(type_id)
    info = None if type_info is None else _capsule_pointer(type_info)
    error = plugin_library().register_ffi_type(type_name, pointer, info)
    if error is not None:
        raise RuntimeError(f"flexnpu: registering FFI type {type_name!r}: {error}")


def target_runs_everywhere(name: str) -> bool:
    """Whether FFI target `name` reaches every physical backend attached so far in a form it
    runs (directly, or through FlexNPU's FFI version adapter)."""
    return bool(plugin_library().ffi_target_runs_everywhere(name))


@dataclasses.dataclass(frozen=True)
class FfiRoute:
    """How one FFI target reached one physical backend: 'direct', 'adapted' (FlexNPU's FFI
    version adapter: the handler is newer than the backend's XLA FFI) or 'too_new' (newer, and
    the adapter does not know the ABI gap; the backend drops it)."""

    target: str
    route: str
    handler_version: str
    backend_version: str
    backend: str


def ffi_routes() -> list[FfiRoute]:
    """Every FFI registration's route so far, one per (target, backend)."""
    text = plugin_library().ffi_routes()
    return [FfiRoute(*line.split("\t")) for line in text.splitlines() if line]


def _mirror(name: str, fn: Any, api_version: int, traits: Any) -> None:
    from flexnpu import host_callbacks

    if name in host_callbacks.TARGET_NAMES:
        return  # FlexNPU's own handler takes these names in the backend (host_callbacks.py)
    try:
        register_target(name, fn, PLATFORM_NAME, api_version, traits)
    except (NotImplementedError, RuntimeError, ValueError) as error:
        # One target the backend cannot take must not stop the others; using it on flexnpu
        # fails at compile with the backend's "no handler" error.
        logger.warning("%s", error)


def _mirror_cpu_targets() -> None:
    """jaxlib's CPU targets (now and later ones) into FlexNPU's FFI registry."""
    from jaxlib import _jax, xla_client

    host = xla_client.xla_platform_names["cpu"]
    # Flush the CPU targets JAX registered before any CPU client existed (LAPACK, sparse)
    # into jaxlib's registry: what creating a CPU client does; a no-op once done.
    xla_client.register_custom_call_handler("cpu", _jax.register_custom_call_target)
    with xla_client._custom_callback_lock:
        jaxlib_handler = xla_client._custom_callback_handler[host]
        if not getattr(jaxlib_handler, "_flexnpu_mirror", False):

            def host_and_flexnpu(
                name: str, fn: Any, platform: str, api_version: int, traits: Any = 0
            ) -> None:
                jaxlib_handler(name, fn, platform, api_version, traits)
                if api_version == 1:
                    _mirror(name, fn, api_version, traits)

            host_and_flexnpu._flexnpu_mirror = True  # type: ignore[attr-defined]
            xla_client._custom_callback_handler[host] = host_and_flexnpu
    for name, stages in _jax.custom_call_targets(host).items():
        _mirror(name, stages, 1, 0)


def install_ffi(kind: str) -> None:
    """Routes FFI registrations for flexnpu (and, for the cpu kind, jaxlib's CPU targets)."""
    from jaxlib import xla_client

    xla_client.register_custom_call_handler(PLATFORM_NAME, register_target)
    xla_client.register_custom_type_handler(PLATFORM_NAME, register_type)
    if kind == "cpu":
        _mirror_cpu_targets()


def install(
    kind: str, jaxlib_kernels: bool | None = None, presented_as: str = PLATFORM_NAME
) -> None:
    """Lowering rules and FFI targets of physical platform `kind` for flexnpu (idempotent);
    `jaxlib_kernels`: see install_lowering_rules (None: whether jaxlib's LAPACK kernels, once
    forwarded, run on every backend); `presented_as`: the client's platform name."""
    global _installed_kind, _presented_as
    if presented_as not in (PLATFORM_NAME, kind):
        raise ValueError(f"flexnpu presents platform {presented_as!r} over {kind!r}")
    with _lock:
        _presented_as = presented_as
        if _installed_kind == kind:
            return
        if _installed_kind is not None:
            raise RuntimeError(
                f"flexnpu already lowers as {_installed_kind!r}; a second client over "
                f"{kind!r} in the same process is not supported"
            )
        install_ffi(kind)
        if jaxlib_kernels is None:
            jaxlib_kernels = kind != "cpu" or target_runs_everywhere(LAPACK_PROBE_TARGET)
        install_lowering_rules(kind, jaxlib_kernels)
        if presented_as == "cpu" and not jaxlib_kernels:
            # JAX lowers "cpu" modules with jaxlib's rules, and jaxlib's cpu backend is
            # FlexNPU's in this mode: its linear algebra needs the generic rules too.
            from jax._src.interpreters import mlir

            mlir._platform_specific_lowerings["cpu"].update(_generic_linalg_rules())
        _installed_kind = kind
