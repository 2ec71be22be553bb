"""The ``torch.distributed`` backend ``"rocecoll"`` (CPU and CUDA tensors) and a DDP communication
hook.

Importing this module registers the backend (``Backend.register_backend("rocecoll", ...,
devices=["cpu", "cuda"])``), after which ``dist.init_process_group("rocecoll")`` works under
torchrun. CUDA tensors go through the package's device path (``rocecoll`` module docs: gpu-p2p,
ordered after the tensor's current stream; ``Work.wait`` returns once the device writes are done).
The process group is a Python ``ProcessGroup`` (as in PyTorch's ``test_c10d_pypg.py``) over one
:class:`rocecoll.Comm` made from the store PyTorch hands the backend: no port of ours is opened.
An ``async_op=True`` operation returns at once with its ``Work``; operations run in issue order
on the communicator's progress thread. ``Work.wait`` waits for them on the calling thread (GIL
released) and runs what must follow (copies out of staging buffers) there; only a future
(``Work.get_future``, as DDP's reducer asks for) is completed by the group's completion thread. A
blocking call (``async_op=False``: ``torch.distributed`` waits for the ``Work`` at once) of a
collective when nothing is in flight runs on the calling thread instead, with the GIL released
(``AsyncCommunicator::run_or_submit``), and returns a ``Work`` that has already ended: no thread
hand-off. How a blocking call is told apart: ``opts.asyncOp`` where torch sets it (2.7: broadcast,
all_gather_into_tensor, reduce_scatter_tensor, barrier ...), else the ``async_op`` argument of the
``torch.distributed`` function that called the process group (its frame); a caller that is
neither (a comm hook, FSDP, a direct ``ProcessGroup`` call) is treated as asynchronous.
Point-to-point operations always go to the progress thread (two ranks' blocking sends to each
other must not both block their callers).

Implemented (what DDP and FSDP2 use on CPU): ``broadcast``, ``allreduce`` (and coalesced),
``reduce``, ``allgather``, ``all_gather_into_tensor`` (``_allgather_base``, and coalesced),
``reduce_scatter``, ``reduce_scatter_tensor`` (``_reduce_scatter_base``, and coalesced),
``alltoall_base`` (equal splits), ``barrier``, ``send``, ``recv`` (tag 0). Anything else raises
``NotImplementedError`` naming the op. Environment: ``ROCECOLL_TRANSPORT`` (auto, shm, roce),
``ROCECOLL_LOCAL_IP`` (the address for RoCE; default 127.0.0.1 when MASTER_ADDR is local),
``ROCECOLL_SUM_ORDER`` (``native``, the default: the collectives crate's algorithms; ``gloo``:
float32 / float64 sum all-reduces, here and in the DDP hook, add the ranks' values in the order
Gloo's ring all-reduce does, so results are bitwise Gloo's on any world size, at the cost of an
all-gather of every rank's values: for reproducing a Gloo run, not for speed).

``Work.wait(timeout)`` honours its timeout as ``c10d::Work::wait`` does (Gloo's work): it raises
:class:`WorkTimeout` (a :class:`rocecoll.CollectiveError`) naming the op and the ranks, and the
operation goes on; ``abort()`` ends it and every pending one.
"""

import datetime
import os
import queue
import sys
import threading
import time

import torch
import torch.distributed as dist

from . import CollectiveError, Comm, _arg
from ._native import Communicator as _Native

NAME = "rocecoll"
_SUM = dist.ReduceOp.SUM

_OPS = [
    (dist.ReduceOp.SUM, "sum"),
    (dist.ReduceOp.PRODUCT, "prod"),
    (dist.ReduceOp.MIN, "min"),
    (dist.ReduceOp.MAX, "max"),
    (dist.ReduceOp.AVG, "avg"),
]


def _redop(opts, opname):
    for k, v in _OPS:
        if opts.reduceOp == k:
            return v
    raise NotImplementedError(f"rocecoll backend: {opname} with {opts.reduceOp} is not implemented")


def _unsupported(opname):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"rocecoll backend: {opname} is not implemented")

    method.__name__ = opname
    return method


