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

fn open(addr: &str) -> UdpDevice {
    let mut c = UdpDeviceConfig::new(addr.parse::<IpAddr>().unwrap());
    c.port = 0;
    c.progress = Progress::Thread;
    c.engine.dcqcn = Some(DcqcnParams::paper(LINE));
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
    let da = open("127.0.0.1");
    let db = open("127.0.0.2");
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
        (rp.stats(), rp.rate())
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
