"""Python functions for function jobs, defined as a notebook or a script's ``__main__`` defines
them: cloudpickle sends them by value (no module on the nodes holds them)."""

SOURCE = '''
import os
import time

import submitit


def ranks_sum(tag):
    """Every rank's rank summed over gloo: the ranks did meet."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return {"rank": rank, "sum": total.item(), "tag": tag, "host": os.uname().nodename}


def fails_on(culprit):
    """``culprit`` raises; the others fail after it, in the collective that it never joins."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == culprit:
        raise ValueError(f"rank {culprit} refuses this input")
    dist.barrier()


def dies_once():
    """Rank 1 of the job's first attempt is killed (a lost process); the restart returns."""
    import signal

    import torch.distributed as dist

    dist.init_process_group("gloo")
    attempt = int(os.environ.get("KIT_ATTEMPT", 0))
    if attempt == 0 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return attempt


def loss_of(lr, offset=0.0):
    """A sweep's point: a loss from its argument (rank 0's return value is the table's metric);
    too large a rate diverges."""
    if lr > 0.5:
        raise ValueError(f"lr={lr} diverged")
    return {"loss": (lr - 0.1) ** 2 + offset}


class UntilRequeued(submitit.helpers.Checkpointable):
    """Runs until the time-limit signal in its first attempt; after one checkpoint (by
    submitit's protocol) and the requeue, returns how it got there."""

    def __init__(self):
        self.checkpoints = 0

    def __call__(self):
        while self.checkpoints == 0:  # the workload: the job's first attempt never ends by itself
            time.sleep(1)
        return {"checkpoints": self.checkpoints, "attempt": int(os.environ.get("SLURM_RESTART_COUNT", 0))}

    def checkpoint(self, *args, **kwargs):
        self.checkpoints += 1
        return super().checkpoint(*args, **kwargs)
'''


def main_scope() -> dict:
    """The functions above, as ``__main__``'s."""
    scope = {"__name__": "__main__"}
    exec(compile(SOURCE, "<__main__>", "exec"), scope)
    return scope