class _Completer:
    """One thread that runs, in the order handed in, what completes an operation's future
    (waiting for its native operations, then what follows them: a copy out of a staging
    buffer). Used only for futures (``Work.get_future``, the DDP hook): ``Work.wait`` finishes
    its operation on the waiting thread."""

    def __init__(self, name):
        self._q = queue.SimpleQueue()
        # Items handed in and items finished: each counter is written by one side only (the
        # issuing side under ``_lock``, the completion thread alone), so their difference is
        # what is still outstanding.
        self._lock = threading.Lock()
        self._put = 0
        self._finished = 0
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def idle(self):
        """Whether every item handed in has been run (nothing would be overtaken)."""
        return self._put == self._finished

    def put(self, fn):
        """Runs ``fn()`` on the completion thread after the items handed in before it."""
        with self._lock:
            self._put += 1
            self._q.put(fn)

    def _run(self):
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # noqa: S110  (fn hands its own errors to its future)
                pass
            finally:
                self._finished += 1

    def close(self):
        self._q.put(None)


class WorkTimeout(CollectiveError):
    """``Work.wait(timeout)`` ran out before the operation ended. As ``c10d::Work::wait`` (the
    base of Gloo's work, torch/csrc/distributed/c10d/Work.cpp: "Operation timed out!"), the
    operation goes on and the process group stays usable: wait again, or ``abort()`` the group
    to end it (then every pending operation raises). ``rank``, ``op``, ``timeout`` (seconds)."""


def _seconds(timeout):
    """``Work.wait``'s timeout in seconds, or None for none: a ``datetime.timedelta`` (what
    torch's C++ side passes; ``timedelta(0)`` is its ``kNoTimeout``) or a number of seconds."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if secs < 0:
        raise ValueError(f"Work.wait: negative timeout {timeout}")
    return secs if secs > 0 else None


class _Work(dist._Work):
    """An async ``torch.distributed`` Work over native operations: ``wait`` waits for them on
    the calling thread (GIL released) and runs what follows them (``post``); ``get_future``
    hands that to the group's completion thread instead, which completes the future."""

    def __init__(self, completer, natives, post, keep, result, op, rank, size):
        super().__init__()
        self._lock = threading.Lock()
        self._completer = completer
        self._natives = natives
        self._post = post
        self._keep = keep
        self._result = result
        self._op = op
        self._rank = rank
        self._size = size
        self._ended = False
        self._error = None
        self._future = None
        self._future_set = False

    def _finish(self, deadline):
        """With ``_lock`` held: waits for the natives (until ``deadline``, a monotonic time,
        or without limit when None), runs ``post``; True when the operation has ended."""
        if self._ended:
            return True
        try:
            for n in self._natives:
                left = None if deadline is None else max(deadline - time.monotonic(), 1e-6)
                if not n.wait(left):
                    return False
            if self._post is not None:
                self._post()
            self._error = None
        except Exception as e:  # CollectiveError, or a failed copy: handed to the waiters
            self._error = e
        self._ended = True
        self._natives = self._post = self._keep = None
        return True

    def _settle_future(self):
        """Completes the future once (outside ``_lock``: its callbacks may wait on this Work)."""
        with self._lock:
            if self._future is None or not self._ended or self._future_set:
                return
            self._future_set = True
        if self._error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(self._error)

    def _complete_async(self):
        with self._lock:
            self._finish(None)
        self._settle_future()

    def _timed_out(self, secs):
        err = WorkTimeout(
            f"rank {self._rank}: {self._op} on ranks 0..{self._size - 1} of the rocecoll "
            f"process group did not end within Work.wait(timeout={secs:g} s); it goes on "
            "(wait again, or abort() the group)"
        )
        err.rank, err.peer, err.op, err.timeout = self._rank, None, self._op, secs
        return err

    def wait(self, timeout=None):
        """Waits for the operation; at most ``timeout`` (a ``timedelta`` or seconds; None or
        ``timedelta(0)``: no limit), then raises :class:`WorkTimeout` naming the op and the
        ranks. Raises the operation's :class:`CollectiveError` if it failed."""
        secs = _seconds(timeout)
        deadline = None if secs is None else time.monotonic() + secs
        if not self._lock.acquire(timeout=-1 if secs is None else secs):
            raise self._timed_out(secs)
        try:
            ended = self._finish(deadline)
        finally:
            self._lock.release()
        if not ended:
            raise self._timed_out(secs)
        self._settle_future()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        if not self._ended and self._lock.acquire(blocking=False):
            try:
                if all(n.is_completed() for n in self._natives):
                    self._finish(None)
            finally:
                self._lock.release()
            self._settle_future()
        return self._ended

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        with self._lock:
            made = self._future is None
            if made:
                self._future = torch.futures.Future()
            ended = self._ended
        if made and not ended:
            self._completer.put(self._complete_async)
        self._settle_future()
        return self._future

    def result(self):
        self.wait()
        return self._result


