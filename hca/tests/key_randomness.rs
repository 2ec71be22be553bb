//! MR keys and QPNs are unpredictable (issue 17): over 10^5 random creates and destroys each,
//! a new key / QPN never names a live object, a table slot never gets the key it carried last,
//! every live key / QPN resolves to its own object and every dead one to nothing, and the bits
//! of the numbers handed out look like at least 24 independent fair coins (each bit set in 50%
//! of draws within a generous binomial bound, and so is each bit of the XOR of consecutive
//! draws, which a counter or a clock would fail).
//!
//! The object model draws from an injected [`RandomSource`]; here it is the operating system's
//! ([`OsRandom`]), as in every device. proptest picks the shape of each run (how many objects
//! stay live, how often they are destroyed); a small xorshift driven by proptest's seed picks
//! the operations, so a failure reproduces from proptest's report.
#![cfg(feature = "std")]

use std::collections::HashMap;

use hca::verbs::random::OsRandom;
use hca::{AccessFlags, Context, CqHandle, Device, PdHandle, QpCap, QpInitAttr, QpType};
use proptest::prelude::*;

const DRAWS: usize = 100_000;

/// Counts of each bit position over the draws, and of the XOR of consecutive draws.
struct BitStats {
    bits: u32,
    ones: [u64; 32],
    xor_ones: [u64; 32],
    n: u64,
    prev: Option<u32>,
}

impl BitStats {
    fn new(bits: u32) -> Self {
        BitStats {
            bits,
            ones: [0; 32],
            xor_ones: [0; 32],
            n: 0,
            prev: None,
        }
    }

    fn add(&mut self, x: u32) {
        for b in 0..self.bits as usize {
            self.ones[b] += u64::from(x >> b & 1);
            if let Some(p) = self.prev {
                self.xor_ones[b] += u64::from((x ^ p) >> b & 1);
            }
        }
        self.n += 1;
        self.prev = Some(x);
    }

    /// Each bit is set in half the draws within 7 standard deviations of Binomial(n, 1/2)
    /// (a false alarm has probability about 1e-11 per bit).
    fn check(&self, what: &str) {
        let n = self.n as f64;
        let bound = 7.0 * (n * 0.25).sqrt();
        for b in 0..self.bits as usize {
            for (name, count, draws) in [
                ("bit", self.ones[b], n),
                ("xor of consecutive draws, bit", self.xor_ones[b], n - 1.0),
            ] {
                let dev = (count as f64 - draws / 2.0).abs();
                assert!(
                    dev <= bound,
                    "{what}: {name} {b} set in {count} of {draws} draws (bound +/- {bound:.0})"
                );
            }
        }
    }
}

/// xorshift64*: drives the operation sequence only (the numbers under test come from the OS).
struct Ops(u64);

impl Ops {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn context() -> (Context, PdHandle, CqHandle) {
    let mut c = Context::new(
        Device::soft_roce([2, 0, 0, 0, 0, 1], 1500),
        Box::new(OsRandom),
    );
    let pd = c.alloc_pd().unwrap();
    let cq = c.create_cq(16).unwrap();
    (c, pd, cq)
}

/// A live set kept as a vector (O(1) random pick and swap-remove) with a map for membership.
#[derive(Default)]
struct Live {
    ids: Vec<u32>,
    slot_of: HashMap<u32, u32>,
}

impl Live {
    fn add(&mut self, id: u32, slot: u32) {
        assert!(
            self.slot_of.insert(id, slot).is_none(),
            "{id:#x} handed out while live"
        );
        self.ids.push(id);
    }

