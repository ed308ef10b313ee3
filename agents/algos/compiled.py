"""What lets one update function run eagerly or through ``torch.compile``: the compiled-or-eager wrapper, the
optimizer step both modes share, and freezing a network's parameters in eager mode.

An agent's update (e.g. ``her_agents.algos.td3.TD3Agent.train_step``) is written once; ``agent.compile``
only decides whether it is called directly or through ``CompiledOrEager``. Inside it every optimizer step
is ``adam_step``: the loss's gradients by ``torch.autograd.grad``, then ``torch.optim.Adam``'s step.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch._dynamo.exc import FailOnRecompileLimitHit

__all__ = ["CompiledOrEager", "adam_step", "freeze", "init_adam_state", "make_adam", "own_code", "reset_adam_state"]


def make_adam(params: Iterable[nn.Parameter] | Iterable[torch.Tensor], lr: float,
              weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam with the fused kernel where available (CPU and CUDA in recent torch), else foreach; with
    ``weight_decay`` > 0 its decoupled form, AdamW (Loshchilov & Hutter 2019, Algorithm 2:
    ``p <- p * (1 - lr * weight_decay)`` before the Adam step, ``torch.optim.AdamW``'s convention)."""
    params = list(params)
    decoupled = bool(weight_decay)  # False at 0: the group of plain Adam, as before
    try:
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, decoupled_weight_decay=decoupled,
                                fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, decoupled_weight_decay=decoupled,
                                foreach=True)


def init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s state (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter) as
    ``torch.optim.Adam`` does at its first step, where it does not exist yet: a compiled update takes the state
    as an input (created inside the graph it would be a graph output). ``step`` is float32 on the parameter's
    device for a fused or capturable optimizer, on the CPU otherwise, as torch puts it."""
    if optimizer.state:  # torch creates the state of all parameters at once
        return
    for group in optimizer.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            if not optimizer.state[p]:
                optimizer.state[p].update(
                    step=torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                    exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                    exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))


def reset_adam_state(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Restart the Adam state of those of ``params`` that ``optimizer`` holds state for: ``step``, ``exp_avg``
    and ``exp_avg_sq`` set to zero in place (the tensors a compiled update reads stay the same), so their next
    step is a first step (``agent.reset_every``). Parameters without state, or of another optimizer, are left
    alone."""
    with torch.no_grad():
        for p in params:
            state = optimizer.state.get(p)
            if state:
                for key in ("step", "exp_avg", "exp_avg_sq"):
                    state[key].zero_()


def adam_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, in_graph: bool = True,
              same_steps: bool = True) -> None:
    """One step of ``optimizer`` (a one-group ``torch.optim.Adam``) on ``d loss / d params``.

    Eagerly, and in a compiled update with ``in_graph=False``, the gradients go to ``p.grad`` and
    ``optimizer.step()`` runs (its hooks too: data-parallel training averages the gradients in one), outside the
    graph. Compiled with ``in_graph`` (the default), the same step (Kingma & Ba 2015, Algorithm 1, in
    ``torch.optim.Adam``'s form: ``m <- lerp(m, g, 1 - beta1)``, ``v <- beta2 v + (1 - beta2) g^2``,
    ``p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``; with a ``weight_decay`` in the
    group and ``decoupled_weight_decay``, AdamW's ``p <- p * (1 - lr * weight_decay)`` first, Loshchilov & Hutter
    2019, Algorithm 2; without ``decoupled_weight_decay``, ``g <- g + weight_decay * p``) is written here on the
    optimizer's own state (made by ``init_adam_state``), so that the whole update is one graph and checkpoints
    are the same in both modes. Written by hand because torch's step breaks the graph: ``Optimizer.step`` breaks
    it twice by design (its ``_use_grad`` wrapper), Dynamo does not trace the fused kernel, and the functional
    ``torch.optim.adam.adam`` left the update in several graphs. Measured (an A/B of a 28-256-256-1
    LayerNorm MLP regression, batch 256, compiled, one thread, the 2-core shared Intel Xeon of the development
    machine, two readings): 26 and 35 ms a step with this step in the graph against 48 and 61 ms with
    ``optimizer.step()`` (foreach) in it.

    ``same_steps``: every parameter of the group has taken the same number of steps, so the bias corrections are
    computed once from the first parameter's ``step``; False (after a reset of some parameters' state,
    ``GoalConditionedAgentBase.reset_networks``) computes them per parameter. Eager steps are per parameter
    anyway.
    """
    group = optimizer.param_groups[0]
    params = group["params"]
    grads = torch.autograd.grad(loss, params)
    if not (in_graph and torch.compiler.is_compiling()):
        _optimizer_step(optimizer, params, grads)
        return
    beta1, beta2 = group["betas"]
    lr, weight_decay = group["lr"], group["weight_decay"]
    states = [optimizer.state[p] for p in params]
    with torch.no_grad():
        if weight_decay and group.get("decoupled_weight_decay"):
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)
        elif weight_decay:
            grads = tuple(torch._foreach_add(grads, params, alpha=weight_decay))
        torch._foreach_add_([st["step"] for st in states], 1.0)
        step = states[0]["step"]  # every parameter of the group takes the same steps: the scalars once
        step_size = lr / (1.0 - beta1**step)
        bias_correction2_sqrt = (1.0 - beta2**step).sqrt()
        for p, g, state in zip(params, grads, states):
            if not same_steps:
                step_size = lr / (1.0 - beta1 ** state["step"])
                bias_correction2_sqrt = (1.0 - beta2 ** state["step"]).sqrt()
            state["exp_avg"].lerp_(g, 1.0 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            p.sub_(step_size * state["exp_avg"] / (state["exp_avg_sq"].sqrt() / bias_correction2_sqrt + group["eps"]))


@torch.compiler.disable
def _optimizer_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                    grads: tuple[torch.Tensor, ...]) -> None:
    for p, g in zip(params, grads):
        # torch's fused Adam reads a gradient as dense memory: an expanded one (stride 0, e.g. the gradient of
        # c * p.sum()) would be read past its one element. backward() makes it dense; a .grad set by hand must
        p.grad = g if g.is_contiguous() else g.contiguous()
    optimizer.step()


