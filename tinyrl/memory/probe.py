"""The real probe: run real steps at growing micro-batch sizes until the allocator refuses.

Knows: how to tell an out-of-memory error from any other error, how to search (grow by
doubling, then bisect), how to measure a step's real peak (CUDA: the caching allocator's
counters; CPU: the profiler's allocation events), and how to give a CPU run a hard memory
ceiling so the same search meets real allocator failures without a GPU. Does not know what
a step is: callers pass `try_step(micro_batch)` (see real_step_probe for tinyrl's own step).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import resource
import traceback
from typing import Any, Callable

import torch

from tinyrl.errors import TinyRLError

OOM_TEXTS = ("out of memory", "DefaultCPUAllocator: can't allocate memory")
STEP_DOWNS = 3  # sizes below a search's answer measured again when it does not run twice


def is_oom(exc: BaseException) -> bool:
    """A real allocator failure: CUDA's OutOfMemoryError, the CPU allocator's RuntimeError, or
    Python's MemoryError (an allocation outside torch that hit the same ceiling)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in OOM_TEXTS)


def free_memory() -> None:
    """Release what a failed try left behind. An out-of-memory error inside backward leaves
    the autograd engine holding the failed graph (and every activation it saved) until the
    next backward runs -- seen with torch 2.13 and checkpointed layers: ~10x the model's
    resident memory stayed alive after gc -- so a trivial backward runs first."""
    torch.ones(1, requires_grad=True).sum().backward()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def find_max_micro_batch(try_step: Callable[[int], None], lo: int = 1, hi: int = 1024,
                         on_oom: Callable[[int, BaseException], None] | None = None) -> int:
    """The largest micro-batch in [lo, hi] for which try_step runs; lo - 1 if lo already fails.

    Grows by doubling from lo, then bisects between the last size that ran and the first that
    ran out of memory. Only out-of-memory errors count as "does not fit": anything else is a
    bug and propagates. Memory is freed between tries; `on_oom(size, error)` sees each failure.
    """
    def fits(b: int) -> bool:
        try:
            try_step(b)
            return True
        except (RuntimeError, MemoryError) as exc:
            if not is_oom(exc):
                raise
            if on_oom is not None:
                on_oom(b, exc)
            return False
        finally:
            free_memory()

    if not fits(lo):
        return lo - 1
    good, bad = lo, None
    b = lo
    while bad is None and b < hi:
        b = min(2 * b, hi)
        if fits(b):
            good = b
        else:
            bad = b
    if bad is None:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


# ------------------------------------------------------------------------------- peaks

def measure_peak(fn: Callable[[], Any], device: str = "cpu") -> int:
    """Bytes allocated at the peak of fn() above what was allocated before it.

    CUDA: torch.cuda.max_memory_allocated. CPU: the profiler's allocation and free events of
    torch's CPU allocator, replayed in time order (what tensors really took, independent of
    the dispatch-level accounting the simulation uses); allocations inside oneDNN/MKL that
    bypass torch's allocator are not seen.
    """
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation and e.typed[1].device.type == "cpu":
            events.append((e.start_time_ns, e.typed[1].alloc_size))
    current = peak = 0
    for _, size in sorted(events):
        current += size
        peak = max(peak, current)
    return peak


def live_tensor_bytes(*objs) -> int:
    """Bytes of the distinct storages held by modules (params, grads, buffers), optimizers
    (state) and tensors: what is resident before a step starts."""
    seen: dict[int, int] = {}

    def add(t) -> None:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()

    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                add(p)
                add(p.grad)
            for b in obj.buffers():
                add(b)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    add(v)
        else:
            add(obj)
    return sum(seen.values())


# ------------------------------------------------------------------------------- CPU ceiling

def vm_size_bytes() -> int:
    """This process's virtual address space (VmSize), the quantity RLIMIT_AS limits."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise TinyRLError("cannot read VmSize from /proc/self/status", hint="needs Linux")


def _steady_malloc() -> None:
    """Make glibc return freed big blocks to the OS at once and keep one arena, so a failed
    try leaves no address space behind for the next (the dynamic mmap threshold would move
    large blocks onto the heap, which is never unmapped, and each arena reserves 64 MiB)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, so the dynamic threshold is off
    libc.mallopt(-8, 1)           # M_ARENA_MAX


