"""flexnpu/lowering.py: the JAX hooks it relies on still exist (a JAX upgrade that removes one
fails here, by name), and its rule table behaves as documented."""

from __future__ import annotations

import importlib

import pytest

from flexnpu import lowering


@pytest.mark.parametrize(("module", "name"), lowering.HOOKS, ids=lambda v: str(v))
def test_hook_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def test_rule_lookup_reads_platform_specific_table_by_membership_and_index() -> None:
    # KindRules is a Mapping, not a dict: JAX must only use `in` and `[]` on the table entry.
    import inspect

    from jax._src.interpreters import mlir

    source = inspect.getsource(mlir._get_lowering_rules)
    assert "if primitive in _platform_specific_lowerings[p]:" in source
    assert "r = _platform_specific_lowerings[p][primitive]" in source
    assert inspect.getsource(mlir.register_lowering).count(
        "_platform_specific_lowerings[p][prim] = LoweringRuleEntry(rule, inline)"
    ) == 1


def test_backend_kind_from_platform_version() -> None:
    assert lowering.backend_kind("flexnpu 0.1.0 over cpu (cpu, PJRT C API 0.81)") == "cpu"
    assert lowering.backend_kind("flexnpu 0.1.0 over cuda (12.8; PJRT C API 0.81)") == "cuda"
    with pytest.raises(ValueError, match="not a FlexNPU platform_version: 'cpu'"):
        lowering.backend_kind("cpu")


def test_unknown_kind_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="no JAX lowering rules for physical platform 'tpu7'"):
        lowering.install_lowering_rules("tpu7")


def _entry(rule: object) -> object:
    from jax._src.interpreters import mlir

    return mlir.LoweringRuleEntry(rule, True)


def test_kind_rules_own_first_then_kind_live_and_wrapped() -> None:
    own_rule, kind_rule, later_rule = object(), (lambda ctx: "kind"), (lambda ctx: "later")
    kind_table = {"p_kind": _entry(kind_rule)}
    rules = lowering.KindRules({"p_own": _entry(own_rule)}, kind_table, "cuda")
    assert rules["p_own"].rule is own_rule
    assert rules["p_kind"].rule.__wrapped__ is kind_rule
    assert "p_later" not in rules
    kind_table["p_later"] = _entry(later_rule)  # registered for the kind after install
    assert "p_later" in rules and rules["p_later"].rule.__wrapped__ is later_rule
    rules["p_kind"] = _entry(own_rule)  # a rule registered for flexnpu itself wins
    assert rules["p_kind"].rule is own_rule and kind_table["p_kind"].rule is kind_rule
    assert sorted(rules) == ["p_kind", "p_later", "p_own"] and len(rules) == 3


class _FakeRuleContext:
    def __init__(self, module_context: object) -> None:
        self.module_context = module_context
        self.platforms = ("flexnpu",)
        self.tokens_out = None

    def replace(self, **changes: object) -> _FakeRuleContext:
        copy = _FakeRuleContext(self.module_context)
        copy.__dict__.update(changes)
        return copy

    def set_tokens_out(self, tokens: object) -> None:
        assert self.tokens_out is None
        self.tokens_out = tokens


def test_run_as_lowers_for_the_kind_and_hands_back_tokens() -> None:
    import jax
    from jax._src.interpreters import mlir

    module_context = mlir.ModuleContext(
        platforms=("flexnpu",), backend=None, axis_context=None, keepalives=[],
        channel_iterator=iter(()), host_callbacks=[], lowering_parameters=None,
    )
    seen = {}

    def rule(ctx: _FakeRuleContext, x: int, *, k: int) -> int:
        seen["platforms"] = tuple(ctx.module_context.platforms)
        seen["rule_platforms"] = ctx.platforms
        ctx.module_context.add_host_callback("cb")
        ctx.set_tokens_out("tokens")
        return x + k

    del jax
    ctx = _FakeRuleContext(module_context)
    assert lowering.run_as("cpu", rule)(ctx, 1, k=2) == 3
    assert seen == {"platforms": ("cpu",), "rule_platforms": None}
    assert module_context.host_callbacks == ["cb"]  # shared with the real module context
    assert tuple(module_context.platforms) == ("flexnpu",)  # the caller's is unchanged
    assert ctx.tokens_out == "tokens"