def freeze(params: list[torch.Tensor], frozen: bool) -> None:
    """``requires_grad`` off (``frozen``) or back on for ``params``, eagerly: a loss computed while they are frozen
    (an actor loss through the critic) builds no graph towards them, and its backward skips their gradients. A
    no-op while compiling: the compiled graph drops the gradients nobody asks for by itself."""
    if torch.compiler.is_compiling():
        return
    for p in params:
        p.requires_grad_(not frozen)


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a function or a bound method) with a copy of its code object: the same behaviour, globals, defaults
    and closure, but a code object of its own, hence a Dynamo cache of its own (``torch.compile`` keeps the compiled
    variants, their guards and their recompile count on the code object) held by the returned function. Any other
    callable is returned as is."""
    bound = fn.__self__ if isinstance(fn, types.MethodType) else None
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if not isinstance(func, types.FunctionType):
        return fn
    copy = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = func.__kwdefaults__, func.__qualname__, func.__module__
    copy.__doc__, copy.__annotations__ = func.__doc__, func.__annotations__
    copy.__dict__.update(func.__dict__)
    return copy if bound is None else types.MethodType(copy, bound)


class CompiledOrEager:
    """``torch.compile(fn)``, falling back to ``fn`` for good when the first call fails to compile (no C++ compiler,
    an unsupported backend): one ``RuntimeWarning`` naming the function and the error, then eager calls. An error
    that ``fn`` raises eagerly too is raised as usual.

    ``fn`` is an agent's whole update (losses, ``torch.autograd.grad``, ``adam_step`` and target updates):
    ``torch.autograd.grad`` is traced into the graph (Dynamo's ``trace_autograd_ops``), so one call replaces the
    losses' forward and backward passes, the optimizer steps and the polyak update with their Python and dispatch
    overhead. The shapes are static (``dynamic=False``: one batch size per run).

    ``mode``: ``torch.compile``'s mode; an agent passes ``"reduce-overhead"`` on a CUDA device (the kernels are
    recorded once into CUDA graphs and replayed), None (the default mode) elsewhere.

    ``cpp_wrapper``: Inductor's C++ wrapper (``options={"cpp_wrapper": True}``, asked for on a CPU): the code that
    calls the kernels is compiled C++ instead of Python (``tests/benchmarks/bench_cpp_wrapper_ab.py`` measures
    it), for a longer first compile. Where it fails to compile, ``fn`` is compiled once more without it.

    ``skip_guards``: once compiled, skip Dynamo's guard checks (``set_stance(skip_guard_eval_unsafe=True)``: only
    the guards that tell the compiled variants apart run), about 0.3 ms of a 6-10 ms update on a CPU, for a call
    whose bool arguments (the variant: TD3's step with or without the actor) were seen compiled before; a new
    variant is compiled with every guard checked. Safe for a one-graph update because every tensor it reads (parameters, optimizer state, normalizer statistics, the batch)
    is fetched anew at each call and keeps its shape and dtype, and the settings it reads are fixed at
    construction (tests/test_agents.py checks a reloaded state).

    Each wrapper compiles its own copy of ``fn``'s code object (``own_code``): Dynamo keeps its compiled variants
    and guards on the code object, so without the copy every agent of a class would add its variants to the one
    ``train_step`` code object, the variants of freed agents would count against ``recompile_limit`` (8) there,
    and past it a new agent would run eagerly, then fail in its guard-skipping call ("Recompilation triggered with
    skip_guard_eval_unsafe stance"). With the copy an agent's variants are its own and go with it. Should one
    agent still reach the limit (a lowered ``recompile_limit``), or a guard-skipping call find no entry that fits,
    the wrapper checks every guard from then on (Dynamo runs eagerly what it has no entry for): with one entry
    per variant no guard tells a variant without an entry from one with, and a guard-skipping call would run
    the other's graph.
    """

    def __init__(self, fn: Callable[..., Any], name: str, mode: str | None = None, cpp_wrapper: bool = False,
                 skip_guards: bool = True) -> None:
        self.fn, self.name, self.mode, self.cpp_wrapper, self.skip_guards = fn, name, mode, cpp_wrapper, skip_guards
        self.compiled_ok: bool | None = None
        self._variants: set[tuple[bool, ...]] = set()  # the bool arguments of the variants compiled so far
        self._compiled = self._build(cpp_wrapper)

    def _build(self, cpp_wrapper: bool) -> Callable[..., Any]:
        kwargs: dict[str, Any] = {"mode": self.mode} if self.mode else {}
        if cpp_wrapper:
            kwargs["options"] = {"cpp_wrapper": True}
        compiled = torch.compile(own_code(self.fn), dynamic=False, **kwargs)
        # the fast path (compiled variants only, guards skipped) calls it without the config patch, which costs
        # about 10 us a call and matters only while tracing
        self._unpatched = compiled
        # past Dynamo's recompile limit a new variant would run eagerly with no entry of its own, and a later
        # guard-skipping call would run another variant's graph in its place: the limit raises instead (__call__)
        return torch._dynamo.config.patch(trace_autograd_ops=True, fail_on_recompile_limit_hit=True)(compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        variant = tuple(a for a in args if isinstance(a, bool))  # TD3's step with or without the actor, ...
        if self.compiled_ok:
            if self.skip_guards and variant in self._variants:
                # only the guards that tell the compiled variants apart run
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        return self._unpatched(*args, **kwargs)
                except RuntimeError as exc:
                    # raised before the call runs: no entry fits any more (e.g. a guarded network was replaced
                    # and its entry invalidated); every guard is checked from now on
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
                    self.skip_guards = False
            try:
                out = self._compiled(*args, **kwargs)  # every guard checked: compiles a new variant
            except FailOnRecompileLimitHit:
                # raised before the call runs; from now on every guard is checked and Dynamo runs the variants
                # it has no entry for eagerly (with its own warning)
                self.skip_guards = False
                self._compiled = torch._dynamo.config.patch(trace_autograd_ops=True)(self._unpatched)
                return self._compiled(*args, **kwargs)
            self._variants.add(variant)
            return out
        if self.compiled_ok is False:
            return self.fn(*args, **kwargs)
        try:
            try:
                out = self._compiled(*args, **kwargs)
            except Exception:
                if not self.cpp_wrapper:
                    raise
                # the C++ wrapper needs more of the toolchain (Python headers) than Inductor's kernels: without it
                self.cpp_wrapper, self._compiled = False, self._build(False)
                out = self._compiled(*args, **kwargs)
        except Exception as exc:  # any compiler failure; fn itself runs below
            self.compiled_ok = False
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            warnings.warn(f"agent.compile: torch.compile of {self.name} failed, the update runs eagerly "
                          f"({type(exc).__name__}: {first})", RuntimeWarning, stacklevel=2)
            return self.fn(*args, **kwargs)
        self.compiled_ok = True
        self._variants.add(variant)
        return out
