//! Non-blocking collectives: every operation of a [`Communicator`] issued at once, returning a
//! [`Work`] handle (`wait`, `test`, `wait_timeout`), as `torch.distributed`'s `async_op=True`
//! and MPI's `MPI_Iallreduce` do.
//!
//! An [`AsyncCommunicator`] owns a communicator and one progress thread. Operations run on that
//! thread one at a time **in issue order** (every rank issues the same sequence, so the ranks
//! agree on it without a round trip, as in NCCL, where one stream orders a communicator's
//! kernels); several may be in flight: while the thread runs the first, the caller issues the
//! next ones and computes. Each operation owns its buffers (any `AsMut<[u8]>` / `AsRef<[u8]>`
//! that is `Send + 'static`: a `Vec<u8>`, or a binding's handle to memory it keeps alive) and
//! [`Work::wait`] gives them back.
//!
//! [`AsyncCommunicator::abort`], callable from any thread (it takes `&self`), ends the operation
//! in progress within [`crate::algorithms::WAIT_SLICE`] of its current wait
//! ([`CollError::Cancelled`]) and every queued one at once ([`CollError::Aborted`]), and tells the
//! peers, whose operations then fail too. A per-operation timeout bounds how long any wait of
//! one operation may go without progress.
//!
//! [`AsyncCommunicator::run_or_submit`] runs an operation on the calling thread instead when
//! nothing is pending (no operation queued or running): a blocking call then costs no thread
//! hand-off (no wake-up of the progress thread, no wake-up of the caller when it ends), and the
//! issue order still holds, because an operation issued later, from any thread, waits for the
//! communicator's lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::comm::{AbortHandle, Communicator};
use crate::datatype::{DataType, RedOp};
use crate::error::CollError;
use crate::transport::CollKind;

/// A queued operation: runs with the communicator locked and returns what completes its handle,
/// which the progress thread runs after unlocking (so that a waiter it wakes finds the
/// communicator free).
type Job = Box<dyn FnOnce(&mut Communicator) -> Box<dyn FnOnce() + Send> + Send>;

/// What the progress thread and the issuing threads share.
struct Shared {
    comm: Mutex<Communicator>,
    /// Jobs sent to the progress thread and not yet ended.
    pending: AtomicUsize,
    /// Operations run on the calling thread ([`AsyncCommunicator::run_or_submit`]).
    inline_ops: AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Communicator> {
        self.comm.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Slot<T> {
    result: Mutex<Option<Result<T, CollError>>>,
    done: Condvar,
}

/// The handle of one non-blocking operation (`torch.distributed.Work`, `MPI_Request`).
/// Dropping it does not cancel the operation (its buffers are dropped when it ends).
pub struct Work<T> {
    slot: Arc<Slot<T>>,
}

impl<T> core::fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Work")
            .field("completed", &self.test())
            .finish()
    }
}

