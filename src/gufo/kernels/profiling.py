"""Kernel calls inside torch.profiler ranges named by stage, for `gufo profile`.

While `ranges(options)` is active (the engine builds its model in it when `RunOptions.profile` is set),
`registry.find` hands out copies of the kernels whose `apply` runs inside
`torch.profiler.record_function(name)`. The name says the stage, the kernel and the weight bytes the
call reads: `linear.Q4_K|cpu-int8-avx2|1769472` (see `KernelRange`). Outside it, or with
`RunOptions.profile` None, the model holds the kernels themselves: no wrapper, nothing to pay.

Stages are named from the registry's ops (`gufo.options.STAGE_OF_OP`), a linear by its block format.
The fused CPU decode layer runs a whole layer in one C call, so its stage is `decode_layer`: its
products, norms and attention are not timed apart (its bytes are those of the layer's weights).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import record_function

from gufo.kernels.contracts import DECODE_LAYER, EXPERT_LINEAR, LINEAR, Kernel, LayerSpec, Op
from gufo.options import STAGE_OF_OP, ProfileOptions

# the engine's ranges around its passes (Engine.prefill; Engine.decode and decode_tokens)
PREFILL_RANGE, DECODE_RANGE = "gufo.prefill", "gufo.decode"
PHASE_OF_RANGE = {PREFILL_RANGE: "prefill", DECODE_RANGE: "decode"}

_ACTIVE: contextvars.ContextVar[ProfileOptions | None] = contextvars.ContextVar("profile", default=None)


@dataclasses.dataclass(frozen=True)
class KernelRange:
    """What a kernel call's range name says."""

    stage: str
    kernel: str
    bytes: int  # weight bytes the call reads (0: none counted)

    SEPARATOR = "|"

    @property
    def name(self) -> str:
        return self.SEPARATOR.join((self.stage, self.kernel, str(self.bytes)))

    @classmethod
    def parse(cls, name: str) -> KernelRange | None:
        """The range of a kernel call, or None for any other event name."""
        parts = name.split(cls.SEPARATOR)
        if len(parts) != 3 or parts[0].split(".")[0] not in STAGE_OF_OP.values() or not parts[2].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]))


@contextlib.contextmanager
def ranges(options: ProfileOptions | None) -> Iterator[None]:
    """Within it, `registry.find` wraps the kernels it hands out (None: it does not)."""
    token = _ACTIVE.set(options)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> ProfileOptions | None:
    return _ACTIVE.get()


def phase_range(options: ProfileOptions | None, name: str) -> contextlib.AbstractContextManager:
    """The engine's range around a pass, when profiling."""
    return contextlib.nullcontext() if options is None else record_function(name)


def tensor_bytes(value: Any, seen: set[int] | None = None) -> int:
    """Bytes of the torch tensors in a prepared weight (a tensor, or dataclasses and tuples of them),
    each storage once; host arrays (a file's map) are not what a kernel reads, so they do not count."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        if value.data_ptr() in seen:
            return 0
        seen.add(value.data_ptr())
        return value.numel() * value.element_size()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(tensor_bytes(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    if isinstance(value, tuple | list):
        return sum(tensor_bytes(item, seen) for item in value)
    return 0


def layer_bytes(spec: LayerSpec) -> int:
    """The weight bytes of a layer's products (the norm vectors are negligible)."""
    products = [*spec.qkv.parts, spec.o, *spec.gate_up.parts, spec.down]
    return sum(tensor_bytes(product.weight) for product in products)


def stage_of(op: Op[Any], qtype: Any) -> str:
    stage = STAGE_OF_OP[op.name]
    return f"{stage}.{qtype.name}" if op in (LINEAR, EXPERT_LINEAR) and qtype is not None else stage


def ranged(kernel: Kernel, op: Op[Any], qtype: Any, options: ProfileOptions) -> Kernel:
    """A copy of `kernel` (same class, so checks of its type still hold) whose calls (`apply`; an expert
    kernel's `gathered` and `grouped`) run inside its range; the decode layer's `prepare` also notes the
    bytes of each layer of the plans it makes."""
    stage = stage_of(op, qtype)
    slow = options.slow_seconds if options.slow_stage in (stage, stage.split(".")[0]) else 0.0
    wrapped = copy.copy(kernel)
    if op is LINEAR:
        name_of = _weight_names(stage, kernel.name)
    elif op is DECODE_LAYER:
        name_of, prepare = _layer_names(stage, kernel)
        object.__setattr__(wrapped, "prepare", prepare)
    else:
        name_of = _fixed_name(KernelRange(stage, kernel.name, 0).name)

    def in_range(call: Callable[..., Any]) -> Callable[..., Any]:
        def call_in_range(*args: Any, **kwargs: Any) -> Any:
            with record_function(name_of(*args)):
                if slow:
                    time.sleep(slow)
                return call(*args, **kwargs)

        return call_in_range

    if op is EXPERT_LINEAR:
        experts: Any = kernel
        object.__setattr__(wrapped, "gathered", in_range(experts.gathered))
        object.__setattr__(wrapped, "grouped", in_range(experts.grouped))
    else:
        object.__setattr__(wrapped, "apply", in_range(kernel.apply))
    return wrapped


def _fixed_name(name: str) -> Callable[..., str]:
    def name_of(*args: Any) -> str:
        return name

    return name_of


def _weight_names(stage: str, kernel: str) -> Callable[..., str]:
    """A linear call's range name, from its weight (args: x, weight), made once per weight."""
    names: dict[int, tuple[Any, str]] = {}  # id(weight) -> (the weight, kept so its id stays its own; name)

    def name_of(x: Any, weight: Any) -> str:
        found = names.get(id(weight))
        if found is None:
            found = names[id(weight)] = (weight, KernelRange(stage, kernel, tensor_bytes(weight)).name)
        return found[1]

    return name_of


def _layer_names(stage: str, kernel: Any) -> tuple[Callable[..., str], Callable[..., Any]]:
    """A decode layer call's range name (args: plan, index, ...), and the `prepare` that makes them."""
    names: dict[int, tuple[Any, list[str]]] = {}  # id(plan) -> (the plan, each layer's range name)
    prepare = kernel.prepare

    def prepare_noting(specs: list[LayerSpec]) -> Any:
        plan = prepare(specs)
        if plan is not None:
            names[id(plan)] = (plan, [KernelRange(stage, kernel.name, layer_bytes(s)).name for s in specs])
        return plan

    def name_of(plan: Any, index: int, *rest: Any) -> str:
        return names[id(plan)][1][index]

    return name_of, prepare_noting
