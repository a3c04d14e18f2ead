"""Comms: how the ranks of a ckpt.save / ckpt.load talk.

ckpt.save and ckpt.load take comm=None (one process), a torch.distributed process group, or
any object with the methods of ProcessGroupComm (rank, size, barrier, gather, broadcast,
all_gather, split), whose collectives move bytes. libckpt calls them from C++ (ckpt::Comm).
"""
import sys


class ProcessGroupComm:
    """ckpt's Comm over a torch.distributed process group (gloo: CPU byte tensors; NCCL:
    the current CUDA device's). Every method is a collective of the group."""

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ckpt: torch.distributed is not initialized (call init_process_group first)")
        self._torch, self._dist = torch, dist
        self.group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        backend = str(dist.get_backend(group))
        self._device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def barrier(self):
        self._dist.barrier(group=self.group)

    def _tensor(self, data):
        t = self._torch.zeros(len(data), dtype=self._torch.uint8)
        if data:
            t[:] = self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8)
        return t.to(self._device)

    def _lengths(self, n):
        mine = self._torch.tensor([n], dtype=self._torch.int64, device=self._device)
        out = [self._torch.zeros(1, dtype=self._torch.int64, device=self._device) for _ in range(self._size)]
        self._dist.all_gather(out, mine, group=self.group)
        return [int(t.item()) for t in out]

    def all_gather(self, data):
        lengths = self._lengths(len(data))
        longest = max(lengths)
        mine = self._tensor(bytes(data) + bytes(longest - len(data)))
        out = [self._torch.empty(longest, dtype=self._torch.uint8, device=self._device) for _ in range(self._size)]
        if longest:
            self._dist.all_gather(out, mine, group=self.group)
        return [t[:n].cpu().numpy().tobytes() for t, n in zip(out, lengths)]

    def gather(self, data, root):
        # libckpt gathers small descriptions only: an all-gather keeps this to one code path
        # that every backend has.
        everyone = self.all_gather(data)
        return everyone if self._rank == root else []

    def broadcast(self, data, root):
        src = self._global(root)
        n = self._torch.tensor([len(data) if self._rank == root else 0], dtype=self._torch.int64,
                               device=self._device)
        self._dist.broadcast(n, src=src, group=self.group)
        length = int(n.item())
        buf = self._tensor(data) if self._rank == root else self._torch.empty(length, dtype=self._torch.uint8,
                                                                              device=self._device)
        if length:
            self._dist.broadcast(buf, src=src, group=self.group)
        return buf.cpu().numpy().tobytes()

    def split(self, color, key):
        pairs = self._torch.tensor([color, key], dtype=self._torch.int64, device=self._device)
        out = [self._torch.zeros(2, dtype=self._torch.int64, device=self._device) for _ in range(self._size)]
        self._dist.all_gather(out, pairs, group=self.group)
        members = sorted((int(t[1]), r) for r, t in enumerate(out) if int(t[0]) == color)
        ranks = [self._global(r) for _, r in members]
        group = self._dist.new_group(ranks=ranks, use_local_synchronization=True)
        return ProcessGroupComm(group)

    def _global(self, group_rank):
        if self.group is None:
            return group_rank
        return self._dist.get_global_rank(self.group, group_rank)


def comm_of(comm):
    """The object the bindings call for `comm`: None (one process), a ckpt comm as given, or
    a ProcessGroupComm over a torch.distributed process group."""
    if comm is None:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(comm, dist.ProcessGroup):
        return ProcessGroupComm(comm)
    if all(callable(getattr(comm, m, None)) for m in ("rank", "size", "barrier", "gather", "broadcast",
                                                      "all_gather", "split")):
        return comm
    raise TypeError(f"comm: None, a torch.distributed ProcessGroup or a ckpt comm, not {type(comm).__name__}")