impl<T> Work<T> {
    /// A handle whose operation has already ended with `r`.
    fn ended(r: Result<T, CollError>) -> Work<T> {
        Work {
            slot: Arc::new(Slot {
                result: Mutex::new(Some(r)),
                done: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<T, CollError>>> {
        self.slot
            .result
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the operation has ended (successfully or not); never blocks (`MPI_Test`).
    pub fn test(&self) -> bool {
        self.lock().is_some()
    }

    /// Waits at most `timeout` for the operation to end; `true` when it has (then
    /// [`wait`](Self::wait) returns at once). The operation goes on either way.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let guard = self.lock();
        let (guard, _) = self
            .slot
            .done
            .wait_timeout_while(guard, timeout, |r| r.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard.is_some()
    }

    /// Waits for the operation to end and returns its buffers, or its error. The wait is
    /// bounded: every operation ends within its timeout without progress, or after an abort.
    ///
    /// # Errors
    /// The operation's [`CollError`].
    pub fn wait(self) -> Result<T, CollError> {
        let guard = self.lock();
        let mut guard = self
            .slot
            .done
            .wait_while(guard, |r| r.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        guard.take().unwrap_or_else(|| {
            Err(CollError::Aborted {
                op: CollKind::Barrier,
                cause: "the result was already taken".into(),
            })
        })
    }
}

/// Fills its slot when dropped without a result (the progress thread gone): a waiter never
/// waits for a result that cannot come.
struct Completer<T> {
    slot: Arc<Slot<T>>,
    op: CollKind,
    sent: bool,
}

impl<T> Completer<T> {
    fn complete(mut self, r: Result<T, CollError>) {
        self.put(r);
    }

    fn put(&mut self, r: Result<T, CollError>) {
        *self
            .slot
            .result
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(r);
        self.slot.done.notify_all();
        self.sent = true;
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if !self.sent {
            let op = self.op;
            self.put(Err(CollError::Aborted {
                op,
                cause: "the communicator's progress thread ended before the operation ran".into(),
            }));
        }
    }
}

/// A [`Communicator`] whose operations are issued without blocking (see the module docs).
pub struct AsyncCommunicator {
    rank: usize,
    nranks: usize,
    abort: AbortHandle,
    shared: Arc<Shared>,
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for AsyncCommunicator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncCommunicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .finish()
    }
}

impl AsyncCommunicator {
    /// Moves `comm` onto a new progress thread.
    ///
    /// # Errors
    /// The OS error when the thread cannot start.
    pub fn new(comm: Communicator) -> std::io::Result<AsyncCommunicator> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (rank, nranks, abort) = (comm.rank(), comm.nranks(), comm.abort_handle());
        let shared = Arc::new(Shared {
            comm: Mutex::new(comm),
            pending: AtomicUsize::new(0),
            inline_ops: AtomicU64::new(0),
        });
        let progress = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("coll-progress-{rank}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let complete = job(&mut progress.lock());
                    progress.pending.fetch_sub(1, Ordering::AcqRel);
                    complete();
                }
            })?;
        Ok(AsyncCommunicator {
            rank,
            nranks,
            abort,
            shared,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Ends the operation in progress and every queued one with an error, from any thread, and
    /// tells the peers (see the module docs). Later operations fail with
    /// [`CollError::Aborted`].
    pub fn abort(&self) {
        self.abort.abort();
        self.queue(Box::new(|c: &mut Communicator| {
            c.abort_if_requested();
            Box::new(|| ())
        }));
    }

    /// Queues `job` for the progress thread (counted as pending until it ends). A send fails
    /// only when the thread is gone: the job (and the completer it holds) is dropped, which fills
    /// its slot with an error.
    fn queue(&self, job: Job) {
        if let Some(tx) = &self.jobs {
            self.shared.pending.fetch_add(1, Ordering::AcqRel);
            if tx.send(job).is_err() {
                self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// How many operations ran on their caller's thread ([`run_or_submit`](Self::run_or_submit))
    /// rather than on the progress thread.
    pub fn inline_ops(&self) -> u64 {
        self.shared.inline_ops.load(Ordering::Relaxed)
    }

    /// A handle that aborts this communicator from anywhere (a watchdog thread).
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Issues `f` to run on the progress thread after every operation issued before it, with
    /// the per-operation `timeout` (`None`: the communicator's) and returns its handle. The
    /// building block of the typed operations below.
    pub fn submit<T: Send + 'static>(
        &self,
        op: CollKind,
        timeout: Option<Duration>,
        f: impl FnOnce(&mut Communicator) -> Result<T, CollError> + Send + 'static,
    ) -> Work<T> {
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        let completer = Completer {
            slot: slot.clone(),
            op,
            sent: false,
        };
        self.queue(Box::new(move |comm: &mut Communicator| {
            let r = run_op(comm, op, timeout, f);
            Box::new(move || completer.complete(r))
        }));
        Work { slot }
    }

    /// Runs `f` at once on the calling thread when no operation is pending (none queued or
    /// running on the progress thread), with the per-operation `timeout`, and returns its
    /// already-ended handle; otherwise issues it as [`submit`](Self::submit) does. Issue order
    /// holds either way (see the module docs). For blocking calls: the caller waits for the
    /// operation anyway, and this way without waking, or waiting for, another thread.
    pub fn run_or_submit<T: Send + 'static>(
        &self,
        op: CollKind,
        timeout: Option<Duration>,
        f: impl FnOnce(&mut Communicator) -> Result<T, CollError> + Send + 'static,
    ) -> Work<T> {
        if self.jobs.is_some() && self.shared.pending.load(Ordering::Acquire) == 0 {
            // `try_lock`: the progress thread holds the lock only while it runs a job, which
            // `pending` then counts; a thread of the caller's own running an inline operation
            // holds it too, and then this one is queued behind it.
            if let Ok(mut comm) = self.shared.comm.try_lock() {
                if self.shared.pending.load(Ordering::Acquire) == 0 {
                    self.shared.inline_ops.fetch_add(1, Ordering::Relaxed);
                    return Work::ended(run_op(&mut comm, op, timeout, f));
                }
            }
        }
        self.submit(op, timeout, f)
    }

    /// Non-blocking in-place all-reduce of `count` elements of `buf`.
    pub fn all_reduce<B: AsMut<[u8]> + Send + 'static>(
        &self,
        mut buf: B,
        count: usize,
        datatype: DataType,
        op: RedOp,
        timeout: Option<Duration>,
    ) -> Work<B> {
        self.submit(CollKind::AllReduce, timeout, move |c| {
            c.all_reduce_in_place(buf.as_mut(), count, datatype, op)
                .map(|()| buf)
        })
    }

    /// Non-blocking in-place broadcast from `root`.
    pub fn broadcast<B: AsMut<[u8]> + Send + 'static>(
        &self,
        mut buf: B,
        count: usize,
        datatype: DataType,
        root: usize,
        timeout: Option<Duration>,
    ) -> Work<B> {
        self.submit(CollKind::Broadcast, timeout, move |c| {
            c.broadcast_in_place(buf.as_mut(), count, datatype, root)
                .map(|()| buf)
        })
    }

    /// Non-blocking in-place reduce to `root`.
    pub fn reduce<B: AsMut<[u8]> + Send + 'static>(
        &self,
        mut buf: B,
        count: usize,
        datatype: DataType,
        op: RedOp,
        root: usize,
        timeout: Option<Duration>,
    ) -> Work<B> {
        self.submit(CollKind::Reduce, timeout, move |c| {
            c.reduce_in_place(buf.as_mut(), count, datatype, op, root)
                .map(|()| buf)
        })
    }

    /// Non-blocking all-gather: `count` elements of `send` from every rank into `recv`
    /// (`nranks * count` elements, rank order).
    pub fn all_gather<S, B>(
        &self,
        send: S,
        mut recv: B,
        count: usize,
        datatype: DataType,
        timeout: Option<Duration>,
    ) -> Work<(S, B)>
    where
        S: AsRef<[u8]> + Send + 'static,
        B: AsMut<[u8]> + Send + 'static,
    {
        self.submit(CollKind::AllGather, timeout, move |c| {
            c.all_gather(send.as_ref(), recv.as_mut(), count, datatype)
                .map(|()| (send, recv))
        })
    }

    /// Non-blocking reduce-scatter: `send` holds `nranks * count` elements, `recv` gets this
    /// rank's `count`-element block of the reduction.
    pub fn reduce_scatter<S, B>(
        &self,
        send: S,
        mut recv: B,
        count: usize,
        datatype: DataType,
        op: RedOp,
        timeout: Option<Duration>,
    ) -> Work<(S, B)>
    where
        S: AsRef<[u8]> + Send + 'static,
        B: AsMut<[u8]> + Send + 'static,
    {
        self.submit(CollKind::ReduceScatter, timeout, move |c| {
            c.reduce_scatter(send.as_ref(), recv.as_mut(), count, datatype, op)
                .map(|()| (send, recv))
        })
    }

    /// Non-blocking all-to-all: block `j` (`count` elements) of `send` goes to rank `j`, block
    /// `i` of `recv` comes from rank `i`.
    pub fn all_to_all<S, B>(
        &self,
        send: S,
        mut recv: B,
        count: usize,
        datatype: DataType,
        timeout: Option<Duration>,
    ) -> Work<(S, B)>
    where
        S: AsRef<[u8]> + Send + 'static,
        B: AsMut<[u8]> + Send + 'static,
    {
        self.submit(CollKind::AllToAll, timeout, move |c| {
            c.all_to_all(send.as_ref(), recv.as_mut(), count, datatype)
                .map(|()| (send, recv))
        })
    }

    /// Non-blocking send of `count` elements to `peer`.
    pub fn send<S: AsRef<[u8]> + Send + 'static>(
        &self,
        buf: S,
        count: usize,
        datatype: DataType,
        peer: usize,
        timeout: Option<Duration>,
    ) -> Work<S> {
        self.submit(CollKind::SendRecv, timeout, move |c| {
            c.send(buf.as_ref(), count, datatype, peer).map(|()| buf)
        })
    }

    /// Non-blocking receive of `count` elements from `peer`.
    pub fn recv<B: AsMut<[u8]> + Send + 'static>(
        &self,
        mut buf: B,
        count: usize,
        datatype: DataType,
        peer: usize,
        timeout: Option<Duration>,
    ) -> Work<B> {
        self.submit(CollKind::SendRecv, timeout, move |c| {
            c.recv(buf.as_mut(), count, datatype, peer).map(|()| buf)
        })
    }

    /// Non-blocking barrier.
    pub fn barrier(&self, timeout: Option<Duration>) -> Work<()> {
        self.submit(CollKind::Barrier, timeout, |c| c.barrier())
    }

    /// Stops taking operations, waits for every issued one to end (each is bounded by its
    /// timeout) and stops the progress thread; the communicator closes. Operations issued
    /// later fail with [`CollError::Aborted`]. Idempotent; dropping does the same.
    pub fn close(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Waits for every issued operation to end and returns the communicator (to use it
    /// blocking again, or split it).
    ///
    /// # Errors
    /// When the progress thread panicked (a bug), as a [`CollError::Aborted`].
    pub fn into_inner(mut self) -> Result<Communicator, CollError> {
        self.jobs.take();
        let joined = self.thread.take().map(JoinHandle::join);
        let rank = self.rank;
        let shared = self.shared.clone();
        drop(self);
        match (joined, Arc::try_unwrap(shared)) {
            (Some(Ok(())), Ok(shared)) => Ok(shared
                .comm
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner)),
            _ => Err(CollError::Aborted {
                op: CollKind::Barrier,
                cause: format!("the progress thread of rank {rank} panicked"),
            }),
        }
    }
}

/// Runs `f` on `comm` with the per-operation `timeout` (`None`: the communicator's).
fn run_op<T>(
    comm: &mut Communicator,
    op: CollKind,
    timeout: Option<Duration>,
    f: impl FnOnce(&mut Communicator) -> Result<T, CollError>,
) -> Result<T, CollError> {
    let Some(t) = timeout else {
        return f(comm);
    };
    let before = comm.config().timeout;
    match comm.set_timeout(t) {
        Ok(()) => {
            let r = f(comm);
            let _ = comm.set_timeout(before);
            r
        }
        Err(e) => Err(CollError::InvalidArgument {
            op,
            what: e.to_string(),
        }),
    }
}

impl Drop for AsyncCommunicator {
    /// Lets the issued operations end (each is bounded by its timeout), then closes the
    /// communicator.
    fn drop(&mut self) {
        self.close();
    }
}
