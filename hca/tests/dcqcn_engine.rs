//! DCQCN in the engine (issue 22): the reaction point paces a QP's requester after CNPs, and
//! with DCQCN off (or on but never notified) the engine sends exactly what it sent before.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hca::fabric::{Faults, Tap, WirePacket};
use hca::{EngineConfig, Instant, SendOp};

/// FNV-1a over every packet the fabric carries: time, ends, marks and bytes.
#[derive(Clone, Default)]
struct TraceDigest(Arc<Mutex<(u64, u64)>>);

impl Tap for TraceDigest {
    fn on_packet(&mut self, now: Instant, p: &mut WirePacket) -> bool {
        let mut g = self.0.lock().unwrap();
        let (mut h, n) = *g;
        if n == 0 {
            h = 0xcbf2_9ce4_8422_2325;
        }
        let mut eat = |b: &[u8]| {
            for &x in b {
                h ^= u64::from(x);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(&now.as_nanos().to_le_bytes());
        eat(&[p.from.0 as u8, p.to.0 as u8, p.ecn as u8, p.dscp]);
        eat(&p.src_port.to_le_bytes());
        eat(&p.data);
        *g = (h, n + 1);
        true
    }
}

/// A seeded RC run with loss and CE marks (so CNPs flow both ways): 24 WRITEs of 64 KiB and 8
/// READs of 16 KiB from A to B. Returns (digest, packets).
fn traced_run(config: EngineConfig) -> (u64, u64) {
    let o = Opts {
        seed: 22,
        random_seed: Some(0x22),
        faults: Faults {
            loss: 0.01,
            ce_mark: 0.05,
            ..Faults::none()
        },
        config,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let digest = TraceDigest::default();
    f.set_tap(Some(Box::new(digest.clone())));
    let sg = [a.sge(0, 64 << 10)];
    for i in 0..24u64 {
        let op = SendOp::RdmaWrite {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        };
        post_send(&mut f, &a, &send_wr(i, &sg, op));
    }
    let rsg = [a.sge(128 << 10, 16 << 10)];
    for i in 0..8u64 {
        let op = SendOp::RdmaRead {
            remote_addr: b.addr(4096),
            rkey: b.mr.rkey(),
        };
        post_send(&mut f, &a, &send_wr(100 + i, &rsg, op));
    }
    let wcs = run_for_completions(&mut f, &a, 32, Duration::from_secs(10));
    assert_eq!(wcs.len(), 32);
    assert!(wcs.iter().all(|w| w.status == hca::WcStatus::Success));
    assert!(
        f.node(a.node).counters().cnp_rcvd > 0,
        "the run exercises CNPs"
    );
    let g = digest.0.lock().unwrap();
    *g
}

/// The trace of [`traced_run`] recorded on the engine before DCQCN existed (commit e80de21).
const TRACE_BEFORE_DCQCN: (u64, u64) = (0xb931_5725_2b12_a24b, 3477);

#[test]
fn dcqcn_off_leaves_the_packet_trace_unchanged() {
    let got = traced_run(EngineConfig::default());
    eprintln!("trace digest {got:#x?}");
    assert_eq!(got, TRACE_BEFORE_DCQCN);
}

/// The same run with CE marks off, under `config`: (digest, packets).
fn unmarked_run(config: EngineConfig) -> (u64, u64) {
    let o = Opts {
        seed: 5,
        random_seed: Some(0x2205),
        faults: Faults {
            loss: 0.01,
            ..Faults::none()
        },
        config,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let digest = TraceDigest::default();
    f.set_tap(Some(Box::new(digest.clone())));
    let sg = [a.sge(0, 64 << 10)];
    for i in 0..16u64 {
        let op = SendOp::RdmaWrite {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        };
        post_send(&mut f, &a, &send_wr(i, &sg, op));
    }
    let wcs = run_for_completions(&mut f, &a, 16, Duration::from_secs(10));
    assert!(wcs.iter().all(|w| w.status == hca::WcStatus::Success));
    let g = digest.0.lock().unwrap();
    *g
}

#[test]
fn dcqcn_on_without_cnps_sends_exactly_what_dcqcn_off_sends() {
    let off = unmarked_run(EngineConfig::default());
    let on = unmarked_run(EngineConfig {
        dcqcn: Some(hca::DcqcnParams::paper(40_000_000_000)),
        ..EngineConfig::default()
    });
    assert_eq!(on, off);
    assert!(off.1 > 1000, "{off:?}");
}

/// Marks CE on the first data packet from node 0 and logs (time ns, from, UDP payload bytes,
/// opcode) of every packet.
#[derive(Clone, Default)]
struct MarkFirst(Arc<Mutex<(bool, Vec<Logged>)>>);

/// (time ns, from node, UDP payload bytes, first BTH byte = opcode).
type Logged = (u64, usize, usize, u8);

impl Tap for MarkFirst {
    fn on_packet(&mut self, now: Instant, p: &mut WirePacket) -> bool {
        let mut g = self.0.lock().unwrap();
        if !g.0 && p.from.0 == 0 && p.ecn.is_ect() {
            g.0 = true;
            p.ecn = roce::ipv4::Ecn::Ce;
        }
        g.1.push((now.as_nanos(), p.from.0, p.data.len(), p.data[0]));
        true
    }
}

#[test]
fn a_cnp_paces_the_requester_at_the_cut_rate() {
    let line = 40_000_000_000u64;
    let o = Opts {
        random_seed: Some(0x2206),
        config: EngineConfig {
            dcqcn: Some(hca::DcqcnParams::paper(line)),
            ..EngineConfig::default()
        },
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let tap = MarkFirst::default();
    f.set_tap(Some(Box::new(tap.clone())));
    let sg = [a.sge(0, 64 << 10)];
    for i in 0..8u64 {
        let op = SendOp::RdmaWrite {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        };
        post_send(&mut f, &a, &send_wr(i, &sg, op));
    }
    let wcs = run_for_completions(&mut f, &a, 8, Duration::from_secs(1));
    assert!(wcs.iter().all(|w| w.status == hca::WcStatus::Success));
    assert_eq!(f.node(b.node).counters().cnp_sent, 1);
    assert_eq!(f.node(a.node).counters().cnp_rcvd, 1);
    let rp = f.node(a.node).qp_reaction_point(a.qpn).unwrap();
    assert_eq!(rp.stats().cuts, 1);
    let guard = tap.0.lock().unwrap();
    let log = &guard.1;
    // The CNP left B at some instant; A's requests after it (in the first 55 us, before any
    // rate increase) are spaced by at least their wire time at 20 Gb/s, and back to back ones
    // exactly by it.
    let cnp_at = log
        .iter()
        .find(|p| p.1 == 1 && p.3 == 0x81)
        .map(|p| p.0)
        .expect("a CNP");
    let reqs: Vec<_> = log
        .iter()
        .filter(|p| p.1 == 0 && p.0 > cnp_at + 1_000 && p.0 < cnp_at + 50_000)
        .collect();
    assert!(reqs.len() > 20, "{} requests", reqs.len());
    let mut exact = 0;
    for w in reqs.windows(2) {
        let pace =
            (hca::engine::dcqcn::wire_bytes(w[0].2, false) * 8 * 1_000_000_000).div_ceil(line / 2);
        let gap = w[1].0 - w[0].0;
        assert!(gap >= pace, "gap {gap} ns < {pace} ns");
        exact += usize::from(gap == pace);
    }
    assert!(exact > 10, "{exact} back-to-back gaps at the paced rate");
    // Before the CNP nothing was paced: A sent its first window at one instant.
    let first = log.iter().filter(|p| p.1 == 0 && p.0 == log[0].0).count();
    assert!(first >= 64, "{first} packets in the first instant");
}

#[test]
fn per_qp_setting_and_errors() {
    let o = Opts {
        random_seed: Some(0x2207),
        ..Opts::default()
    };
    let (mut f, a, _b) = pair(&o);
    let h = f.node_mut(a.node);
    assert!(h.qp_reaction_point(a.qpn).is_none(), "off by default");
    h.set_qp_dcqcn(a.qpn, Some(hca::DcqcnParams::mlx5(25_000_000_000)))
        .unwrap();
    let rp = h.qp_reaction_point(a.qpn).unwrap();
    assert!(!rp.is_limited());
    assert_eq!(rp.rate(), 25_000_000_000);
    h.set_qp_dcqcn(a.qpn, None).unwrap();
    assert!(h.qp_reaction_point(a.qpn).is_none());
    let ghost = a.qpn ^ 0x55_5555;
    let e = h.set_qp_dcqcn(ghost, None).unwrap_err();
    assert!(
        matches!(e, hca::VerbsError::ModifyQp { qpn, .. } if qpn == ghost),
        "{e:?}"
    );
}

// ---- the notification point (IBTA vol. 1 Annex A17.9.2; mlx5 `roce_np`) ----

/// CE marks reaching B at `times_us` (one request packet each), under B's `config`: the CNPs B
/// sends as (time us, DSCP, ECN, BECN, destination QPN), and B's (cnp_sent, cnp_suppressed).
fn notify(config: EngineConfig, times_us: &[u64]) -> (Vec<SentCnp>, (u64, u64), u32) {
    let o = Opts {
        config,
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    let mut cnps = Vec::new();
    for (i, &t) in times_us.iter().enumerate() {
        let sg = [a.sge(0, 8)];
        let op = SendOp::RdmaWrite {
            remote_addr: b.addr(0),
            rkey: b.mr.rkey(),
        };
        post_send(&mut f, &a, &send_wr(i as u64, &sg, op));
        let mut pkts = transmit(&mut f, &a, t_us(t));
        assert_eq!(pkts.len(), 1);
        pkts[0].tx.ecn = Ecn::Ce;
        deliver(&mut f, &b, &pkts[0], t_us(t));
        for p in transmit(&mut f, &b, t_us(t)) {
            if p.opcode() == roce::Opcode::Cnp {
                let bth = p.parsed().transport.bth;
                cnps.push((t, p.tx.dscp, p.tx.ecn, bth.becn, bth.dest_qpn));
            }
        }
    }
    let c = f.node(b.node).counters();
    (cnps, (c.cnp_sent, c.cnp_suppressed), a.qpn)
}

use roce::ipv4::Ecn;

/// A CNP B sent: (time us, DSCP, ECN, BECN, destination QPN).
type SentCnp = (u64, u8, Ecn, bool, u32);

#[test]
fn cnps_follow_min_time_between_cnps_and_the_cnp_dscp() {
    // mlx5's NP: min_time_between_cnps 4 us; a CNP DSCP of 26 instead of the default 48.
    let config = EngineConfig {
        cnp_interval: Duration::from_micros(4),
        cnp_dscp: 26,
        ..EngineConfig::default()
    };
    let (cnps, counts, a_qpn) = notify(config, &[0, 2, 4, 5, 9, 12]);
    let times: Vec<u64> = cnps.iter().map(|c| c.0).collect();
    // 0 sends; 2 is within 4 us; 4 is 4 us later (not less): sends; 5 within; 9 sends; 12 within.
    assert_eq!(times, [0, 4, 9]);
    assert_eq!(counts, (3, 3));
    for c in &cnps {
        assert_eq!((c.1, c.2, c.3, c.4), (26, Ecn::NotEct, true, a_qpn));
    }
    // The paper's NP: one CNP per 50 us per QP at most.
    let (cnps, counts, _) = notify(EngineConfig::default(), &[0, 20, 49, 50, 90, 100]);
    let times: Vec<u64> = cnps.iter().map(|c| c.0).collect();
    assert_eq!(times, [0, 50, 100]);
    assert_eq!(counts, (3, 3));
    assert!(cnps.iter().all(|c| c.1 == 48));
    // Zero: every CE mark is answered.
    let config = EngineConfig {
        cnp_interval: Duration::ZERO,
        ..EngineConfig::default()
    };
    let (cnps, counts, _) = notify(config, &[0, 0, 1, 1]);
    assert_eq!(cnps.len(), 4);
    assert_eq!(counts, (4, 0));
}