    fn take(&mut self, at: usize) -> (u32, u32) {
        let id = self.ids.swap_remove(at);
        (id, self.slot_of.remove(&id).unwrap())
    }
}

/// Runs `DRAWS` creates with destroys mixed in so that about `target` objects stay live.
/// `create` returns (id, slot); `destroy` destroys; `resolves` says whether an id resolves and
/// to which slot. Checks the invariants of the module docs and returns the bit statistics.
#[allow(clippy::too_many_arguments)]
fn churn(
    seed: u64,
    target: usize,
    bits: u32,
    mut create: impl FnMut() -> (u32, u32),
    mut destroy: impl FnMut(u32),
    resolves: impl Fn(u32) -> Option<u32>,
) -> BitStats {
    let mut ops = Ops(seed | 1);
    let mut stats = BitStats::new(bits);
    let mut live = Live::default();
    let mut last_of_slot: HashMap<u32, u32> = HashMap::new();
    let mut dead: Vec<u32> = Vec::new();
    let mut created = 0;
    while created < DRAWS {
        let grow = live.ids.is_empty() || ops.below(2 * target.max(1)) >= live.ids.len();
        if grow {
            let (id, slot) = create();
            created += 1;
            assert_eq!(u64::from(id) >> bits, 0, "{id:#x} wider than {bits} bits");
            if let Some(last) = last_of_slot.insert(slot, id) {
                assert_ne!(last, id, "slot {slot} got its last id again");
            }
            live.add(id, slot);
            assert_eq!(resolves(id), Some(slot));
            stats.add(id);
        } else {
            let (id, _) = live.take(ops.below(live.ids.len()));
            destroy(id);
            assert_eq!(resolves(id), None, "{id:#x} resolves after destroy");
            dead.push(id);
        }
        // Spot checks: a live id and a dead one (unless drawn again since).
        if !live.ids.is_empty() {
            let id = live.ids[ops.below(live.ids.len())];
            assert_eq!(resolves(id), live.slot_of.get(&id).copied());
        }
        if !dead.is_empty() {
            let id = dead[ops.below(dead.len())];
            if !live.slot_of.contains_key(&id) {
                assert_eq!(resolves(id), None, "dead {id:#x} resolves");
            }
        }
    }
    for id in &live.ids {
        assert_eq!(resolves(*id), live.slot_of.get(id).copied());
    }
    stats
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn mr_keys_are_random_unique_and_never_repeat_in_a_slot(
        seed in any::<u64>(),
        target in prop_oneof![Just(1usize), 1usize..64, 64usize..20_000],
    ) {
        let (ctx, pd, _) = context();
        let ctx = std::cell::RefCell::new(ctx);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let stats = churn(
            seed,
            target,
            32,
            || {
                let mut c = ctx.borrow_mut();
                let mr = c.reg_mr(pd, 0x1000, 4096, access).unwrap();
                assert_eq!(mr.rkey(), mr.lkey());
                (mr.lkey(), mr.slot())
            },
            |k| ctx.borrow_mut().dereg_mr(k).unwrap(),
            |k| {
                let c = ctx.borrow();
                let mr = c.mrs().lookup_rkey(k)?;
                assert_eq!(mr.lkey(), k);
                Some(mr.slot())
            },
        );
        stats.check("MR key");
    }

    #[test]
    fn qpns_are_random_unique_and_24_bits(
        seed in any::<u64>(),
        target in prop_oneof![Just(1usize), 1usize..64, 64usize..20_000],
    ) {
        let (ctx, pd, cq) = context();
        let ctx = std::cell::RefCell::new(ctx);
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let stats = churn(
            seed,
            target,
            24,
            || {
                let mut c = ctx.borrow_mut();
                let qpn = c.create_qp(pd, &init).unwrap();
                assert!(qpn >= hca::verbs::qp::MIN_QPN, "QPN {qpn:#x} is reserved");
                (qpn, c.qp_slot(qpn).unwrap())
            },
            |q| ctx.borrow_mut().destroy_qp(q).unwrap(),
            |q| {
                let c = ctx.borrow();
                let qp = c.qp(q)?;
                assert_eq!(qp.qpn(), q);
                c.qp_slot(q)
            },
        );
        stats.check("QPN");
        let c = ctx.borrow();
        assert_eq!(c.qp_count() as usize, c.qpns().count());
        assert_eq!(c.connected_qp_count(), c.qp_count(), "all RC");
    }
}