def _child(conn, fn, limit_bytes, args, prepare) -> None:
    # Hide any card before anything in this child reaches CUDA. The child may grow by limit_bytes
    # beyond its baseline, and on a machine with a card the first CUDA call starts the driver,
    # which maps gigabytes of virtual address space: the first backward does it (the autograd
    # engine counts each device type's devices to start its worker threads), and so does
    # free_memory's torch.cuda.is_available(). After the baseline, that mapping is charged to the
    # headroom (the real-OOM test's child grew ~13 GB of VmSize for any micro-batch on an H100,
    # 2026-11-27), so the search would measure the driver, not the step. This child is CPU-only
    # by design; the parent's environment and its own CUDA use are left as they were.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from tinyrl._compat import quiet_library_deprecations

    quiet_library_deprecations()  # a spawned child starts without the CLI's warning filters
    try:
        torch.set_num_threads(1)
        torch.ones(64).sum()  # start torch's thread pool before the baseline is read
        _steady_malloc()
        prepared = prepare(*args) if prepare is not None else None
        baseline = vm_size_bytes()
        resource.setrlimit(resource.RLIMIT_AS, (baseline + limit_bytes, resource.RLIM_INFINITY))
        conn.send(("ok", fn(prepared) if prepare is not None else fn(*args), baseline))
    except BaseException as exc:  # reported to the parent, which re-raises it there
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", 0))
    finally:
        conn.close()


def run_under_memory_limit(fn: Callable[..., Any], limit_bytes: int, *args,
                           prepare: Callable[..., Any] | None = None,
                           start_method: str = "spawn", timeout_s: float = 300.0) -> Any:
    """fn(*args) in a child process that may grow its address space by at most limit_bytes.
    With `prepare`, the child runs prepare(*args) first, unlimited (imports, building a model),
    and then fn(prepare's result) under the limit.

    RLIMIT_AS caps virtual memory, and a process that has imported torch already maps far more
    than it uses (shared libraries, thread stacks, allocator arenas: ~1-2 GiB VmSize for a few
    hundred MiB resident). So the child reads its own VmSize after importing torch and starting
    its thread pool, and sets the limit to that baseline + limit_bytes: limit_bytes is then the
    headroom for what fn allocates, and torch's CPU allocator fails with its real error
    ("DefaultCPUAllocator: can't allocate memory") when fn asks for more. glibc is set to
    unmap freed blocks at once (see _steady_malloc), so a failed try does not shrink the next.
    The child sees no CUDA card (CUDA_VISIBLE_DEVICES=""): the driver's start would otherwise
    take gigabytes of that headroom on a machine with one (see _child).

    Both 'spawn' and 'fork' ran this with torch 2.13 on CPU and found the same sizes; 'spawn'
    is the default because a child forked after the parent ran parallel torch ops inherits
    OpenMP state that can hang its first parallel region (fork is ~2x faster to start). fn and args must be picklable (a module-level function). Returns fn's
    result; any exception in the child is raised here as TinyRLError carrying its text.
    """
    ctx = multiprocessing.get_context(start_method)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, limit_bytes, args, prepare))
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise TinyRLError(f"memory-limited child gave no answer in {timeout_s:.0f} s",
                              hint="a smaller model or micro-batch range")
        status, value, _ = parent.recv()
    except EOFError:  # the pipe closed without an answer: the child was killed (e.g. SIGSEGV)
        proc.join(timeout=10)
        status, value = "error", f"child died (exit code {proc.exitcode}) before answering"
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise TinyRLError(f"memory-limited run failed: {value}",
                          hint="the child's traceback is above; an allocator failure outside "
                               "try_step means the limit is too small for the setup itself")
    return value


# ------------------------------------------------------------------------------- tinyrl's step

