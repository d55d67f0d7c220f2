"""torch.nn.parallel.DistributedDataParallel for a compiled module: one process per card, each
with its own ttd session, gradients averaged across the processes over torch.distributed (gloo).

At wrap time rank 0's parameters are broadcast and written into every other rank's module in
place. A training forward through the wrapper marks its run: when torch's backward reaches the
run (the module's Backward sent to the card), a callback is queued on torch's autograd engine,
as torch's DDP queues its own, and runs once when loss.backward() finishes. It averages the
.grad of every parameter on the card: the gradients come to the host in buckets (bucket_cap_mb),
each bucket's all-reduce (sum, async) runs while the next bucket downloads, and each result,
divided by the world size, is written back into the same .grad (tt_copy_). So after backward
every rank holds the same .grad, and ttd.optim steps alike everywhere. Under no_sync() a
forward's backward only accumulates; the first backward of a forward outside it averages the
accumulated .grad. A lost peer (exited, killed, or silent past init_process_group's timeout)
raises RankError naming the ranks that no longer answer, rather than hanging."""
import contextlib
import datetime

import torch
import torch.distributed as dist

from . import _lib
from .convert import _host_from_torch
from .module import CompiledModule

_MB = 1024 * 1024


class RankError(RuntimeError):
    """A collective across the ranks failed: `lost` lists the ranks that did not answer (empty
    when none could be named), `rank` is this process's."""

    def __init__(self, rank, world, what, lost, cause):
        self.rank, self.world, self.lost = rank, world, lost
        who = (f"rank {', '.join(map(str, lost))} of {world} exited or stopped answering" if lost
               else "a peer rank exited or stopped answering")
        super().__init__(f"rank {rank}: {what} failed: {who} (torch.distributed: {cause})")


