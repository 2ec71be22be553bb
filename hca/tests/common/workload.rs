//! Random RC workloads (SEND, SEND with immediate, RDMA WRITE, WRITE with immediate, RDMA READ,
//! fetch-and-add, compare-and-swap) from side A to side B, a sequential model of what they must
//! do to memory, and a driver that runs them through a fabric.

use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::*;
use hca::{WcOpcode, WcStatus};

/// Layout of A's memory: source data, then READ destinations, then atomic results.
pub const A_SRC: usize = 0;
pub const A_SRC_LEN: usize = 1 << 20;
pub const A_READ: usize = 1 << 20;
pub const A_READ_LEN: usize = 1 << 20;
pub const A_ATOMIC: usize = 2 << 20;
pub const A_ATOMIC_LEN: usize = 64 << 10;
pub const A_LEN: usize = A_ATOMIC + A_ATOMIC_LEN;
/// Layout of B's memory: the RDMA region (WRITE targets, READ sources), atomic words, receive
/// buffers.
pub const B_RDMA: usize = 0;
pub const B_RDMA_LEN: usize = 1 << 20;
pub const B_WORDS: usize = 1 << 20;
pub const B_WORDS_N: usize = 64;
pub const B_RECV: usize = (1 << 20) + 4096;
pub const B_RECV_LEN: usize = 2 << 20;
pub const B_LEN: usize = B_RECV + B_RECV_LEN;

/// One operation: `local` is the A-side byte range (split into SGEs of these lengths).
#[derive(Debug, Clone)]
pub enum Op {
    Send {
        src: usize,
        splits: Vec<u32>,
        imm: Option<u32>,
    },
    Write {
        src: usize,
        splits: Vec<u32>,
        dst: usize,
        imm: Option<u32>,
    },
    Read {
        dst: usize,
        splits: Vec<u32>,
        src: usize,
    },
    FetchAdd {
        word: usize,
        add: u64,
        result: usize,
    },
    CmpSwap {
        word: usize,
        compare: u64,
        swap: u64,
        result: usize,
    },
}

impl Op {
    fn len(&self) -> u32 {
        match self {
            Op::Send { splits, .. } | Op::Write { splits, .. } | Op::Read { splits, .. } => {
                splits.iter().sum()
            }
            _ => 8,
        }
    }

    /// Whether B completes a receive WQE for it.
    pub fn consumes_recv(&self) -> bool {
        matches!(self, Op::Send { .. } | Op::Write { imm: Some(_), .. })
    }
}

/// Random operations: `count` of them, sizes mostly small, sometimes up to `max_len` bytes.
pub fn generate(seed: u64, count: usize, max_len: u32) -> Vec<Op> {
    generate_sized(seed, count, max_len, 2048)
}

/// As [`generate`], with "small" messages up to `small` bytes.
pub fn generate_sized(seed: u64, count: usize, max_len: u32, small: u32) -> Vec<Op> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut read_at = 0usize;
    let mut result_at = 0usize;
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let len: u32 = match rng.random_range(0..10) {
            0 => 0,
            1..=6 => rng.random_range(1..=small.max(1)),
            7 | 8 => rng.random_range(1..=(16 * small).min(max_len.max(1))),
            _ => rng.random_range(0..=max_len),
        };
        let splits = split(&mut rng, len);
        let kind = rng.random_range(0..9);
        let op = match kind {
            0 | 1 => Op::Send {
                src: rng.random_range(0..=A_SRC_LEN - len as usize),
                splits,
                imm: (kind == 1).then(|| rng.random()),
            },
            2..=4 => Op::Write {
                src: rng.random_range(0..=A_SRC_LEN - len as usize),
                splits,
                dst: rng.random_range(0..=B_RDMA_LEN - len as usize),
                imm: (kind == 4).then(|| rng.random()),
            },
            5 | 6 => {
                if read_at + len as usize > A_READ_LEN {
                    read_at = 0;
                }
                let dst = A_READ + read_at;
                read_at += len as usize;
                Op::Read {
                    dst,
                    splits,
                    src: rng.random_range(0..=B_RDMA_LEN - len as usize),
                }
            }
            7 => {
                let result = A_ATOMIC + result_at % A_ATOMIC_LEN;
                result_at += 8;
                Op::FetchAdd {
                    word: B_WORDS + 8 * rng.random_range(0..B_WORDS_N),
                    add: rng.random_range(1..1000),
                    result,
                }
            }
            _ => {
                let result = A_ATOMIC + result_at % A_ATOMIC_LEN;
                result_at += 8;
                Op::CmpSwap {
                    word: B_WORDS + 8 * rng.random_range(0..B_WORDS_N),
                    // Resolved below: half the CASs compare equal.
                    compare: u64::from(rng.random::<bool>()),
                    swap: rng.random(),
                    result,
                }
            }
        };
        ops.push(op);
    }
    // Resolve the CAS compare values against the words' values at that point of the sequence.
    let (_, b) = initial(seed);
    let mut words: Vec<u64> = (0..B_WORDS_N)
        .map(|i| u64::from_ne_bytes(b[B_WORDS + 8 * i..B_WORDS + 8 * i + 8].try_into().unwrap()))
        .collect();
    for op in &mut ops {
        match op {
            Op::FetchAdd { word, add, .. } => {
                let w = &mut words[(*word - B_WORDS) / 8];
                *w = w.wrapping_add(*add);
            }
            Op::CmpSwap {
                word,
                compare,
                swap,
                ..
            } => {
                let w = &mut words[(*word - B_WORDS) / 8];
                *compare = if *compare == 1 { *w } else { !*w };
                if *w == *compare {
                    *w = *swap;
                }
            }
            _ => {}
        }
    }
    ops
}