class _EndedWork(dist._Work):
    """The ``Work`` of an operation that ended before its issuing call returned (a blocking call
    run on the calling thread): ``wait`` returns or raises at once; the future is made only when
    asked for."""

    def __init__(self, result, error):
        super().__init__()
        self._result = result
        self._error = error
        self._future = None

    def wait(self, timeout=None):
        """Returns True, or raises the operation's :class:`CollectiveError` (it has ended)."""
        _seconds(timeout)  # the same argument checks as a pending Work's
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        if self._future is None:
            self._future = torch.futures.Future()
            if self._error is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(self._error)
        return self._future

    def result(self):
        self.wait()
        return self._result


_C10D = dist.distributed_c10d.__name__


def _blocking(opts, depth=2):
    """Whether the ``torch.distributed`` call behind a process group op waits for its ``Work`` at
    once (``async_op=False``): ``opts.asyncOp`` where torch sets it (``BroadcastOptions``,
    ``ReduceScatterOptions``, ... in 2.7), else the ``async_op`` argument of the
    ``torch.distributed.distributed_c10d`` function ``depth`` frames up (the op's caller:
    ``all_reduce`` and ``barrier`` pass no ``asyncOp`` in 2.7). Anything else (a comm hook, FSDP,
    a direct ``ProcessGroup`` call, a torch that changed) counts as asynchronous: the safe side,
    as an asynchronous op must return before its peers join."""
    a = getattr(opts, "asyncOp", None) if opts is not None else None
    if a is not None:
        return not a
    try:
        f = sys._getframe(depth)
    except ValueError:
        return False
    if f.f_globals.get("__name__") != _C10D:
        return False
    return f.f_locals.get("async_op", True) is False


# Gloo's ring all-reduce (gloo/allreduce.cc, ring(), as torch 2.7's ProcessGroupGloo runs it for
# dense CPU tensors: gloo::allreduce with the default options): the buffer of B bytes is cut into
# S = roundUp(max(ceil(B / 1 MiB), 2n), n) segments (kMaxSegmentSize in gloo/allreduce.h) of
# roundUp(ceil(B / S), element size) bytes, the last ones short or empty; chunk c is segments
# c * S/n .. (c + 1) * S/n - 1 and ends on rank c. Each rank receives from rank + 1 and adds its
# own values first: chunk c's sum is x[c] + (x[c+1] + (... + (x[c-2] + x[c-1]))), ranks mod n.
_GLOO_MAX_SEGMENT = 1 << 20
_GLOO_ORDER_DTYPES = (torch.float32, torch.float64)


def _round_up(a, b):
    return (a + b - 1) // b * b