class DistributedDataParallel:
    """torch.nn.parallel.DistributedDataParallel over a ttd.compile'd module; call it after
    torch.distributed.init_process_group("gloo", timeout=...), with the module on this rank's
    card (module.to(f"tt:{local_rank}") for cards of one ttd). Arguments as torch's; bucket_cap_mb
    sizes the all-reduce buckets; device_ids, when given, names the module's card ([r] or
    ["tt:r"]); the CUDA-only ones are accepted and mean nothing here."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=25, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False):
        if not isinstance(module, CompiledModule):
            raise TypeError(f"ttd.parallel.DistributedDataParallel wraps a ttd.compile'd module, not "
                            f"{type(module).__name__}: wrap ttd.compile(model)")
        if not dist.is_initialized():
            raise RuntimeError("ttd.parallel.DistributedDataParallel needs torch.distributed: call "
                               "torch.distributed.init_process_group(\"gloo\") first")
        if device_ids is not None:
            ids = list(device_ids)
            want = [d if isinstance(d, str) else f"tt:{d}" for d in ids]
            have = module._device if module._device != "tt" else "tt:0"
            if len(want) != 1 or want[0] != have:
                raise ValueError(f"device_ids {ids} does not name the module's device {have!r}: move the module "
                                 f"with .to(\"tt:N\") and pass device_ids=[N] or none")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, not {bucket_cap_mb}")
        self.module = module
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.bucket_cap_mb = bucket_cap_mb
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = False
        self._queued = False
        self._collectives = 0  # the same count on every rank in step: names the liveness keys
        self._buckets = self._make_buckets(int(bucket_cap_mb * _MB))
        self._broadcast_parameters()

    # ---- torch's nn.Module manners, passed to the wrapped module ----

    def __call__(self, *inputs, **kwargs):
        return self.forward(*inputs, **kwargs)

    def forward(self, *inputs, **kwargs):
        """The wrapped module's forward; its backward averages the .grads unless no_sync()."""
        hook = self._on_backward if self.require_backward_grad_sync else None
        self._queued = False  # a backward that raised left its averaging unqueued, never run
        self.module._after_backward = hook
        try:
            return self.module(*inputs, **kwargs)
        finally:
            self.module._after_backward = None

    @contextlib.contextmanager
    def no_sync(self):
        """torch's no_sync: the backward of forwards made inside only accumulates .grad on each
        rank; the first forward-backward outside averages the accumulated .grad."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def state_dict(self):
        """torch's DDP state_dict: the wrapped module's, its keys under "module."."""
        return type(self.module.state_dict())(("module." + k, v) for k, v in self.module.state_dict().items())

    def load_state_dict(self, state_dict, strict=True):
        """Takes this wrapper's state_dict ("module."-prefixed keys) or the wrapped module's."""
        if all(k.startswith("module.") for k in state_dict):
            state_dict = {k[len("module."):]: v for k, v in state_dict.items()}
        return self.module.load_state_dict(state_dict, strict)

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self):
        return self.module.training

    def zero_grad(self, set_to_none=False):
        self.module.zero_grad(set_to_none)

    def to(self, device):
        self.module.to(device)
        return self

    def __repr__(self):
        return f"DistributedDataParallel(rank={self.rank}, world_size={self.world_size}, module={self.module!r})"

    # ---- the collectives ----

    def _make_buckets(self, cap_bytes):
        """The parameters in buckets of at most cap_bytes of float32 (at least one parameter
        each), in reverse order as torch's DDP (the output layer's gradients first)."""
        buckets, current, size = [], [], 0
        for name, p in reversed(list(self.module.named_parameters())):
            n = p.shape.numel()
            if current and size + 4 * n > cap_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append((name, tuple(p.shape), n))
            size += 4 * n
        if current:
            buckets.append(current)
        return buckets

    def _fail(self, what, cause):
        """A RankError naming the ranks that do not answer on the rendezvous store (rank 0's
        TCPStore under torchrun's and init_process_group's env:// defaults): each rank that
        reaches here says so under a key of this collective and waits briefly for the others."""
        lost = []
        try:
            store = dist.distributed_c10d._get_default_store()
            prefix = f"ttd.parallel/alive/{self._collectives}/"
            store.set(prefix + str(self.rank), "1")
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                try:
                    store.wait([prefix + str(r)], datetime.timedelta(seconds=2))
                except RuntimeError:
                    lost.append(r)
        except Exception:  # noqa: BLE001 - the store itself is gone: it lived in rank 0
            lost = [0] if self.rank != 0 else []
        return RankError(self.rank, self.world_size, what, lost, str(cause).strip().split("\n")[0])

    def _wait(self, work, what):
        try:
            work.wait()
        except RuntimeError as e:
            raise self._fail(what, e) from e

    def _broadcast_parameters(self):
        """The group's rank 0's parameters onto every rank (its global rank the broadcast's
        source): before the first call, into the traced module's values; after, in place on the
        card (tt_copy_ into each parameter)."""
        self._collectives += 1
        m = self.module
        src = 0 if self.process_group is None else dist.distributed_c10d._get_global_rank(self.process_group, 0)
        if m._module is None:
            for bucket in self._buckets:
                params = [m._gm.get_parameter(name) for name, _, _ in bucket]
                flat = torch.cat([p.detach().reshape(-1).float() for p in params])
                self._wait(dist.broadcast(flat, src, group=self.process_group, async_op=True),
                           "broadcasting the parameters from rank 0")
                with torch.no_grad():
                    off = 0
                    for p, (_, shape, n) in zip(params, bucket):
                        p.copy_(flat[off:off + n].view(shape))
                        off += n
            return
        for bucket in self._buckets:
            tensors = [m._module.param(name) for name, _, _ in bucket]
            flat = self._download(tensors, bucket) if self.rank == 0 else torch.empty(sum(n for *_, n in bucket))
            self._wait(dist.broadcast(flat, src, group=self.process_group, async_op=True),
                       "broadcasting the parameters from rank 0")
            if self.rank != 0:
                self._upload(flat, tensors, bucket)

    def _download(self, tensors, bucket):
        """The tensors' values (host or card) concatenated into one float32 CPU tensor."""
        flat = torch.empty(sum(n for *_, n in bucket))
        off = 0
        for t, (_, _, n) in zip(tensors, bucket):
            if t is not None:
                t.to("cpu", _lib.FLOAT32).read_into(flat[off:].data_ptr(), 4 * n)
            else:
                flat[off:off + n].zero_()
            off += n
        return flat

    def _upload(self, flat, tensors, bucket):
        """flat's pieces written into the tensors in place (tt_copy_)."""
        off = 0
        for t, (_, shape, n) in zip(tensors, bucket):
            if t is not None:
                t.copy_(_host_from_torch(flat[off:off + n].view(shape)))
            off += n

    def _on_backward(self):
        """Called in torch's backward by each run made through forward(): the averaging runs
        once, when the whole backward is done (torch's own DDP finalizes the same way)."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._average_grads)

    def _average_grads(self):
        """Every parameter's .grad on the card becomes its mean over the ranks: bucket i's
        all-reduce runs while bucket i+1 downloads, then bucket i is written back."""
        self._queued = False
        self._collectives += 1
        m = self.module._built()
        pending = None
        for bucket in self._buckets:
            grads = [m.param_grad(name) for name, _, _ in bucket]
            # each parameter's gradient, then whether this rank has one: summed, the count of ranks
            flat = torch.cat([self._download(grads, bucket), torch.tensor([float(g is not None) for g in grads])])
            work = dist.all_reduce(flat, group=self.process_group, async_op=True)
            if pending is not None:
                self._finish(*pending)
            pending = (work, flat, grads, bucket)
        if pending is not None:
            self._finish(*pending)

    def _finish(self, work, flat, grads, bucket):
        self._wait(work, "averaging the gradients")
        ranks = flat[len(flat) - len(grads):]
        partial = [name for (name, _, _), r in zip(bucket, ranks.tolist()) if 0 < r < self.world_size]
        if partial:  # the same sums on every rank: all raise alike
            raise RuntimeError(f"parameter(s) {', '.join(partial)} got a gradient on some ranks and not on others: "
                               f"ttd.parallel averages the .grads every rank's backward reached, so each rank's loss "
                               f"must reach the same parameters (find_unused_parameters is not supported); use them "
                               f"on every rank (a zero-weighted term will do)")
        flat.div_(self.world_size)
        self._upload(flat, grads, bucket)