fn split(rng: &mut ChaCha8Rng, len: u32) -> Vec<u32> {
    let parts = rng.random_range(1..=4u32).min(len.max(1));
    let mut cuts: Vec<u32> = (1..parts).map(|_| rng.random_range(0..=len)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts.into_iter().chain(std::iter::once(len)) {
        out.push(c - prev);
        prev = c;
    }
    out
}

/// The initial contents of A's and B's memory.
pub fn initial(seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut a = vec![0u8; A_LEN];
    let mut b = vec![0u8; B_LEN];
    rng.fill(&mut a[..A_SRC_LEN]);
    rng.fill(&mut b[..B_RDMA_LEN + 8 * B_WORDS_N]);
    (a, b)
}

/// What a receive completion on B must say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvExpect {
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub opcode: WcOpcode,
}

/// The sequential model: applies the operations in order to copies of the memories; returns
/// the expected receive completions. Receive buffers are assigned in order from B_RECV.
pub fn model(ops: &[Op], a: &mut [u8], b: &mut [u8]) -> Vec<RecvExpect> {
    let mut recv_at = 0usize;
    let mut recvs = Vec::new();
    for op in ops {
        let len = op.len() as usize;
        match *op {
            Op::Send { src, imm, .. } => {
                let (off, _) = recv_slot(&mut recv_at, len);
                let data = a[src..src + len].to_vec();
                b[B_RECV + off..B_RECV + off + len].copy_from_slice(&data);
                recvs.push(RecvExpect {
                    byte_len: len as u32,
                    imm,
                    opcode: WcOpcode::Recv,
                });
            }
            Op::Write { src, dst, imm, .. } => {
                let data = a[src..src + len].to_vec();
                b[dst..dst + len].copy_from_slice(&data);
                if imm.is_some() {
                    recv_slot(&mut recv_at, 0);
                    recvs.push(RecvExpect {
                        byte_len: len as u32,
                        imm,
                        opcode: WcOpcode::RecvRdmaWithImm,
                    });
                }
            }
            Op::Read { dst, src, .. } => {
                let data = b[src..src + len].to_vec();
                a[dst..dst + len].copy_from_slice(&data);
            }
            Op::FetchAdd { word, add, result } => {
                let old = u64::from_ne_bytes(b[word..word + 8].try_into().unwrap());
                b[word..word + 8].copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
                a[result..result + 8].copy_from_slice(&old.to_ne_bytes());
            }
            Op::CmpSwap {
                word,
                compare,
                swap,
                result,
            } => {
                let old = u64::from_ne_bytes(b[word..word + 8].try_into().unwrap());
                if old == compare {
                    b[word..word + 8].copy_from_slice(&swap.to_ne_bytes());
                }
                a[result..result + 8].copy_from_slice(&old.to_ne_bytes());
            }
        }
    }
    recvs
}

/// Receive buffers are 64 KiB-aligned slots of B_RECV, or one 1 MiB slot for long messages.
fn recv_slot(at: &mut usize, len: usize) -> (usize, usize) {
    let size = len.div_ceil(65536).max(1) * 65536;
    if *at + size > B_RECV_LEN {
        *at = 0;
    }
    let off = *at;
    *at += size;
    (off, size)
}