def gloo_chunk_elements(numel, element_size, size, max_segment=_GLOO_MAX_SEGMENT):
    """Elements per chunk of Gloo's ring all-reduce of ``numel`` elements of ``element_size``
    bytes on ``size`` ranks (the last chunks may be shorter or empty); see the comment above."""
    nbytes = numel * element_size
    max_seg = element_size * max(1, max_segment // element_size)
    segments = _round_up(max((nbytes + max_seg - 1) // max_seg, 2 * size), size)
    seg = _round_up((nbytes + segments - 1) // segments, element_size)
    return segments // size * seg // element_size


def gloo_order_sum(gathered, out, max_segment=_GLOO_MAX_SEGMENT):
    """Writes into ``out`` (n elements) the sum of ``gathered``'s rows (size x n, row r = rank
    r's values) in the order Gloo's ring all-reduce adds them (bitwise Gloo's result)."""
    size, n = gathered.shape
    per = gloo_chunk_elements(n, out.element_size(), size, max_segment)
    for c in range(size):
        lo, hi = c * per, min((c + 1) * per, n)
        if lo >= hi:
            break
        acc = gathered[(c - 1) % size, lo:hi].clone()
        for k in range(size - 2, -1, -1):
            acc = gathered[(c + k) % size, lo:hi] + acc
        out[lo:hi] = acc


def _sum_order():
    order = os.environ.get("ROCECOLL_SUM_ORDER", "native")
    if order not in ("native", "gloo"):
        raise ValueError(f"ROCECOLL_SUM_ORDER={order!r}: expected 'native' or 'gloo'")
    return order


def _gloo_order_allreduce(native, t, size, inline=False):
    """Issues a sum all-reduce of CPU tensor ``t`` (contiguous) that adds in Gloo's order: an
    all-gather of every rank's values (size times the bytes of a ring all-reduce's traffic),
    then :func:`gloo_order_sum` into ``t`` after it ends. Returns (native work, keep, post)."""
    gathered = torch.empty((size, t.numel()), dtype=t.dtype, device=t.device)
    s, dt = _arg(t, writable=False)
    r, _ = _arg(gathered)

    def post():
        gloo_order_sum(gathered, t.detach().view(-1))

    return native.all_gather(s, r, dt, None, inline), (t, gathered, s, r), post


def _local_ip():
    ip = os.environ.get("ROCECOLL_LOCAL_IP")
    if ip:
        return ip
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "::1") or master.startswith("127."):
        return "127.0.0.1"
    return None


class ProcessGroupRoceColl(dist.ProcessGroup):
    """The ``rocecoll`` process group (see the module docs)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        # ProcessGroup.rank() / size() are calls into C++ through pybind (about 1 us each on one
        # warm rank): the per-op paths read these copies.
        self._rank, self._size = rank, size
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None
        self._c = _Native.from_store(
            store,
            rank,
            size,
            os.environ.get("ROCECOLL_TRANSPORT"),
            _local_ip(),
            secs,
            min(secs, 300.0) if secs else None,
        )
        self._done = _Completer(f"rocecoll-pg-{rank}")
        self._gloo_order = _sum_order() == "gloo"

    def getBackendName(self):
        return NAME

    # A Python process group has no C++ backend to hold its name (torch 2.5's
    # ProcessGroup::getGroupName reads it from one): keep it here, for DeviceMesh / FSDP2.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", "")

    def _issue(self, op, natives, result, keep=(), post=None, inline=False):
        """The ``Work`` of ``natives`` (native operations issued in this order), then ``post``;
        ``keep`` stays referenced until they end. ``inline`` (a blocking call whose natives were
        issued inline): when they have all ended and the completion thread has nothing older
        to complete, they are completed here, without a thread hand-off."""
        if inline and self._done.idle():
            for n in natives:
                if not n.is_completed():
                    break
            else:
                try:
                    for n in natives:
                        n.wait()
                    if post is not None:
                        post()
                except Exception as e:  # CollectiveError, or a failed copy: raised by wait()
                    return _EndedWork(result, e)
                return _EndedWork(result, None)
        return _Work(self._done, natives, post, keep, result, op, self._rank, self._size)

    def _one(self, tensors, opname):
        if len(tensors) != 1:
            raise NotImplementedError(f"rocecoll backend: {opname} of {len(tensors)} tensors per rank")
        return tensors[0]

    def allreduce(self, tensors, opts=None):
        t = self._one(tensors, "allreduce")
        op = "sum" if opts is None or opts.reduceOp == _SUM else _redop(opts, "allreduce")
        inl = _blocking(opts)
        if op == "sum" and self._gloo_order and t.dtype in _GLOO_ORDER_DTYPES and t.numel():
            _arg(t)  # the same checks (CPU, contiguous) as the native path
            native, keep, post = _gloo_order_allreduce(self._c, t, self._size, inl)
            return self._issue("allreduce", [native], tensors, keep, post, inl)
        b, dt = _arg(t)
        return self._issue("allreduce", [self._c.all_reduce(b, dt, op, None, inl)], tensors,
                           (t, b), None, inl)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _redop(opts, "allreduce_coalesced") if opts is not None else "sum"
        inl = _blocking(opts)
        natives, keep = [], []
        for t in tensors:
            b, dt = _arg(t)
            natives.append(self._c.all_reduce(b, dt, op, None, inl))
            keep.append((t, b))
        return self._issue("allreduce_coalesced", natives, tensors, keep, None, inl)

    def broadcast(self, tensors, opts):
        t = self._one(tensors, "broadcast")
        b, dt = _arg(t)
        inl = _blocking(opts)
        return self._issue("broadcast", [self._c.broadcast(b, dt, opts.rootRank, None, inl)],
                           tensors, (t, b), None, inl)

    def reduce(self, tensors, opts):
        t = self._one(tensors, "reduce")
        b, dt = _arg(t)
        op = _redop(opts, "reduce")
        inl = _blocking(opts)
        return self._issue("reduce", [self._c.reduce(b, dt, opts.rootRank, op, None, inl)],
                           tensors, (t, b), None, inl)

    def allgather(self, output_lists, inputs, opts=None):
        t = self._one(inputs, "allgather")
        outs = self._one(output_lists, "allgather")
        if len(outs) != self._size or any(o.numel() != t.numel() for o in outs):
            raise ValueError("allgather: one output tensor per rank, each as large as the input")
        flat = torch.empty(self._size * t.numel(), dtype=t.dtype, device=t.device)
        s, dt = _arg(t.contiguous(), writable=False)
        r, _ = _arg(flat)
        n = t.numel()

        def post():
            for i, o in enumerate(outs):
                o.copy_(flat[i * n:(i + 1) * n].view_as(o))

        inl = _blocking(opts)
        return self._issue("allgather", [self._c.all_gather(s, r, dt, None, inl)], output_lists,
                           (t, flat, s, r), post, inl)

    def _gather_into(self, output, input, inline=False):
        """Issues output = all ranks' input; in place when the input is this rank's block of
        the output (FSDP2's layout), from a copy when it overlaps the output otherwise."""
        nbytes = input.numel() * input.element_size()
        o0, i0 = output.data_ptr(), input.data_ptr()
        if output.is_contiguous() and input.is_contiguous() and i0 == o0 + self._rank * nbytes \
                and output.numel() == input.numel() * self._size:
            r, dt = _arg(output)
            return self._c.all_gather_in_place(r, dt, None, inline), (input, output, r)
        if i0 < o0 + output.numel() * output.element_size() and o0 < i0 + nbytes:
            input = input.clone()
        s, dt = _arg(input, writable=False)
        r, _ = _arg(output)
        return self._c.all_gather(s, r, dt, None, inline), (input, output, s, r)

    def _allgather_base(self, output, input, opts=None):
        inl = _blocking(opts)
        native, keep = self._gather_into(output, input, inl)
        return self._issue("all_gather_into_tensor", [native], [output], keep, None, inl)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        inl = _blocking(opts)
        natives, keep = [], []
        for o, i in zip(outputs, inputs):
            native, k = self._gather_into(o, i, inl)
            natives.append(native)
            keep.append(k)
        return self._issue("allgather_into_tensor_coalesced", natives, outputs, keep, None, inl)

    def reduce_scatter(self, outputs, input_lists, opts):
        out = self._one(outputs, "reduce_scatter")
        ins = self._one(input_lists, "reduce_scatter")
        if len(ins) != self._size:
            raise ValueError("reduce_scatter: one input tensor per rank")
        flat = torch.cat([i.reshape(-1) for i in ins])
        op = _redop(opts, "reduce_scatter")
        s, dt = _arg(flat, writable=False)
        r, _ = _arg(out)
        inl = _blocking(opts)
        return self._issue("reduce_scatter", [self._c.reduce_scatter(s, r, dt, op, None, inl)],
                           outputs, (flat, out, s, r), None, inl)

    def _reduce_scatter_base(self, output, input, opts):
        op = "sum" if opts.reduceOp == _SUM else _redop(opts, "reduce_scatter_tensor")
        s, dt = _arg(input, writable=False)
        r, _ = _arg(output)
        inl = _blocking(opts)
        return self._issue("reduce_scatter_tensor",
                           [self._c.reduce_scatter(s, r, dt, op, None, inl)], [output],
                           (input, output, s, r), None, inl)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        op = _redop(opts, "reduce_scatter_tensor_coalesced")
        inl = _blocking(opts)
        natives, keep = [], []
        for o, i in zip(outputs, inputs):
            s, dt = _arg(i, writable=False)
            r, _ = _arg(o)
            natives.append(self._c.reduce_scatter(s, r, dt, op, None, inl))
            keep.append((i, o, s, r))
        return self._issue("reduce_scatter_tensor_coalesced", natives, outputs, keep, None, inl)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self._size
        for splits in (output_split_sizes, input_split_sizes):
            if splits and len(set(splits)) != 1:
                raise NotImplementedError("rocecoll backend: alltoall_base with uneven splits is not implemented")
        if input.numel() % n:
            raise ValueError(f"alltoall_base: {input.numel()} elements is not {n} equal blocks")
        s, dt = _arg(input, writable=False)
        r, _ = _arg(output)
        inl = _blocking(opts)
        return self._issue("alltoall_base", [self._c.all_to_all(s, r, dt, None, inl)], [output],
                           (input, output, s, r), None, inl)

    def barrier(self, opts=None):
        inl = _blocking(opts)
        return self._issue("barrier", [self._c.barrier(None, inl)], [], (), None, inl)

    def send(self, tensors, dst, tag=0):
        t = self._one(tensors, "send")
        if tag != 0:
            raise NotImplementedError("rocecoll backend: send with a tag other than 0 is not implemented")
        b, dt = _arg(t, writable=False)
        return self._issue("send", [self._c.send(b, dt, dst, None)], tensors, (t, b))

    def recv(self, tensors, src, tag=0):
        t = self._one(tensors, "recv")
        if tag != 0:
            raise NotImplementedError("rocecoll backend: recv with a tag other than 0 is not implemented")
        b, dt = _arg(t)
        return self._issue("recv", [self._c.recv(b, dt, src, None)], tensors, (t, b))

    gather = _unsupported("gather")
    scatter = _unsupported("scatter")
    alltoall = _unsupported("alltoall")
    allgather_coalesced = _unsupported("allgather_coalesced")
    recv_anysource = _unsupported("recv_anysource")
    monitored_barrier = _unsupported("monitored_barrier")

    def abort(self):
        """Ends every pending operation with an error (from any thread)."""
        self._c.abort()


def _create(store, rank, size, timeout):
    return ProcessGroupRoceColl(store, rank, size, timeout)


def register():
    """Registers the backend ``"rocecoll"`` (idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["cpu", "cuda"])


register()

_hook_completer = None
_hook_lock = threading.Lock()


def allreduce_hook(comm: Comm, bucket):
    """DDP communication hook (``model.register_comm_hook(comm, allreduce_hook)``): averages each
    gradient bucket through ``comm`` as torch's default ``allreduce_hook`` does (divide by the
    world size, then sum), asynchronously; returns the future of the averaged buffer."""
    global _hook_completer
    with _hook_lock:
        if _hook_completer is None:
            _hook_completer = _Completer("rocecoll-ddp-hook")
    t = bucket.buffer()
    t.div_(comm.size)
    post = None
    if _sum_order() == "gloo" and t.dtype in _GLOO_ORDER_DTYPES and t.numel():
        native, k, post = _gloo_order_allreduce(comm._c, t, comm.size)
        keep = [k]
    else:
        b, dt = _arg(t)
        native = comm._c.all_reduce(b, dt, "sum", None)
        keep = [t, b]
    fut = torch.futures.Future()

    def complete():
        try:
            native.wait()
            if post is not None:
                post()
        except Exception as e:  # handed to the future, never lost
            keep.clear()
            fut.set_exception(e)
            return
        keep.clear()
        fut.set_result(t)

    _hook_completer.put(complete)
    return fut