def real_try_step(spec: dict, step, device: str = "cpu", shared_by: int = 1) -> Callable[[int], None]:
    """try_step(micro_batch) running tinyrl's own micro-step (simulate.run_phase) for real:
    real random weights on `device`, Adam state created, the phase's grads allocated. With
    `shared_by` > 1 (rows that share each prompt, GRPO's rollout.n) each try runs both packed
    layouts the plan prices (simulate.priced_layouts), each prompt distinct then shared as
    simulate.edge_groups says: a size passes when both run, its peak the higher."""
    from dataclasses import replace

    from tinyrl.memory import simulate as sim

    models = sim.build_models(spec, step, device=device)
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, step.phase)

    def try_step(micro_batch: int) -> None:
        for layout in sim.priced_layouts(replace(step, micro_batch=micro_batch), shared_by):
            batch = sim.make_inputs(layout, spec["vocab_size"], device)
            try:
                sim.run_phase(models, opts, layout, batch)
            finally:
                sim.warm_start(models, {}, layout.phase)  # grads back, as in the next micro-batch
            del batch

    return try_step


def search_with_proof(try_step: Callable[[int], None], lo: int = 1, hi: int = 256, step_downs: int = STEP_DOWNS) -> dict:
    """find_max_micro_batch, then evidence: whether B runs again afterwards, and the error 2B
    really raised (None when 2B ran or B < lo). Meant for run_under_memory_limit.

    The search ends on a size that ran once, right at the ceiling, and the address space left
    outside a try drifts: each failed try leaves ~1 MiB of heap behind (torch 2.13, glibc, under
    RLIMIT_AS). So the size the search found can fail the next time (seen with countdown-tiny
    under 64 MiB: 8 ran once at +4 MiB, then failed six times in a row at +5 MiB). A size that
    runs only now and then is no answer for a plan, so it is measured again, and on a failure
    the answer steps down one size (at most `step_downs` times) until one runs again.
    `stepped_down` says how often that happened.
    """
    best = find_max_micro_batch(try_step, lo, hi)
    result = {"max_micro_batch": best, "reruns": False, "double_error": None, "stepped_down": 0}
    if best < lo:
        return result
    sizes = step_down_sizes(best, lo, step_downs)
    found = first_that_runs(try_step, sizes)
    if found is None:  # nothing ran again: the evidence says so, and the last size tried stands
        result.update(max_micro_batch=sizes[-1], stepped_down=len(sizes) - 1)
    else:
        result.update(max_micro_batch=found[0], stepped_down=best - found[0], reruns=True)
    best = result["max_micro_batch"]
    try:
        try_step(2 * best)
    except (RuntimeError, MemoryError) as exc:
        if not is_oom(exc):
            raise
        result["double_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        free_memory()
    return result


def step_down_sizes(best: int, lo: int, step_downs: int, then_halve: bool = False) -> list[int]:
    """The sizes to measure again after a search ended on `best`: best, best - 1, ... `step_downs`
    times (not below lo); with then_halve, then halves of the last one down to lo."""
    sizes = list(range(best, max(lo, best - step_downs) - 1, -1))
    while then_halve and sizes[-1] // 2 >= lo:
        sizes.append(sizes[-1] // 2)
    return sizes


def first_that_runs(run: Callable[[int], Any], sizes: list[int]) -> tuple[int, Any] | None:
    """(size, run(size)) for the first of `sizes` at which run does not run out of memory; None
    when none does. Memory is freed after each try; any other error propagates."""
    for size in sizes:
        try:
            return size, run(size)
        except (RuntimeError, MemoryError) as exc:
            if not is_oom(exc):
                raise
        finally:
            free_memory()
    return None


def real_phase_peak(spec: dict, step, device: str = "cpu") -> int:
    """Peak bytes of one real micro-step of tinyrl's step (simulate.run_phase) on `device`:
    what was resident before it (weights, Adam state, grads, inputs) + its measured peak."""
    from tinyrl.memory import simulate as sim

    models = sim.build_models(spec, step, device=device)
    opts = sim.make_optimizers(models)
    sim.warm_start(models, opts, step.phase)
    batch = sim.make_inputs(step, spec["vocab_size"], device)
    resident = live_tensor_bytes(*sim.all_modules(models), *opts.values(), *sim.batch_tensors(batch))
    return resident + measure_peak(lambda: sim.run_phase(models, opts, step, batch), device)
