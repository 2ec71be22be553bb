//! DCQCN on the real UDP link (`hca::soft::UdpDevice` over kernel loopback sockets): the
//! requester's address vector marks its packets CE (ECN `11` in the traffic class, RFC 3168
//! §5), the kernel carries the mark through loopback, the responder's notification point
//! answers with CNPs (IBTA vol. 1 Annex A17.9.3), and the requester's reaction point
//! (`hca::engine::dcqcn`) must count them and cut its rate while the RDMA WRITEs still
//! complete with correct data. A control pair without the mark must see no CNP. Checks read
//! the reaction point's counters, never wall-clock durations; every wait is bounded.
#![cfg(feature = "std")]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::engine::DcqcnParams;
use hca::soft::{Progress, UdpDevice, UdpDeviceConfig, GID_INDEX};
use hca::verbs::connect::{self, ConnectAttr};
use hca::{
    AccessFlags, CqHandle, MemoryRegion, PathMtu, QpCap, QpInitAttr, QpState, QpType, SendFlags,
    SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// Generous bound on any single wait: a loaded CI machine may be slow, a hang is a failure.
const WAIT: Duration = Duration::from_secs(30);
const MEM: usize = 1 << 20;
/// Line rate the reaction point starts at (bit/s).
const LINE: u64 = 1_000_000_000;

fn open(addr: &str, params: DcqcnParams) -> UdpDevice {
    let mut c = UdpDeviceConfig::new(addr.parse::<IpAddr>().unwrap());
    c.port = 0;
    c.progress = Progress::Thread;
    c.engine.dcqcn = Some(params);
    UdpDevice::open(c).unwrap()
}

struct Side {
    dev: Arc<UdpDevice>,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

impl Side {
    fn new(dev: Arc<UdpDevice>, iova: u64) -> Side {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let mem = Arc::new(HostMemory::new(MEM).unwrap());
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = dev.reg_mr(pd, mem.clone(), iova, access).unwrap();
        let qpn = dev
            .create_qp(
                pd,
                &QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 64,
                        max_recv_wr: 64,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .unwrap();
        Side {
            dev,
            cq,
            qpn,
            mem,
            mr,
        }
    }
}

fn bring_up(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32, traffic_class: u8) {
    let a = ConnectAttr {
        qp_type: QpType::Rc,
        access: AccessFlags::REMOTE_WRITE,
        path_mtu: PathMtu::Mtu1024,
        ah_attr: ConnectAttr::av(peer.dev.gid(), GID_INDEX as u8, 64, traffic_class),
        remote_qpn: peer.qpn,
        remote_psn: peer_psn,
        local_psn: my_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..ConnectAttr::default()
    };
    connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
        me.dev.modify_qp(me.qpn, qp, mask).map(|_| ())
    })
    .unwrap();
}

/// Writes 8 x 64 KiB from a (127.0.0.1) to b (127.0.0.2) with the requester's traffic class
/// `tc`, checks completions and data, and returns the requester's reaction-point stats and
/// current rate.
fn run(tc: u8, seed: u8) -> (hca::engine::RpStats, u64) {
    let (stats, rate, _) = run_with(DcqcnParams::paper(LINE), tc, seed);
    (stats, rate)
}

/// [`run`] with the reaction point's parameters `params`; also returns its paced span
/// (`ReactionPoint::paced_span`).
fn run_with(
    params: DcqcnParams,
    tc: u8,
    seed: u8,
) -> (
    hca::engine::RpStats,
    u64,
    Option<(u64, hca::engine::Instant, hca::engine::Instant)>,
) {
    let da = open("127.0.0.1", params);
    let db = open("127.0.0.2", params);
    da.set_peer_port(db.local_addr().ip(), db.local_addr().port());
    db.set_peer_port(da.local_addr().ip(), da.local_addr().port());
    let a = Side::new(Arc::new(da), 0x10_0000);
    let b = Side::new(Arc::new(db), 0x7700_0000);
    bring_up(&a, &b, 0x100, 0xff_fff0, tc);
    bring_up(&b, &a, 0xff_fff0, 0x100, 0);

    const CHUNK: usize = 64 << 10;
    const N: usize = 8;
    let data: Vec<u8> = (0..CHUNK * N)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect();
    a.mem.write(0, &data).unwrap();
    for i in 0..N {
        let sg = [Sge {
            addr: a.mr.iova() + (i * CHUNK) as u64,
            length: CHUNK as u32,
            lkey: a.mr.lkey(),
        }];
        a.dev
            .post_send(
                a.qpn,
                &SendWr {
                    wr_id: i as u64,
                    sg_list: &sg,
                    op: SendOp::RdmaWrite {
                        remote_addr: b.mr.iova() + (i * CHUNK) as u64,
                        rkey: b.mr.rkey(),
                    },
                    send_flags: SendFlags::SIGNALED,
                },
            )
            .unwrap();
    }
    let got = a.dev.wait_cq(a.cq, N, WAIT).unwrap();
    assert_eq!(got.len(), N, "completions: {got:?}");
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i as u64, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
    let mut back = vec![0; CHUNK * N];
    b.mem.read(0, &mut back).unwrap();
    assert!(back == data, "data written through the paced QP differs");
    let qpn = a.qpn;
    a.dev.with_engine(|e| {
        let rp = e.qp_reaction_point(qpn).expect("DCQCN is on for the QP");
        (rp.stats(), rp.rate(), rp.paced_span())
    })
}

#[test]
fn ce_marked_writes_draw_cnps_that_cut_the_rate() {
    // DSCP 26, ECN CE.
    let (stats, rate) = run((26 << 2) | 0b11, 7);
    eprintln!("CE run: {stats:?}, rate {rate} bit/s");
    assert!(
        stats.cnps >= 1,
        "no CNP reached the reaction point: {stats:?}"
    );
    assert!(stats.cuts >= 1, "CNPs but no rate cut: {stats:?}");
    assert!(stats.cuts <= stats.cnps, "{stats:?}");
    assert!(rate <= LINE, "rate {rate} above the line rate");
}

#[test]
fn unmarked_writes_draw_no_cnp() {
    // DSCP 26, ECT(0): ECN-capable, never marked on loopback.
    let (stats, rate) = run((26 << 2) | 0b10, 9);
    assert_eq!((stats.cnps, stats.cuts), (0, 0), "{stats:?}");
    assert_eq!(rate, LINE);
}

/// Pacing on the kernel link (`DcqcnParams::pace_at_max_rate`): an unlimited QP (ECT(0), no CE
/// on loopback, so no CNP) is paced at `rpg_max_rate` = 200 Mb/s with a burst allowance
/// (`pace_burst`) of 50 000 bytes (2 ms at that rate: the progress thread sleeps in poll(2),
/// whose timeout has a resolution of 1 ms). Measured in bytes against the engine's own clock
/// (the instants it passed to the reaction point), never in wall-clock thresholds: within every
/// accounting window of `rpg_time_reset` (11 ms at 200 Mb/s with `paper_scaled`) the QP sends
/// at most the configured 275 000 bytes plus the burst and one packet, and over the whole run
/// its achieved rate is at most the configured one plus the burst over the run. How close the
/// achieved rate comes to the configured one from below depends on when the progress thread
/// runs (a loaded host sends late) and is only printed.
#[test]
fn pacing_on_loopback_stays_within_the_configured_rate() {
    const RATE: u64 = 200_000_000;
    const BURST: u64 = 50_000;
    let params = DcqcnParams {
        pace_at_max_rate: true,
        pace_burst: BURST,
        ..DcqcnParams::paper_scaled(RATE)
    };
    let (stats, rate, span) = run_with(params, (26 << 2) | 0b10, 11);
    assert_eq!((stats.cnps, stats.cuts, rate), (0, 0, RATE), "{stats:?}");
    // 8 x 64 KiB of payload in 1024-byte packets, each with its headers on the wire.
    let payload = 8 * 64 * 1024;
    assert!(stats.paced_bytes > payload, "{stats:?}");
    let window_bytes = RATE * params.rpg_time_reset.as_nanos() as u64 / 8 / 1_000_000_000;
    assert_eq!(window_bytes, 275_000);
    // RDMA WRITE middle packet at MTU 1024: BTH 12 + 1024 + ICRC 4 (+ RETH 16 on the first).
    let max_packet = hca::engine::dcqcn::wire_bytes(12 + 16 + 1024 + 4, false);
    assert!(
        // (+ 2 bytes: the burst's credit and the wire times are rounded up to whole
        // nanoseconds, the bound here down.)
        stats.paced_window_max <= window_bytes + BURST + max_packet + 2,
        "{} bytes in one {:?} window, configured {window_bytes} (+ burst {BURST} + one packet of {max_packet})",
        stats.paced_window_max,
        params.rpg_time_reset
    );
    let (bytes, from, to) = span.expect("paced packets");
    let nanos = (to - from).as_nanos().max(1);
    let achieved = u128::from(bytes) * 8 * 1_000_000_000 / nanos;
    eprintln!(
        "paced {bytes} bytes in {nanos} ns: {achieved} bit/s of {RATE} configured ({:.3}); \
         most in one window {} of {window_bytes}",
        achieved as f64 / RATE as f64,
        stats.paced_window_max
    );
    // GCRA: bytes over [from, to] <= RATE x (to - from) / 8 + BURST (+ the last packet, not
    // counted in `bytes`).
    let allowed = u128::from(RATE) * nanos / 8 / 1_000_000_000 + u128::from(BURST) + 2;
    assert!(
        u128::from(bytes) <= allowed,
        "{bytes} bytes in {nanos} ns: above {allowed} ({RATE} bit/s + a burst of {BURST})"
    );
}