def test_install_for_cuda_kind_uses_cuda_rules_and_runs_callbacks_as_cuda() -> None:
    # No GPU here: install the cuda kind in a fresh interpreter and inspect the table.
    from _subprocess import run_python

    code = r"""
import jax
from jax._src.interpreters import mlir
from jax._src.lax import linalg
from jax._src import callback, debugging
from flexnpu import lowering
lowering.install_lowering_rules("cuda")
rules = mlir._platform_specific_lowerings["flexnpu"]
cuda = mlir._platform_specific_lowerings["cuda"]
assert isinstance(rules, lowering.KindRules) and rules.kind == "cuda"
assert rules[linalg.eigh_p].rule.__wrapped__ is cuda[linalg.eigh_p].rule
cpu = mlir._platform_specific_lowerings["cpu"]
assert rules[linalg.eigh_p].rule.__wrapped__ is not cpu[linalg.eigh_p].rule
generic = mlir._lowerings[callback.pure_callback_p].rule
assert rules[callback.pure_callback_p].rule.__wrapped__ is generic
assert rules[debugging.debug_print_p].rule.__wrapped__ is cuda[debugging.debug_print_p].rule
print("OK")
"""
    proc = run_python(code, {"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]


def test_host_callbacks_over_cpu_kind_lower_to_flexnpus_handler() -> None:
    # On flexnpu over cpu the callback is a call of FlexNPU's handler with the callback's id;
    # on cpu itself JAX's emit_python_callback is unchanged (jaxlib's handler).
    from _subprocess import run_python

    code = r"""
import jax, jax.numpy as jnp
from jax._src import callback
f = jax.jit(lambda x: jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((2,), x.dtype), x))
print("FLEXNPU", f.lower(jnp.ones(2, jnp.float32)).as_text())
on_cpu = jax.device_put(jnp.ones(2, jnp.float32), jax.devices("cpu")[0])
print("CPU", f.lower(on_cpu).as_text())
print("WRAPPED", callback.emit_python_callback.__wrapped__.__module__)
"""
    proc = run_python(code, {"JAX_PLATFORMS": "flexnpu,cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    flexnpu_text = proc.stdout.split("FLEXNPU", 1)[1].split("\nCPU", 1)[0]
    cpu_text = proc.stdout.split("\nCPU", 1)[1].split("\nWRAPPED", 1)[0]
    # jaxlib's target name (XLA's Shardy knows it), FlexNPU's attribute: the callback's id.
    assert "@xla_ffi_python_cpu_callback" in flexnpu_text and "callback_id = " in flexnpu_text
    assert "index = " not in flexnpu_text
    assert "@xla_ffi_python_cpu_callback" in cpu_text and "index = 0" in cpu_text
    assert "callback_id" not in cpu_text
    assert "WRAPPED jax._src.callback" in proc.stdout


def test_platform_dependent_takes_the_physical_kinds_branch(npu_devices: list) -> None:
    import jax
    import numpy as np
    from jax import lax

    def by_platform(x: object) -> object:
        return lax.platform_dependent(x, cpu=lambda v: v + 1, cuda=lambda v: v + 2,
                                      default=lambda v: v - 1)

    def names_flexnpu(x: object) -> object:
        return lax.platform_dependent(x, flexnpu=lambda v: v * 10, cpu=lambda v: v + 1,
                                      default=lambda v: v - 1)

    x = jax.device_put(np.float32(1.0), npu_devices[0])
    assert float(jax.jit(by_platform)(x)) == 2.0  # cpu's branch, as on the physical platform
    assert float(by_platform(x)) == 2.0  # eagerly too
    assert float(jax.jit(names_flexnpu)(x)) == 10.0  # a branch for flexnpu itself wins
    assert lowering._branches_with_flexnpu((("cpu",), ("cuda",), None), "cpu") == (
        ("cpu", "flexnpu"), ("cuda",), None)
