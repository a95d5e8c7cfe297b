"""Child process for the real-OOM test: one actor update on a long synthetic mini-batch.

argv: RUN_DIR MODEL_PATH BUDGET_TOKENS [HEADROOM_BYTES]. With HEADROOM_BYTES, the address space
is capped with RLIMIT_AS at the current size + headroom right before the update, so the CPU allocator really fails
("DefaultCPUAllocator: can't allocate memory"). Prints one JSON line: the VmSize before the
update, the VmPeak after it (the update runs in a forked child: see below), the OOM events and a
digest of the updated actor weights.
"""

from __future__ import annotations

import json
import mmap
import os
import resource
import sys
import traceback
from pathlib import Path

import torch

from tinyrl.roles import Role


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def child_overrides(train_path: Path, model_path: str, budget: int) -> list[str]:
    # trainer.device=cpu: RLIMIT_AS caps the CPU allocator; on a CUDA machine too (the test also
    # hides the card, CUDA_VISIBLE_DEVICES="", so nothing here starts the CUDA driver).
    return [f"model.name={model_path}", f"data.train_path={train_path}",
            "trainer.train_batch_size=16", "actor.ppo_mini_batch_size=16", "trainer.test_every=0",
            "actor.ppo_epochs=1", f"actor.micro_batch_tokens={budget}", "model.logprob_chunk=100000",
            "rollout.engine=hf", "trainer.device=cpu"]


def main() -> None:
    run_dir, model_path, budget = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    headroom = int(sys.argv[4]) if len(sys.argv) > 4 else None
    # One thread, before any parallel op: the update runs in a forked child (below), and a child
    # forked after OpenMP started its thread pool waits forever in its first parallel region
    # (seen here at 2 threads: the fork's child sat in a futex). The suite sets OMP_NUM_THREADS=1
    # anyway (conftest); this keeps a direct run safe too.
    torch.set_num_threads(1)
    from tinyrl.config import load_config
    from tinyrl.models import make_batch
    from tinyrl.trainer import Trainer
    from tinyrl.trajectory import Trajectory

    from tinyrl.data.countdown import generate_countdown

    train, _ = generate_countdown(run_dir / "data", 64, 16, progress=False)  # a set path must exist
    trainer = Trainer(load_config("countdown-tiny", child_overrides(train, model_path, budget)), run_dir / "run")
    g = torch.Generator().manual_seed(0)
    n, p_len, r_len = 16, 200, 600
    batch = make_batch([torch.randint(3, 700, (p_len,), generator=g).tolist() for _ in range(n)],
                       [torch.randint(3, 700, (r_len,), generator=g).tolist() for _ in range(n)], pad_id=0)
    with torch.no_grad(), trainer.models.role(Role.ACTOR):
        old = trainer.models.token_logprobs(Role.ACTOR, batch)
    traj = Trajectory(batch=batch, group_ids=torch.arange(n), old_lp=old, ref_lp=old,
                      advantages=torch.randn(n, r_len, generator=g))
    # Autograd starts its device threads on the first backward, asking every backend for its
    # devices; a CUDA build of torch then loads the CUDA driver, which maps GBs of address space,
    # even with the card hidden (CUDA_VISIBLE_DEVICES=""), and unmaps them when it finds no device.
    # So a throwaway backward runs first, and torch's cached device count is read, here.
    warm = torch.ones(2, requires_grad=True)
    (warm * 2).sum().backward()
    if torch.backends.cuda.is_built():
        torch._C._cuda_getDeviceCount()
    # The card's case on any machine: a large mapping made and dropped before the update (1 GiB,
    # never touched, so it costs no memory), which a peak taken without the fork below counts.
    mmap.mmap(-1, 2**30).close()
    # VmPeak is the process's high-water mark since it started, and a mapping made and dropped
    # before the update (most likely the driver's, above; parent_peak_above_size says on a card)
    # stays in it: on the lent H200 (2026-11-29, card hidden, throwaway backward) VmPeak - VmSize
    # read 8,659,742,720 bytes for the whole and the half micro-batch alike, so the test's first
    # assertion failed. fork() starts the child's VmPeak at its VmSize (Linux's dup_mm sets
    # hiwater_vm = total_vm), so the update runs in a forked child and its peak is the update's
    # alone. Autograd started no device threads with no card visible, so the child may run
    # backward (torch refuses a fork after those threads).
    parent_slack = vm("VmPeak") - vm("VmSize")  # what fork leaves out: reported, so a card shows it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            before = vm("VmSize")
            if headroom:
                resource.setrlimit(resource.RLIMIT_AS, (before + headroom, before + headroom))
            stats = trainer.learners[Role.ACTOR].update(traj, generator=torch.Generator().manual_seed(0))
            digest = sum(float(p.detach().double().sum()) for p in trainer.models.actor_parameters())
            out = {"vm_before": before, "vm_peak": vm("VmPeak"), "oom_events": trainer.budgets.oom_events,
                   "digest": digest, "pg_loss": stats["actor/pg_loss"], "parent_peak_above_size": parent_slack}
            os.write(write, json.dumps(out).encode())
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        result = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"the forked update failed (exit {os.waitstatus_to_exitcode(status)})")
    print(result)


if __name__ == "__main__":
    main()