/// Prints what a failed run left behind: diagnostics, states, counters.
fn dump(f: &mut Fabric, a: &Peer, b: &Peer) {
    for (name, p) in [("A", a), ("B", b)] {
        while let Some(d) = f.node_mut(p.node).poll_diag() {
            eprintln!("{name} diag {d:?}");
        }
        let h = f.node(p.node);
        eprintln!(
            "{name} state {:?} counters {:?}",
            h.context().qp(p.qpn).map(|q| q.state()),
            h.counters()
        );
    }
    eprintln!("fabric {:?} at {}", f.stats(), f.now());
}

type SendWc = (u64, WcStatus, WcOpcode, u32);
type RecvWc = (u64, WcStatus, WcOpcode, u32, Option<u32>);

/// Polls both sides' CQs (both must be drained, or they overrun).
fn collect(f: &mut Fabric, a: &Peer, b: &Peer, a_wcs: &mut Vec<SendWc>, b_wcs: &mut Vec<RecvWc>) {
    a_wcs.extend(
        poll(f, a)
            .into_iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len)),
    );
    b_wcs.extend(
        poll(f, b)
            .into_iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data)),
    );
}

/// The result of running a workload.
pub struct Outcome {
    pub a_mem: Vec<u8>,
    pub b_mem: Vec<u8>,
    pub a_wcs: Vec<SendWc>,
    pub b_wcs: Vec<RecvWc>,
    pub virtual_time: Duration,
    pub fabric: hca::fabric::FabricStats,
    pub a_counters: hca::Counters,
    pub b_counters: hca::Counters,
}

thread_local! {
    /// A packet tap the next [`run`] on this thread installs (for debugging a failing seed).
    pub static TAP: std::cell::RefCell<Option<Box<dyn hca::fabric::Tap>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `ops` from A to B through a fabric with `o`'s faults. Panics (test failure) if the run
/// does not finish within `max` virtual time.
pub fn run(ops: &[Op], o: &Opts, max: Duration) -> Outcome {
    let mut o = o.clone();
    o.mem_len = A_LEN.max(B_LEN);
    let (mut f, a, b) = pair(&o);
    if let Some(tap) = TAP.with(|t| t.borrow_mut().take()) {
        f.set_tap(Some(tap));
    }
    let (init_a, init_b) = initial(o.seed);
    a.write(0, &init_a);
    b.write(0, &init_b);
    let mut a_wcs = Vec::new();
    let mut b_wcs = Vec::new();
    let mut recv_at = 0usize;
    let expected_recvs = ops.iter().filter(|op| op.consumes_recv()).count();
    let start = f.now();
    for (i, op) in ops.iter().enumerate() {
        let wr_id = i as u64;
        let mut sges = Vec::new();
        let (local, splits) = match op {
            Op::Send { src, splits, .. } | Op::Write { src, splits, .. } => (*src, splits.clone()),
            Op::Read { dst, splits, .. } => (*dst, splits.clone()),
            Op::FetchAdd { result, .. } | Op::CmpSwap { result, .. } => (*result, vec![8]),
        };
        let mut at = local as u64;
        for s in splits {
            sges.push(a.sge(at, s));
            at += u64::from(s);
        }
        let rkey = b.mr.rkey();
        let send_op = match *op {
            Op::Send { imm: None, .. } => SendOp::Send,
            Op::Send {
                imm: Some(imm_data),
                ..
            } => SendOp::SendWithImm { imm_data },
            Op::Write { dst, imm: None, .. } => SendOp::RdmaWrite {
                remote_addr: b.addr(dst as u64),
                rkey,
            },
            Op::Write {
                dst,
                imm: Some(imm_data),
                ..
            } => SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(dst as u64),
                rkey,
                imm_data,
            },
            Op::Read { src, .. } => SendOp::RdmaRead {
                remote_addr: b.addr(src as u64),
                rkey,
            },
            Op::FetchAdd { word, add, .. } => SendOp::AtomicFetchAndAdd {
                remote_addr: b.addr(word as u64),
                rkey,
                add,
            },
            Op::CmpSwap {
                word,
                compare,
                swap,
                ..
            } => SendOp::AtomicCmpAndSwp {
                remote_addr: b.addr(word as u64),
                rkey,
                compare,
                swap,
            },
        };
        if op.consumes_recv() {
            let len = if matches!(op, Op::Send { .. }) {
                op.len() as usize
            } else {
                0
            };
            let (off, size) = recv_slot(&mut recv_at, len);
            // Wait for room in B's receive queue.
            loop {
                let r = f.node_mut(b.node).post_recv(
                    b.qpn,
                    &hca::RecvWr {
                        wr_id,
                        sg_list: &[b.sge((B_RECV + off) as u64, size as u32)],
                    },
                );
                if r.is_ok() {
                    break;
                }
                let before = b_wcs.len();
                let res = f.run_until(
                    |f| {
                        collect(f, &a, &b, &mut a_wcs, &mut b_wcs);
                        b_wcs.len() > before
                    },
                    max,
                );
                if res.is_err() {
                    dump(&mut f, &a, &b);
                }
                assert!(res.is_ok(), "receive queue never drained: {res:?}");
            }
        }
        // A READ's data is read when its responses are built, so a later WRITE to the same
        // bytes must wait for it: the FENCE flag (IBTA vol. 1 §10.8.3.3). Only READs among the
        // last `depth` WRs can still be outstanding.
        let fence = match *op {
            Op::Write { dst, .. } => ops[i.saturating_sub(o.depth as usize)..i].iter().any(|p| {
                matches!(*p, Op::Read { src, .. }
                    if src < dst + op.len() as usize && dst < src + p.len() as usize)
            }),
            _ => false,
        };
        let mut send_flags = hca::SendFlags::SIGNALED;
        if fence {
            send_flags |= hca::SendFlags::FENCE;
        }
        let wr = hca::SendWr {
            wr_id,
            sg_list: &sges,
            op: send_op,
            send_flags,
        };
        loop {
            match f.node_mut(a.node).post_send(a.qpn, &wr) {
                Ok(()) => break,
                Err(e) => assert_eq!(e.errno(), hca::errno::ENOMEM, "{e}"),
            }
            let before = a_wcs.len();
            let res = f.run_until(
                |f| {
                    collect(f, &a, &b, &mut a_wcs, &mut b_wcs);
                    a_wcs.len() > before
                },
                max,
            );
            if res.is_err() {
                dump(&mut f, &a, &b);
            }
            assert!(res.is_ok(), "send queue never drained: {res:?}");
        }
    }
    let res = f.run_until(
        |f| {
            collect(f, &a, &b, &mut a_wcs, &mut b_wcs);
            a_wcs.len() >= ops.len() && b_wcs.len() >= expected_recvs
        },
        max,
    );
    if res.is_err() {
        dump(&mut f, &a, &b);
        eprintln!("A wcs tail {:?}", &a_wcs[a_wcs.len().saturating_sub(5)..]);
    }
    assert!(
        res.is_ok(),
        "{res:?}: A {} of {} completions, B {} of {}; A {:?} B {:?} fabric {:?}",
        a_wcs.len(),
        ops.len(),
        b_wcs.len(),
        expected_recvs,
        f.node(a.node).counters(),
        f.node(b.node).counters(),
        f.stats()
    );
    Outcome {
        a_mem: a.read(0, A_LEN),
        b_mem: b.read(0, B_LEN),
        a_wcs,
        b_wcs,
        virtual_time: f.now() - start,
        fabric: f.stats(),
        a_counters: f.node(a.node).counters().clone(),
        b_counters: f.node(b.node).counters().clone(),
    }
}

/// Checks an outcome against the sequential model.
pub fn check(ops: &[Op], seed: u64, out: &Outcome) {
    let (mut a, mut b) = initial(seed);
    let recvs = model(ops, &mut a, &mut b);
    assert_eq!(out.a_wcs.len(), ops.len());
    for (i, (wr_id, status, _, _)) in out.a_wcs.iter().enumerate() {
        assert_eq!(
            (*wr_id, *status),
            (i as u64, WcStatus::Success),
            "send completion {i}"
        );
    }
    assert_eq!(out.b_wcs.len(), recvs.len());
    for (got, want) in out.b_wcs.iter().zip(&recvs) {
        assert_eq!(got.1, WcStatus::Success);
        assert_eq!(
            (got.2, got.3, got.4),
            (want.opcode, want.byte_len, want.imm),
            "{got:?}"
        );
    }
    let first_diff = |x: &[u8], y: &[u8]| x.iter().zip(y).position(|(p, q)| p != q);
    assert!(
        out.a_mem == a,
        "A memory differs from the model at {:?}",
        first_diff(&out.a_mem, &a)
    );
    assert!(
        out.b_mem == b,
        "B memory differs from the model at {:?}",
        first_diff(&out.b_mem, &b)
    );
}
