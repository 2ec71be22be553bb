//! The software HCA over real UDP sockets (`hca::soft`): two devices on loopback
//! (127.0.0.1 and 127.0.0.2; `::1` with two ports) run every RC operation, UD SEND, and the
//! shutdown and failure paths end to end, with data checked. Devices bind ephemeral ports (and
//! tell each other with `set_peer_port`) so that test runs never collide. Every wait is bounded
//! by a deadline; nothing asserts on wall-clock durations.
#![cfg(feature = "std")]
#![allow(unsafe_code)] // the TUN device of `ipv4_gso_trains_carry_valid_icrcs_on_the_wire`

#[path = "common/tun.rs"]
mod tun;

use tun::in_tun_namespace;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::soft::{DeviceError, Progress, UdpDevice, UdpDeviceConfig, GID_INDEX};
use hca::verbs::connect::{self, ConnectAttr};
use hca::{
    AccessFlags, AhAttr, CqHandle, MemoryRegion, PathMtu, PdHandle, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

/// Generous bound on any single wait: a loaded CI machine may be slow, a hang is a failure.
const WAIT: Duration = Duration::from_secs(20);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn open(addr: &str, progress: Progress) -> UdpDevice {
    open_with(addr, progress, UdpDeviceConfig::new(ip(addr)).src_ports)
}

/// A device on `addr` (ephemeral port) with `src_ports` sending sockets.
fn open_with(addr: &str, progress: Progress, src_ports: usize) -> UdpDevice {
    let mut c = UdpDeviceConfig::new(ip(addr));
    c.port = 0;
    c.progress = progress;
    c.src_ports = src_ports;
    UdpDevice::open(c).unwrap()
}

/// One side: a device with a PD, a CQ, a 1 MiB MR and one QP.
struct Side {
    dev: Arc<UdpDevice>,
    pd: PdHandle,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

const MEM: usize = 1 << 20;

impl Side {
    fn new(dev: Arc<UdpDevice>, qp_type: QpType, iova: u64) -> Side {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1024).unwrap();
        let mem = Arc::new(HostMemory::new(MEM).unwrap());
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = dev.reg_mr(pd, mem.clone(), iova, access).unwrap();
        let qpn = dev
            .create_qp(
                pd,
                &QpInitAttr {
                    qp_type,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: 128,
                        max_recv_wr: 128,
                        max_send_sge: 4,
                        max_recv_sge: 4,
                        max_inline_data: 64,
                    },
                    sq_sig_all: false,
                },
            )
            .unwrap();
        Side {
            dev,
            pd,
            cq,
            qpn,
            mem,
            mr,
        }
    }

    fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.iova() + offset,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn addr(&self, offset: u64) -> u64 {
        self.mr.iova() + offset
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        self.mem.write(offset, bytes).unwrap();
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(offset, &mut v).unwrap();
        v
    }

    fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let got = self.dev.wait_cq(self.cq, n, WAIT).unwrap();
        assert_eq!(
            got.len(),
            n,
            "got {} of {n} completions: {got:?}",
            got.len()
        );
        got
    }

    fn post_recv(&self, wr_id: u64, sg: &[Sge]) {
        self.dev
            .post_recv(self.qpn, &RecvWr { wr_id, sg_list: sg })
            .unwrap();
    }

    fn post_send(&self, wr_id: u64, sg: &[Sge], op: SendOp) {
        self.dev
            .post_send(
                self.qpn,
                &SendWr {
                    wr_id,
                    sg_list: sg,
                    op,
                    send_flags: SendFlags::SIGNALED,
                },
            )
            .unwrap();
    }
}

/// RC / UC connection parameters of one side.
#[derive(Clone, Copy)]
struct Conn {
    timeout: u8,
    retry_cnt: u8,
    mtu: PathMtu,
    /// The flow label of the address vector (0: none; else the UDP source port's entropy).
    flow_label: u32,
    /// The traffic class of the address vector (DSCP and ECN of the packets).
    traffic_class: u8,
}

impl Default for Conn {
    fn default() -> Self {
        Conn {
            timeout: 14,
            retry_cnt: 7,
            mtu: PathMtu::Mtu1024,
            flow_label: 0,
            traffic_class: 0,
        }
    }
}

/// Brings `me` to RTS: RC / UC connected to `peer`, UD ready to send.
fn bring_up(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32, qp_type: QpType, c: Conn) {
    bring_up_to(me, peer.qpn, peer.dev.gid(), my_psn, peer_psn, qp_type, c);
}

/// [`bring_up`] towards QPN `dest_qpn` at GID `dgid`, which need not exist.
fn bring_up_to(
    me: &Side,
    dest_qpn: u32,
    dgid: hca::Gid,
    my_psn: u32,
    peer_psn: u32,
    qp_type: QpType,
    c: Conn,
) {
    let all = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let a = ConnectAttr {
        qp_type,
        access: if qp_type == QpType::Uc {
            AccessFlags::REMOTE_WRITE
        } else {
            all
        },
        qkey: 0x1111_1111,
        path_mtu: c.mtu,
        ah_attr: AhAttr {
            flow_label: c.flow_label,
            ..ConnectAttr::av(dgid, GID_INDEX as u8, 64, c.traffic_class)
        },
        remote_qpn: dest_qpn,
        remote_psn: peer_psn,
        local_psn: my_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..ConnectAttr::default()
    };
    connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
        me.dev.modify_qp(me.qpn, qp, mask).map(|_| ())
    })
    .unwrap();
}

/// Two devices, each told the other's port, with one QP each, connected.
fn pair(a_addr: &str, b_addr: &str, progress: Progress, qp_type: QpType, c: Conn) -> (Side, Side) {
    pair_of(open(a_addr, progress), open(b_addr, progress), qp_type, c)
}

/// Tells each device the other's UDP port (tests bind port 0).
fn tell_ports(da: &UdpDevice, db: &UdpDevice) {
    da.set_peer_port(db.local_addr().ip(), db.local_addr().port());
    db.set_peer_port(da.local_addr().ip(), da.local_addr().port());
}

/// One QP of `qp_type` on each device (told each other's port), not connected yet.
fn sides(da: UdpDevice, db: UdpDevice, qp_type: QpType) -> (Side, Side) {
    tell_ports(&da, &db);
    let a = Side::new(Arc::new(da), qp_type, 0x10_0000);
    let b = Side::new(Arc::new(db), qp_type, 0x7700_0000);
    (a, b)
}

/// [`pair`] of two open devices.
fn pair_of(da: UdpDevice, db: UdpDevice, qp_type: QpType, c: Conn) -> (Side, Side) {
    let (a, b) = sides(da, db, qp_type);
    bring_up(&a, &b, 0x100, 0xff_fff0, qp_type, c);
    bring_up(&b, &a, 0xff_fff0, 0x100, qp_type, c);
    (a, b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, CAS and FAA from `a` to `b`, multi-packet
/// where the operation allows, data checked on both sides.
fn all_rc_operations(a: &Side, b: &Side) {
    // SEND (10 packets at MTU 1024) into two receive SGEs.
    let data = pattern(10_000, 1);
    a.write(0, &data);
    b.post_recv(11, &[b.sge(100, 6000), b.sge(20_000, 6000)]);
    a.post_send(1, &[a.sge(0, 10_000)], SendOp::Send);
    let wa = a.wait(1);
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let wb = b.wait(1);
    assert_eq!((wb[0].wr_id, wb[0].status), (11, WcStatus::Success));
    assert_eq!((wb[0].opcode, wb[0].byte_len), (WcOpcode::Recv, 10_000));
    let mut got = b.read(100, 6000);
    got.extend(b.read(20_000, 4000));
    assert_eq!(got, data);

    // SEND_WITH_IMM.
    let data = pattern(3000, 2);
    a.write(0, &data);
    b.post_recv(12, &[b.sge(40_000, 4096)]);
    a.post_send(
        2,
        &[a.sge(0, 3000)],
        SendOp::SendWithImm { imm_data: 0xfeed },
    );
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let wb = b.wait(1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[0].imm_data, Some(0xfeed));
    assert!(wb[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(b.read(40_000, 3000), data);

    // RDMA WRITE (20 packets).
    let data = pattern(20_000, 3);
    a.write(100_000, &data);
    a.post_send(
        3,
        &[a.sge(100_000, 20_000)],
        SendOp::RdmaWrite {
            remote_addr: b.addr(200_000),
            rkey: b.mr.rkey(),
        },
    );
    let wa = a.wait(1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.read(200_000, 20_000), data);

    // RDMA WRITE_WITH_IMM: consumes a receive WQE, reports the immediate.
    let data = pattern(5000, 4);
    a.write(100_000, &data);
    b.post_recv(14, &[]);
    a.post_send(
        4,
        &[a.sge(100_000, 5000)],
        SendOp::RdmaWriteWithImm {
            remote_addr: b.addr(300_000),
            rkey: b.mr.rkey(),
            imm_data: 0x1234_5678,
        },
    );
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let wb = b.wait(1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode),
        (14, WcStatus::Success, WcOpcode::RecvRdmaWithImm)
    );
    assert_eq!((wb[0].imm_data, wb[0].byte_len), (Some(0x1234_5678), 5000));
    assert_eq!(b.read(300_000, 5000), data);

    // RDMA READ (multi-packet response) of what was written.
    a.post_send(
        5,
        &[a.sge(400_000, 20_000)],
        SendOp::RdmaRead {
            remote_addr: b.addr(200_000),
            rkey: b.mr.rkey(),
        },
    );
    let wa = a.wait(1);
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(a.read(400_000, 20_000), pattern(20_000, 3));

    // Atomics: FAA then CAS on one 8-byte word.
    b.write(8000, &41u64.to_ne_bytes());
    a.post_send(
        6,
        &[a.sge(500_000, 8)],
        SendOp::AtomicFetchAndAdd {
            remote_addr: b.addr(8000),
            rkey: b.mr.rkey(),
            add: 1,
        },
    );
    a.post_send(
        7,
        &[a.sge(500_008, 8)],
        SendOp::AtomicCmpAndSwp {
            remote_addr: b.addr(8000),
            rkey: b.mr.rkey(),
            compare: 42,
            swap: 1000,
        },
    );
    let wa = a.wait(2);
    let ids: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        ids,
        [
            (6, WcStatus::Success, WcOpcode::FetchAdd),
            (7, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
    assert_eq!(a.read(500_000, 8), 41u64.to_ne_bytes());
    assert_eq!(a.read(500_008, 8), 42u64.to_ne_bytes());
    assert_eq!(b.read(8000, 8), 1000u64.to_ne_bytes());
}

#[test]
fn rc_operations_two_ipv4_addresses() {
    let (a, b) = pair(
        "127.0.0.1",
        "127.0.0.2",
        Progress::Thread,
        QpType::Rc,
        Conn::default(),
    );
    all_rc_operations(&a, &b);
    // The other direction too. A socket does not see the IPv4 identification: every ICRC was
    // verified by solving for it (GSO trains carry identifications 0, 1, 2, ...).
    all_rc_operations(&b, &a);
    let c = b.dev.counters();
    assert_eq!(c.total_drops(), 0, "{c:?}");
    assert_eq!(c.icrc_errors, 0, "{c:?}");
    assert_eq!(c.icrc_ident_solved, c.rcvd_pkts, "{c:?}");
    assert!(c.icrc_ident_solved > 0, "{c:?}");
    assert_eq!(a.dev.device_counters().tx_dropped, 0);
}

#[test]
fn rc_operations_ipv6_loopback_two_ports() {
    rc_operations_ipv6_with_src_ports(UdpDeviceConfig::new(ip("::1")).src_ports);
}

/// No sending socket (everything from the bound port), one, and the most (64): the QPs' packets
/// carry the port they leave from in their ICRC (checked on IPv6).
#[test]
fn rc_operations_with_0_1_and_64_sending_sockets() {
    for k in [0, 1, 64] {
        rc_operations_ipv6_with_src_ports(k);
    }
}

fn rc_operations_ipv6_with_src_ports(k: usize) {
    let da = open_with("::1", Progress::Thread, k);
    let db = open_with("::1", Progress::Thread, k);
    for d in [&da, &db] {
        let ports = d.src_ports();
        assert_eq!(ports.len(), k.max(1), "{ports:?}");
        assert_eq!(ports.contains(&d.local_addr().port()), k == 0, "{ports:?}");
    }
    let (a, b) = pair_of(da, db, QpType::Rc, Conn::default());
    assert_eq!(a.dev.gid(), b.dev.gid(), "one address, two ports");
    all_rc_operations(&a, &b);
    all_rc_operations(&b, &a);
    // IPv6 has no identification field: every ICRC was checked (and matched, with the bound
    // port as UDP source port).
    let c = b.dev.counters();
    assert_eq!(c.total_drops(), 0, "{c:?}");
    assert_eq!(c.icrc_ident_solved, 0, "{c:?}");
    assert_eq!(c.icrc_errors, 0, "{c:?}");
    // Every payload left from MR memory in place (zero-copy gather): A's SENDs and WRITEs, B's
    // READ responses; none was copied into a transmit buffer.
    for side in [&a, &b] {
        let c = side.dev.counters();
        assert!(c.tx_gathered_pkts > 0, "{c:?}");
        assert_eq!(c.tx_copied_pkts, 0, "{c:?}");
    }
}

#[test]
fn rc_operations_at_mtu_4096_with_caller_progress() {
    let c = Conn {
        mtu: PathMtu::Mtu4096,
        ..Conn::default()
    };
    let (a, b) = pair("127.0.0.3", "127.0.0.4", Progress::Caller, QpType::Rc, c);
    // With caller-driven progress nobody runs `b` unless someone polls it: a helper thread does.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        let b_ref = &b;
        let stop2 = stop.clone();
        s.spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                b_ref.dev.progress();
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        all_rc_operations(&a, &b);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(b.dev.counters().total_drops(), 0);
}

/// `post_send_deferred` of a signaled 8-byte SEND from offset 0 of `s`'s MR.
fn post_deferred_send8(s: &Side, wr_id: u64) {
    s.dev
        .post_send_deferred(
            s.qpn,
            &SendWr {
                wr_id,
                sg_list: &[s.sge(0, 8)],
                op: SendOp::Send,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap();
}

/// `post_send_deferred` with caller-driven progress queues the WR without sending it: nothing
/// leaves until the next round (here an explicit `progress`), which sends it; with the progress
/// thread it posts at once.
#[test]
fn deferred_post_leaves_with_the_next_round() {
    // No extra sending sockets (src_ports 0): their fixed preferred ports are what
    // `close_while_sending_sockets_are_full` binds again after its close.
    let (a, b) = pair_of(
        open_with("127.0.0.113", Progress::Caller, 0),
        open_with("127.0.0.114", Progress::Caller, 0),
        QpType::Rc,
        Conn::default(),
    );
    b.post_recv(1, &[b.sge(0, 64)]);
    a.write(0, b"deferred");
    let before = a.dev.link_counters().tx_datagrams;
    post_deferred_send8(&a, 7);
    assert_eq!(
        a.dev.link_counters().tx_datagrams,
        before,
        "sent before any round"
    );
    a.dev.progress();
    assert_eq!(a.dev.link_counters().tx_datagrams, before + 1);
    // b receives when it polls (its wait is a round); its ACK, deferred by that round, leaves
    // with b's next round and completes a's WR.
    let wb = b.wait(1);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 8));
    assert_eq!(b.read(0, 8), b"deferred");
    b.dev.progress();
    let wa = a.wait(1);
    assert_eq!(
        (wa[0].status, wa[0].wr_id),
        (WcStatus::Success, 7),
        "{wa:?}"
    );

    // With the progress thread the WR leaves without a round of the caller's.
    let (c, d) = pair_of(
        open_with("127.0.0.115", Progress::Thread, 0),
        open_with("127.0.0.116", Progress::Thread, 0),
        QpType::Rc,
        Conn::default(),
    );
    d.post_recv(1, &[d.sge(0, 64)]);
    c.write(0, b"threaded");
    c.dev
        .post_send_deferred(
            c.qpn,
            &SendWr {
                wr_id: 8,
                sg_list: &[c.sge(0, 8)],
                op: SendOp::Send,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap();
    let wd = d.wait(1);
    assert_eq!((wd[0].status, wd[0].byte_len), (WcStatus::Success, 8));
    assert_eq!(d.read(0, 8), b"threaded");
}

#[test]
fn uc_write_and_send() {
    let (a, b) = pair(
        "127.0.0.5",
        "127.0.0.6",
        Progress::Thread,
        QpType::Uc,
        Conn::default(),
    );
    let data = pattern(7000, 9);
    a.write(0, &data);
    b.post_recv(1, &[b.sge(0, 8192)]);
    // UC completes a WR once sent: the WRITE goes first, so that the SEND's arrival (in order
    // on the QP) says the WRITE's data is in place.
    a.post_send(
        2,
        &[a.sge(0, 7000)],
        SendOp::RdmaWrite {
            remote_addr: b.addr(65536),
            rkey: b.mr.rkey(),
        },
    );
    a.post_send(1, &[a.sge(0, 7000)], SendOp::Send);
    assert!(a.wait(2).iter().all(|w| w.status == WcStatus::Success));
    let wb = b.wait(1);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 7000));
    assert_eq!(b.read(0, 7000), data);
    assert_eq!(b.read(65536, 7000), data);
}

/// UD SENDs from `a_addr` to `b_addr` through an address handle with `flow_label` (0: none),
/// which selects the source port among the device's sending sockets.
fn ud_send(a_addr: &str, b_addr: &str, flow_label: u32) {
    let (a, b) = pair(
        a_addr,
        b_addr,
        Progress::Thread,
        QpType::Ud,
        Conn::default(),
    );
    let ah = a
        .dev
        .create_ah(
            a.pd,
            &AhAttr {
                dgid: b.dev.gid(),
                sgid_index: GID_INDEX as u8,
                hop_limit: 1,
                port_num: 1,
                flow_label,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let data = pattern(1000, 5);
    a.write(4096, &data);
    for i in 0..4u64 {
        b.post_recv(100 + i, &[b.sge(i * 2048, 40 + 1024)]);
    }
    for i in 0..4u64 {
        a.post_send(
            i,
            &[a.sge(4096, 1000)],
            SendOp::UdSend {
                dest: UdDest {
                    ah,
                    remote_qpn: b.qpn,
                    remote_qkey: 0x1111_1111,
                },
                imm_data: (i == 3).then_some(77),
            },
        );
    }
    assert!(a.wait(4).iter().all(|w| w.status == WcStatus::Success));
    let wb = b.wait(4);
    for (i, w) in wb.iter().enumerate() {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        assert_eq!(w.wr_id, 100 + i as u64);
        assert_eq!(w.byte_len, 40 + 1000, "GRH area + payload");
        assert_eq!(w.src_qp, a.qpn);
        assert!(w.wc_flags.contains(WcFlags::GRH));
        assert_eq!(b.read(i * 2048 + 40, 1000), data);
    }
    assert_eq!(wb[3].imm_data, Some(77));
    // Every datagram left from a port the link owns: none refused.
    assert_eq!(a.dev.link_counters().tx_errors, 0);
    assert_eq!(a.dev.device_counters().tx_dropped, 0);
}

#[test]
fn ud_send_ipv4() {
    ud_send("127.0.0.7", "127.0.0.8", 0);
}

#[test]
fn ud_send_ipv6() {
    ud_send("::1", "::1", 0);
    ud_send("::1", "::1", 0xA_BCDE);
}

/// Waits (bounded) until no thread of this process has this name. `close` joined the thread,
/// but the kernel lists an exited thread in `/proc/self/task` for a moment after the join.
fn wait_thread_gone(name: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    while thread_names().iter().any(|n| n == name) {
        assert!(std::time::Instant::now() < deadline, "{name} still runs");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Names of this process's threads (`/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
fn close_flushes_outstanding_work_and_joins_the_thread() {
    let (a, b) = pair(
        "127.0.0.9",
        "127.0.0.10",
        Progress::Thread,
        QpType::Rc,
        Conn::default(),
    );
    let name = b.dev.thread_name().unwrap();
    // The thread names itself once it runs.
    let deadline = std::time::Instant::now() + WAIT;
    while !thread_names().contains(&name) {
        assert!(std::time::Instant::now() < deadline, "{:?}", thread_names());
        std::thread::sleep(Duration::from_millis(1));
    }
    for i in 0..5 {
        b.post_recv(i, &[b.sge(i * 100, 100)]);
    }
    b.dev.close();
    // The flush completions are in the CQ when close returns.
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 16];
    let n = b.dev.poll_cq(b.cq, &mut wcs).unwrap();
    assert_eq!(n, 5);
    for (i, w) in wcs[..n].iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::WrFlushErr));
    }
    assert_eq!(b.dev.query_qp(b.qpn).unwrap().0.qp_state, QpState::Err);
    wait_thread_gone(&name);
    // New work is refused; closing again is a no-op.
    let e = b
        .dev
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 9,
                sg_list: &[],
            },
        )
        .unwrap_err();
    assert!(matches!(e, DeviceError::Closed { .. }), "{e}");
    assert!(e.to_string().contains("closed"), "{e}");
    b.dev.close();
    // Dropping the other device does the same.
    let name_a = a.dev.thread_name().unwrap();
    drop(a);
    wait_thread_gone(&name_a);
}

#[test]
fn send_queue_is_flushed_on_close() {
    let (a, b) = pair(
        "127.0.0.11",
        "127.0.0.12",
        Progress::Thread,
        QpType::Rc,
        Conn::default(),
    );
    // b posts no receive: a's SENDs get RNR NAKs and wait (rnr_retry 7 = forever).
    a.write(0, &pattern(100, 1));
    for i in 0..3 {
        a.post_send(i, &[a.sge(0, 100)], SendOp::Send);
    }
    a.dev.close();
    let wcs = a.dev.wait_cq(a.cq, 3, WAIT).unwrap();
    assert_eq!(wcs.len(), 3, "{wcs:?}");
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{wcs:?}"
    );
    drop(b);
}

#[test]
fn dead_peer_gives_retry_exceeded() {
    // Local ACK timeout 4.096 us * 2^10 = 4.2 ms, 2 retries: the error comes after ~13 ms.
    let c = Conn {
        timeout: 10,
        retry_cnt: 2,
        ..Conn::default()
    };
    let (a, b) = pair("127.0.0.13", "127.0.0.14", Progress::Thread, QpType::Rc, c);
    drop(b);
    a.write(0, &pattern(2000, 1));
    a.post_send(
        1,
        &[a.sge(0, 2000)],
        SendOp::RdmaWrite {
            remote_addr: 0x7700_0000,
            rkey: 1,
        },
    );
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!(a.dev.query_qp(a.qpn).unwrap().0.qp_state, QpState::Err);
    assert!(a.dev.counters().retry_exceeded_err >= 1);
}

#[test]
fn dead_peer_with_caller_progress() {
    let c = Conn {
        timeout: 8,
        retry_cnt: 1,
        ..Conn::default()
    };
    let (a, b) = pair("127.0.0.15", "127.0.0.16", Progress::Caller, QpType::Rc, c);
    drop(b);
    a.post_send(1, &[a.sge(0, 8)], SendOp::Send);
    let w = a.wait(1);
    assert_eq!(w[0].status, WcStatus::RetryExcErr);
}

/// Busy polling an idle caller-driven device makes quiet rounds (the receive call alone, issue
/// 21); a verb since the last full round (here a deferred post, which runs no round of its own)
/// makes the next poll a full round that sends it, and the local ACK timer still fires while
/// the polls are quiet (their clock is read every 8th round).
#[test]
fn busy_polled_idle_caller_device_makes_quiet_rounds_that_miss_no_verb_or_timer() {
    let c = Conn {
        timeout: 8,
        retry_cnt: 1,
        ..Conn::default()
    };
    let (a, b) = pair_of(
        open_with("127.0.0.117", Progress::Caller, 0),
        open_with("127.0.0.118", Progress::Caller, 0),
        QpType::Rc,
        c,
    );
    let mut wcs = [WorkCompletion::success(0, WcOpcode::Send, 0, 0); 4];
    let quiet = |s: &Side| s.dev.device_counters().quiet_rounds;
    let q0 = quiet(&a);
    for _ in 0..200 {
        assert_eq!(a.dev.poll_cq(a.cq, &mut wcs).unwrap(), 0);
    }
    // The first poll may run a full round (what connecting left); the rest are quiet.
    assert!(quiet(&a) - q0 >= 198, "{:?}", a.dev.device_counters());

    b.post_recv(1, &[b.sge(0, 64)]);
    a.write(0, b"quietpol");
    let before = a.dev.link_counters().tx_datagrams;
    post_deferred_send8(&a, 7);
    let q1 = quiet(&a);
    assert_eq!(a.dev.poll_cq(a.cq, &mut wcs).unwrap(), 0);
    assert_eq!(quiet(&a), q1, "a poll after a verb runs a full round");
    assert_eq!(a.dev.link_counters().tx_datagrams, before + 1, "and sends");
    let wb = b.wait(1);
    assert_eq!((wb[0].status, wb[0].byte_len), (WcStatus::Success, 8));
    assert_eq!(b.read(0, 8), b"quietpol");
    b.dev.progress();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);

    // The peer is gone: the next SEND is never acknowledged, and only a polling caller's
    // rounds fire the local ACK timer (4.096 us x 2^8, one retry). Bounded by WAIT.
    drop(b);
    let q2 = quiet(&a);
    a.post_send(2, &[a.sge(0, 8)], SendOp::Send);
    let start = std::time::Instant::now();
    let mut got = 0;
    while got == 0 && start.elapsed() < WAIT {
        got = a.dev.poll_cq(a.cq, &mut wcs).unwrap();
    }
    assert_eq!(got, 1, "no completion within {WAIT:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::RetryExcErr));
    assert!(quiet(&a) > q2, "the wait was polled in quiet rounds");
}

#[test]
fn several_threads_post_and_poll_one_device() {
    // Four QP pairs between two devices; one thread per pair ping-pongs SENDs both ways while
    // the others do the same on the same devices.
    let da = Arc::new(open("127.0.0.17", Progress::Thread));
    let db = Arc::new(open("127.0.0.18", Progress::Thread));
    tell_ports(&da, &db);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (da, db) = (da.clone(), db.clone());
            s.spawn(move || {
                let a = Side::new(da, QpType::Rc, 0x1000_0000 * (t + 1));
                let b = Side::new(db, QpType::Rc, 0x2000_0000 * (t + 1));
                bring_up(&a, &b, 7, 9, QpType::Rc, Conn::default());
                bring_up(&b, &a, 9, 7, QpType::Rc, Conn::default());
                for round in 0..50u64 {
                    let (from, to) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
                    let data = pattern(2000 + round as usize, (t * 50 + round) as u8);
                    from.write(0, &data);
                    to.post_recv(round, &[to.sge(4096, 4096)]);
                    from.post_send(round, &[from.sge(0, data.len() as u32)], SendOp::Send);
                    assert_eq!(from.wait(1)[0].status, WcStatus::Success);
                    let w = to.wait(1);
                    assert_eq!((w[0].wr_id, w[0].status), (round, WcStatus::Success));
                    assert_eq!(to.read(4096, data.len()), data);
                }
            });
        }
    });
}

#[test]
fn open_errors_name_the_address() {
    // Not an address of this host.
    let e = UdpDevice::open(UdpDeviceConfig::new(ip("192.0.2.1"))).unwrap_err();
    assert!(matches!(e, DeviceError::Link(_)), "{e}");
    assert!(e.to_string().contains("192.0.2.1"), "{e}");
    // The unspecified address is no GID.
    let e = UdpDevice::open(UdpDeviceConfig::new(ip("0.0.0.0"))).unwrap_err();
    assert!(matches!(e, DeviceError::Config { .. }), "{e}");
    // A port in use.
    let d = open("127.0.0.19", Progress::Thread);
    let mut c = UdpDeviceConfig::new(ip("127.0.0.19"));
    c.port = d.local_addr().port();
    let e = UdpDevice::open(c).unwrap_err();
    assert!(e.to_string().contains("127.0.0.19"), "{e}");
    // A link MTU too small for any RoCE MTU.
    let mut c = UdpDeviceConfig::new(ip("127.0.0.19"));
    c.port = 0;
    c.link_mtu = Some(200);
    assert!(matches!(
        UdpDevice::open(c),
        Err(DeviceError::Config { .. })
    ));
}

#[test]
fn gid_table_holds_the_address() {
    let d = open("127.0.0.20", Progress::Caller);
    let g = d.query_gid(GID_INDEX).unwrap();
    assert_eq!(g.gid.to_string(), "::ffff:127.0.0.20");
    assert!(d.query_gid(1).is_err());
    assert_eq!(
        d.query_port().active_mtu,
        PathMtu::Mtu4096,
        "loopback MTU 65536"
    );
    let mut c = UdpDeviceConfig::new(ip("::1"));
    c.port = 0;
    c.link_mtu = Some(1500);
    let d6 = UdpDevice::open(c).unwrap();
    assert_eq!(d6.gid().to_string(), "::1");
    assert_eq!(
        d6.query_port().active_mtu,
        PathMtu::Mtu1024,
        "as rxe on 1500"
    );
}

/// An IPv4 RoCEv2 packet as captured (IP header on): its IPv4 identification, UDP source port,
/// UDP payload, and whether the ICRC it carries is the one computed over its own IP and UDP
/// headers (IBTA vol. 1 Annex A17.3.3).
fn wire_icrc(p: &[u8]) -> (u16, u16, &[u8], bool) {
    let ihl = usize::from(p[0] & 0xf) * 4;
    let ident = u16::from_be_bytes([p[4], p[5]]);
    let src_port = u16::from_be_bytes([p[ihl], p[ihl + 1]]);
    let udp_payload = &p[ihl + 8..];
    let ip_repr = roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
        src_addr: std::net::Ipv4Addr::new(p[12], p[13], p[14], p[15]),
        dst_addr: std::net::Ipv4Addr::new(p[16], p[17], p[18], p[19]),
        protocol: roce::ipv4::IpProtocol::Udp,
        payload_len: 0,
        hop_limit: p[8],
        dscp: p[1] >> 2,
        ecn: roce::ipv4::Ecn::from_bits(p[1]),
        ident,
        dont_frag: p[6] & 0x40 != 0,
    });
    let udp = roce::udp::Repr {
        src_port,
        dst_port: u16::from_be_bytes([p[ihl + 2], p[ihl + 3]]),
        payload_len: udp_payload.len(),
    };
    let want = roce::packet::icrc_of_udp_payload(&ip_repr, &udp, udp_payload).unwrap();
    let n = udp_payload.len();
    let got = roce::icrc::from_wire([
        udp_payload[n - 4],
        udp_payload[n - 3],
        udp_payload[n - 2],
        udp_payload[n - 1],
    ]);
    (ident, src_port, udp_payload, got == want)
}

/// Brings `a`'s RC QP to RTS towards QPN `dest_qpn` at `peer`, a host that does not exist (its
/// packets are only captured), with path MTU 1024 and a local ACK timeout of 4.096 us x 2^20
/// (4.3 s: no retransmission while a test reads the first packets).
fn connect_to_nowhere(a: &Side, peer: IpAddr, dest_qpn: u32) {
    let c = Conn {
        timeout: 20,
        ..Conn::default()
    };
    bring_up_to(a, dest_qpn, hca::Gid::from(peer), 0, 0, QpType::Rc, c);
}

/// The device sends a 10-packet RDMA WRITE over IPv4 as one UDP GSO train; the kernel cuts it
/// into datagrams with IPv4 identifications 0, 1, 2, ... and every one must carry the ICRC of its
/// own identification (the ICRC covers it: rxe and NICs check it). Runs in a private network
/// namespace with a TUN device to read the packets as they leave (root only, else skipped).
#[test]
fn ipv4_gso_trains_carry_valid_icrcs_on_the_wire() {
    in_tun_namespace("hcagso0", "10.78.0.1/24", |tun| {
        let mut c = UdpDeviceConfig::new(ip("10.78.0.1"));
        c.link_mtu = Some(1500);
        let dev = Arc::new(UdpDevice::open(c).unwrap());
        if !dev.offloads().gso {
            eprintln!("skipped: no UDP GSO on this kernel");
            return;
        }
        let a = Side::new(dev, QpType::Rc, 0x10_0000);
        // A peer that does not exist: 10.78.0.2 (routed to the TUN), QPN 0x99.
        connect_to_nowhere(&a, ip("10.78.0.2"), 0x99);
        a.write(0, &pattern(10 * 1024, 3));
        a.post_send(
            1,
            &[a.sge(0, 10 * 1024)],
            SendOp::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0x1234,
            },
        );
        let mut idents = Vec::new();
        for _ in 0..10 {
            let p = tun
                .next_udp(Duration::from_secs(5))
                .expect("a packet on the TUN device");
            let (ident, _, _, icrc_ok) = wire_icrc(&p);
            assert!(icrc_ok, "ICRC of the datagram with identification {ident}");
            idents.push(ident);
        }
        eprintln!(
            "identifications on the wire: {idents:?}; trains {}",
            a.dev.link_counters().tx_gso_trains
        );
        assert!(a.dev.link_counters().tx_gso_trains >= 1);
        assert!(
            idents.iter().any(|&i| i > 0),
            "{idents:?}: no train was cut"
        );
    });
}

/// Eight QPs of one device send an RDMA WRITE each: every packet leaves from the UDP source port
/// its QPN selects among the device's sending sockets (per-QP flow entropy for ECMP, IBTA vol. 1
/// Annex A17.2.3), with an ICRC computed over that port, and the QPs spread over several ports.
/// Captured from a TUN device in a private network namespace (root only, else skipped).
#[test]
fn each_qp_sends_from_its_entropy_port() {
    in_tun_namespace("hcaport0", "10.79.0.1/24", |tun| {
        let mut c = UdpDeviceConfig::new(ip("10.79.0.1"));
        c.link_mtu = Some(1500);
        c.src_ports = 4;
        let dev = Arc::new(UdpDevice::open(c).unwrap());
        let ports = dev.src_ports();
        assert_eq!(ports.len(), 4);
        let sides: Vec<Side> = (0..8)
            .map(|i| Side::new(dev.clone(), QpType::Rc, 0x10_0000 * (i + 1)))
            .collect();
        for (i, a) in sides.iter().enumerate() {
            connect_to_nowhere(a, ip("10.79.0.2"), 0x100 + i as u32);
            a.write(0, &pattern(512, i as u8));
            a.post_send(
                1,
                &[a.sge(0, 512)],
                SendOp::RdmaWrite {
                    remote_addr: 0x1000,
                    rkey: 0x1234,
                },
            );
        }
        let mut seen = std::collections::BTreeMap::new();
        while seen.len() < sides.len() {
            let p = tun
                .next_udp(Duration::from_secs(5))
                .expect("a packet on the TUN device");
            let (_, src_port, udp_payload, icrc_ok) = wire_icrc(&p);
            // BTH bytes 5..8: the destination QPN; ours is 0x100 + i.
            let dest_qpn = u32::from_be_bytes([0, udp_payload[5], udp_payload[6], udp_payload[7]]);
            let a = &sides[(dest_qpn - 0x100) as usize];
            let want = hca::engine::src_port_for(&ports, roce::udp::rocev2_src_port(a.qpn));
            assert_eq!(src_port, want, "QPN {:#x}", a.qpn);
            assert!(icrc_ok, "ICRC of QPN {:#x}'s packet", a.qpn);
            // A retransmission must leave from the same port (asserted above); keep the first.
            seen.entry(a.qpn).or_insert(src_port);
        }
        let used: std::collections::BTreeSet<u16> = seen.values().copied().collect();
        eprintln!("source ports by QPN: {seen:x?}");
        assert!(used.len() >= 2, "8 QPs on one port: {seen:?}");
    });
}

#[test]
fn qps_share_the_window_budget() {
    let mut c = UdpDeviceConfig::new(ip("127.0.0.21"));
    c.port = 0;
    c.progress = Progress::Caller;
    c.window_budget = Some(256);
    let dev = UdpDevice::open(c).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let init = |qp_type| QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let first = dev.create_qp(pd, &init(QpType::Rc)).unwrap();
    assert_eq!(dev.qp_window(), 128, "one QP: the configured window");
    // UD QPs have no window and do not count.
    dev.create_qp(pd, &init(QpType::Ud)).unwrap();
    assert_eq!(dev.qp_window(), 128);
    let mut qps: Vec<u32> = (0..7)
        .map(|_| dev.create_qp(pd, &init(QpType::Uc)).unwrap())
        .collect();
    assert_eq!(dev.qp_window(), 256 / 8);
    qps.extend((0..56).map(|_| dev.create_qp(pd, &init(QpType::Rc)).unwrap()));
    assert_eq!(dev.qp_window(), 16, "64 QPs: at least 16 each");
    for q in qps {
        dev.destroy_qp(q).unwrap();
    }
    assert_eq!(dev.qp_window(), 128);
    dev.destroy_qp(first).unwrap();
}

/// A device closed right after it received a SEND still acknowledges it: `close` sends the ACK
/// that `EngineConfig::ack_delay` held back, so the peer's send completes with success instead of
/// retrying into a closed device until RETRY_EXC_ERR (what `rdma-pingpong`'s server saw about
/// every second short run: the client exited on its last receive with the ACK of it held).
#[test]
fn close_sends_the_held_ack() {
    let da = open("127.0.0.22", Progress::Thread);
    let mut c = UdpDeviceConfig::new(ip("127.0.0.23"));
    c.port = 0;
    c.progress = Progress::Caller;
    // Far longer than the test: only `close` can send the ACK.
    c.engine.ack_delay = Duration::from_secs(600);
    let db = UdpDevice::open(c).unwrap();
    let (a, b) = sides(da, db, QpType::Rc);
    // Local ACK timeout 4.096 us * 2^14 = 67 ms, one retry: without the ACK, RETRY_EXC_ERR
    // after about 134 ms.
    let conn = Conn {
        retry_cnt: 1,
        ..Conn::default()
    };
    bring_up(&a, &b, 0x100, 0x200, QpType::Rc, conn);
    bring_up(&b, &a, 0x200, 0x100, QpType::Rc, conn);
    b.post_recv(7, &[b.sge(0, 64)]);
    a.write(0, &pattern(8, 3));
    a.post_send(1, &[a.sge(0, 8)], SendOp::Send);
    let w = b.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (7, WcStatus::Success));
    b.dev.close();
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success), "{w:?}");
}

fn run_ok(args: &[&str]) -> bool {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .status()
        .is_ok_and(|s| s.success())
}

/// RC over sending sockets that fill up: in a private network namespace whose loopback holds
/// back what it sends (tc-tbf at 8 bit/s after a 4 KiB burst), 8 QPs (half with a flow label in
/// their address vector) of a device with 2 sending sockets of a small buffer each write 64 KiB;
/// once the device saw a full socket the queue is released, and every WRITE completes with its
/// data in place, nothing dropped or refused. IPv4 and IPv6; root only.
#[test]
fn rc_delivers_everything_through_full_sending_sockets() {
    through_full_sending_sockets(false);
}

/// As [`rc_delivers_everything_through_full_sending_sockets`], but the sending device is
/// closed while its sockets are full and its progress thread waits for room: close returns,
/// every WRITE completes (done or flushed), the thread is gone and the device's sockets are
/// closed.
#[test]
fn close_while_sending_sockets_are_full() {
    through_full_sending_sockets(true);
}

fn through_full_sending_sockets(close_while_full: bool) {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    for (a_addr, b_addr) in [("127.0.0.1", "127.0.0.2"), ("::1", "::1")] {
        std::thread::spawn(move || {
            // SAFETY: unshare(2) of this thread's network namespace; no pointers.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!("skipped: unshare: {}", std::io::Error::last_os_error());
                return;
            }
            let tbf = |rate: &str, burst: &str, verb: &str| {
                run_ok(&[
                    "tc", "qdisc", verb, "dev", "lo", "root", "tbf", "rate", rate, "burst", burst,
                    "limit", "50000000",
                ])
            };
            if !(run_ok(&["ip", "link", "set", "lo", "up"]) && tbf("8bit", "4096", "add")) {
                eprintln!("skipped: cannot set up lo with ip(8) / tc(8)");
                return;
            }
            let mut c = UdpDeviceConfig::new(ip(a_addr));
            c.port = 0;
            c.src_ports = 2;
            // The kernel doubles it: about 12 datagrams of MTU 1024 per socket.
            c.socket_buffer_bytes = Some(16 << 10);
            c.window_budget = Some(4096);
            let da = UdpDevice::open(c).unwrap();
            let mut c = UdpDeviceConfig::new(ip(b_addr));
            c.port = 0;
            let db = UdpDevice::open(c).unwrap();
            tell_ports(&da, &db);
            let (da, db) = (Arc::new(da), Arc::new(db));
            const LEN: usize = 64 << 10;
            let pairs: Vec<(Side, Side)> = (0..8u64)
                .map(|i| {
                    let a = Side::new(da.clone(), QpType::Rc, 0x10_0000 * (i + 1));
                    let b = Side::new(db.clone(), QpType::Rc, 0x1000_0000 * (i + 1));
                    // ACK timeout 4.096 us * 2^18 = 1.07 s: the held-back queue is no loss.
                    let c = Conn {
                        timeout: 18,
                        flow_label: if i % 2 == 1 {
                            0x1_0000 + i as u32 * 777
                        } else {
                            0
                        },
                        ..Conn::default()
                    };
                    bring_up(&a, &b, 0x100, 0x900, QpType::Rc, c);
                    bring_up(&b, &a, 0x900, 0x100, QpType::Rc, c);
                    (a, b)
                })
                .collect();
            for (i, (a, b)) in pairs.iter().enumerate() {
                a.write(0, &pattern(LEN, i as u8));
                a.post_send(
                    1,
                    &[a.sge(0, LEN as u32)],
                    SendOp::RdmaWrite {
                        remote_addr: b.addr(0),
                        rkey: b.mr.rkey(),
                    },
                );
            }
            let deadline = std::time::Instant::now() + WAIT;
            while da.device_counters().tx_blocked == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no socket ever filled"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            if close_while_full {
                let name = da.thread_name().unwrap();
                let ports = da.src_ports();
                da.close();
                for (i, (a, _)) in pairs.iter().enumerate() {
                    let w = a.wait(1);
                    assert!(
                        matches!(w[0].status, WcStatus::Success | WcStatus::WrFlushErr),
                        "{a_addr} QP {i}: {w:?}"
                    );
                }
                wait_thread_gone(&name);
                drop(pairs);
                drop(da);
                // The sending sockets are closed: their ports can be bound again. Not always at
                // once: another test of this binary that spawns a process (tc, ip) at the moment
                // of the close leaves the socket open in its child between fork and exec(2)
                // (a copy of the descriptor table; SOCK_CLOEXEC closes it only at the exec), so
                // the port frees when that child execs. A socket the device leaked stays bound
                // and fails the wait.
                for port in ports {
                    let deadline = std::time::Instant::now() + WAIT;
                    loop {
                        match std::net::UdpSocket::bind((ip(a_addr), port)) {
                            Ok(_) => break,
                            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                                assert!(
                                    std::time::Instant::now() < deadline,
                                    "{a_addr} port {port} still bound {WAIT:?} after close"
                                );
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Err(e) => panic!("{a_addr} port {port}: {e}"),
                        }
                    }
                }
                return;
            }
            assert!(tbf("10gbit", "1mb", "change"));
            // The queue runs again on its next packet (the bucket's timer waits for the old
            // rate): one datagram to itself kicks it.
            let kick = std::net::UdpSocket::bind((ip(a_addr), 0)).unwrap();
            kick.send_to(b"kick", kick.local_addr().unwrap()).unwrap();
            for (i, (a, b)) in pairs.iter().enumerate() {
                let w = a.wait(1);
                assert_eq!(w[0].status, WcStatus::Success, "{a_addr} QP {i}: {w:?}");
                assert!(
                    b.read(0, LEN) == pattern(LEN, i as u8),
                    "{a_addr} QP {i}: data"
                );
            }
            let (dc, lc) = (da.device_counters(), da.link_counters());
            eprintln!("{a_addr}: {dc:?}; link tx_full {}", lc.tx_full);
            assert_eq!((dc.tx_dropped, lc.tx_errors), (0, 0), "{a_addr}");
        })
        .join()
        .unwrap();
    }
}

/// CNPs leave from one of the link's ports: packets that A's address vector marks CE (traffic
/// class ECN bits 11) make B send CNPs (IBTA vol. 1 Annex A17.9), which reach A (their ICRC,
/// over the source port, checked on IPv6) and none of which the link refuses.
#[test]
fn cnps_leave_from_the_links_ports() {
    let da = open("::1", Progress::Thread);
    let db = open("::1", Progress::Thread);
    let (a, b) = sides(da, db, QpType::Rc);
    let ce = Conn {
        traffic_class: 0x03,
        ..Conn::default()
    };
    bring_up(&a, &b, 0x100, 0x900, QpType::Rc, ce);
    bring_up(&b, &a, 0x900, 0x100, QpType::Rc, Conn::default());
    a.write(0, &pattern(4096, 9));
    for i in 0..8 {
        b.post_recv(i, &[b.sge(i * 4096, 4096)]);
        a.post_send(i, &[a.sge(0, 4096)], SendOp::Send);
    }
    assert!(a.wait(8).iter().all(|w| w.status == WcStatus::Success));
    assert!(b.wait(8).iter().all(|w| w.status == WcStatus::Success));
    let deadline = std::time::Instant::now() + WAIT;
    while a.dev.counters().cnp_rcvd == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no CNP reached A: B {:?}, B's link {:?}",
            b.dev.counters(),
            b.dev.link_counters()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (cb, ca) = (b.dev.counters(), a.dev.counters());
    assert!(cb.cnp_sent >= 1, "{cb:?}");
    assert_eq!((ca.icrc_errors, ca.total_drops()), (0, 0), "{ca:?}");
    assert_eq!(b.dev.link_counters().tx_errors, 0);
    assert_eq!(b.dev.device_counters().tx_dropped, 0);
}

/// A peer played by a plain UDP socket on 127.0.0.1 that writes its own RoCEv2 packets: device
/// B (127.0.0.2) has an RC QP connected to it (QPN [`RAW_QPN`], B expects PSN [`RAW_PSN`]).
struct RawPeer {
    sock: std::net::UdpSocket,
    b: Side,
    /// B's address (where the packets go).
    to: std::net::SocketAddr,
}

const RAW_QPN: u32 = 0x99;
const RAW_PSN: u32 = 0x20;

impl RawPeer {
    fn new(b_addr: &str) -> RawPeer {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Don't Fragment (the ICRC covers the flags, and the engine assumes DF): an unconnected
        // socket's DF packets then carry IPv4 identification 0 (ip(7), `ip_select_ident`).
        let on: libc::c_int = libc::IP_PMTUDISC_DO;
        // SAFETY: a valid socket descriptor, a c_int option value of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "IP_MTU_DISCOVER");
        let dev = open(b_addr, Progress::Thread);
        let me = sock.local_addr().unwrap();
        // B's ACKs go to the raw socket (and are never read).
        dev.set_peer_port(me.ip(), me.port());
        let to = dev.local_addr();
        let b = Side::new(Arc::new(dev), QpType::Rc, 0x7700_0000);
        let c = Conn {
            timeout: 20,
            ..Conn::default()
        };
        bring_up_to(
            &b,
            RAW_QPN,
            hca::Gid::from(me.ip()),
            0,
            RAW_PSN,
            QpType::Rc,
            c,
        );
        RawPeer { sock, b, to }
    }

    /// The IP packet (IPv4 header through ICRC) of an RDMA WRITE ONLY of `payload` to B's MR at
    /// `offset` with PSN `psn`, as the kernel will send it from the raw socket: identification 0,
    /// Don't Fragment, RoCEv2's destination port.
    fn write_only(&self, psn: u32, offset: u64, payload: &[u8]) -> Vec<u8> {
        let (IpAddr::V4(src), IpAddr::V4(dst)) =
            (self.sock.local_addr().unwrap().ip(), self.to.ip())
        else {
            unreachable!("IPv4 addresses")
        };
        let repr = roce::packet::PacketRepr {
            ip: roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
                src_addr: src,
                dst_addr: dst,
                protocol: roce::ipv4::IpProtocol::Udp,
                payload_len: 0,
                hop_limit: 64,
                dscp: 0,
                ecn: roce::ipv4::Ecn::NotEct,
                ident: 0,
                dont_frag: true,
            }),
            udp_src_port: self.sock.local_addr().unwrap().port(),
            udp_checksum: false,
            transport: roce::packet::TransportRepr {
                bth: roce::bth::Repr {
                    opcode: roce::Opcode::RcRdmaWriteOnly,
                    solicited: false,
                    mig_req: true,
                    pad_cnt: 0,
                    pkey: 0xffff,
                    fecn: false,
                    becn: false,
                    dest_qpn: self.b.qpn,
                    ack_req: true,
                    psn,
                },
                ext: roce::packet::ExtReprs {
                    reth: Some(roce::reth::Repr {
                        virtual_address: self.b.addr(offset),
                        rkey: self.b.mr.rkey(),
                        dma_len: payload.len() as u32,
                    }),
                    ..roce::packet::ExtReprs::default()
                },
            },
        };
        let mut out = vec![0u8; 20 + 8 + 12 + 16 + payload.len() + 8];
        let n = roce::packet::build_ip_packet(&repr, &[payload], &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// Sends the UDP payload of IP packet `p` (the kernel writes the IP and UDP headers).
    fn send(&self, p: &[u8]) {
        self.sock.send_to(&p[28..], self.to).unwrap();
    }

    /// Waits (bounded) until B has dropped `drops` packets and received `rcvd`; returns its
    /// counters.
    fn wait_for(&self, drops: u64, rcvd: u64) -> hca::Counters {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let c = self.b.dev.counters();
            if c.total_drops() >= drops && c.rcvd_pkts >= rcvd {
                assert_eq!((c.total_drops(), c.rcvd_pkts), (drops, rcvd), "{c:?}");
                return c;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "waiting for {drops} drops and {rcvd} packets: {c:?} {:?}",
                self.b.dev.link_counters()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// IPv4 over a kernel socket, which never reports the identification the ICRC covers: the
/// device solves for it, accepts the valid packets (identification 0 from an unconnected DF
/// socket), and drops every packet with a single-bit error in the BTH, RETH, payload or ICRC
/// (IBTA vol. 1 §7.8.1; Annex A17.3.3), and every packet whose ICRC was computed over other IP or
/// UDP header fields than those on the wire (any one bit of the Total Length, flags and fragment
/// offset, source and destination addresses, UDP ports and length: what a socket sender controls
/// or could get wrong). Masked bits (BTH byte 4) are left alone.
#[test]
fn ipv4_icrc_is_verified_over_a_kernel_socket() {
    let peer = RawPeer::new("127.0.0.2");
    let payload = pattern(64, 9);
    let (mut drops, mut rcvd) = (0u64, 0u64);

    // A valid WRITE lands.
    let valid = peer.write_only(RAW_PSN, 0, &payload);
    peer.send(&valid);
    rcvd += 1;
    let c = peer.wait_for(drops, rcvd);
    assert_eq!((c.icrc_ident_solved, c.icrc_errors), (1, 0), "{c:?}");
    assert_eq!(peer.b.read(0, 64), payload);

    // Single-bit flips of the UDP payload, in chunks (the socket buffer must not overflow).
    // Flips in the BTH's opcode, version, pad count, P_Key and destination QPN may be caught by
    // an earlier receive check; everything else only by the ICRC.
    let p = peer.write_only(RAW_PSN + 1, 4096, &payload);
    let udp_payload_len = p.len() - 28;
    let earlier = |byte: usize| matches!(byte, 0..=3 | 5..=7);
    let mut bits = Vec::new();
    for byte in (0..udp_payload_len).filter(|&b| b != 4) {
        for bit in 0..8 {
            bits.push((byte, bit));
        }
    }
    let mut icrc_only = 0;
    for chunk in bits.chunks(32) {
        for &(byte, bit) in chunk {
            let mut bad = p.clone();
            bad[28 + byte] ^= 1 << bit;
            peer.send(&bad);
            icrc_only += u64::from(!earlier(byte));
        }
        drops += chunk.len() as u64;
        peer.wait_for(drops, rcvd);
    }
    let c = peer.b.dev.counters();
    assert!(c.icrc_errors >= icrc_only, "{icrc_only}: {c:?}");
    assert_eq!(c.icrc_errors, c.drops(hca::DropReason::Icrc));
    assert_eq!(c.icrc_ident_solved, 1, "{c:?}");

    // ICRCs computed over IP and UDP header fields that differ in one bit from the wire's.
    let before = c.icrc_errors;
    let header_bits = [
        2usize, 3, 6, 7, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
    ];
    for chunk in header_bits.chunks(4) {
        for &byte in chunk {
            for bit in 0..8 {
                let mut other = p.clone();
                other[byte] ^= 1 << bit;
                let n = other.len();
                let icrc = roce::icrc::compute(&other[..n - 4]).unwrap();
                let mut bad = p.clone();
                bad[n - 4..].copy_from_slice(&roce::icrc::to_wire(icrc));
                peer.send(&bad);
            }
        }
        drops += 8 * chunk.len() as u64;
        peer.wait_for(drops, rcvd);
    }
    let c = peer.b.dev.counters();
    assert_eq!(
        c.icrc_errors - before,
        8 * header_bits.len() as u64,
        "{c:?}"
    );
    assert_eq!(
        peer.b.read(4096, 64),
        vec![0; 64],
        "no corrupted WRITE landed"
    );

    // The valid packet still lands.
    peer.send(&p);
    rcvd += 1;
    let c = peer.wait_for(drops, rcvd);
    assert_eq!(c.icrc_ident_solved, 2, "{c:?}");
    assert_eq!(c.icrc_errors, c.drops(hca::DropReason::Icrc));
    assert_eq!(peer.b.read(4096, 64), payload);
    assert_eq!(peer.b.dev.link_counters().rx_kernel_drops, 0);
}

/// Two devices on 127.0.0.1 and 127.0.0.2 exchange 64 KiB RDMA WRITEs both ways: the sender's UDP
/// GSO trains leave with IPv4 identifications 0, 1, 2, ... (each packet's ICRC computed for its
/// own), the receiver solves for each and accepts every packet: no ICRC error, no drop.
#[test]
fn ipv4_gso_trains_between_two_devices_pass_the_icrc() {
    let (a, b) = pair(
        "127.0.0.1",
        "127.0.0.2",
        Progress::Thread,
        QpType::Rc,
        Conn::default(),
    );
    const LEN: usize = 64 * 1024;
    for round in 0..4u8 {
        for (from, to) in [(&a, &b), (&b, &a)] {
            let data = pattern(LEN, round);
            from.write(0, &data);
            from.post_send(
                u64::from(round),
                &[from.sge(0, LEN as u32)],
                SendOp::RdmaWrite {
                    remote_addr: to.addr(LEN as u64),
                    rkey: to.mr.rkey(),
                },
            );
            let w = from.wait(1);
            assert_eq!(w[0].status, WcStatus::Success);
            assert_eq!(to.read(LEN, LEN), data);
        }
    }
    for side in [&a, &b] {
        let c = side.dev.counters();
        assert_eq!(c.total_drops(), 0, "{c:?}");
        assert_eq!(c.icrc_errors, 0, "{c:?}");
        assert_eq!(c.icrc_ident_solved, c.rcvd_pkts, "{c:?}");
        // 4 WRITEs of 64 packets (path MTU 1024) at least.
        assert!(c.rcvd_pkts >= 4 * 64, "{c:?}");
    }
    for side in [&a, &b] {
        let l = side.dev.link_counters();
        eprintln!(
            "{}: {} GSO trains, {} datagrams sent",
            side.dev.local_addr(),
            l.tx_gso_trains,
            l.tx_datagrams
        );
        if side.dev.offloads().gso {
            assert!(l.tx_gso_trains > 0, "{l:?}");
        }
    }
}

/// UDP sockets bound to `addr:4791` (/proc/net/udp; IPv4).
fn udp_sockets_on_4791(addr: std::net::Ipv4Addr) -> usize {
    let hex = format!("{:08X}:12B7", u32::from_le_bytes(addr.octets()));
    std::fs::read_to_string("/proc/net/udp")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&hex))
        .count()
}

/// Shared devices (`hca::link::udp::share`) on `shared` and port 4791 (`progress` if given):
/// X, Y, B take slots 0, 1, 2; X closes, so the kernel moves B's socket to index 0; W takes the
/// free slot 0 and joins at index 2. Returns (Y, B, W), whose datagrams now travel as strays.
fn reordered_shared_group(
    shared: std::net::Ipv4Addr,
    progress: Option<Progress>,
) -> (UdpDevice, UdpDevice, UdpDevice) {
    let open_shared = || {
        let mut c = UdpDeviceConfig::new(IpAddr::V4(shared));
        c.share = true;
        if let Some(p) = progress {
            c.progress = p;
        }
        UdpDevice::open(c).unwrap()
    };
    let slot = |d: &UdpDevice| d.with_link_mut(|l| l.link().share_slot());
    let x = open_shared();
    let y = open_shared();
    let b = open_shared();
    assert_eq!((slot(&x), slot(&y), slot(&b)), (Some(0), Some(1), Some(2)));
    assert_eq!(udp_sockets_on_4791(shared), 3);
    drop(x);
    let start = std::time::Instant::now();
    while udp_sockets_on_4791(shared) != 2 {
        assert!(start.elapsed() < WAIT, "X's socket is still open");
        std::thread::sleep(Duration::from_millis(5));
    }
    let w = open_shared();
    assert_eq!(slot(&w), Some(0));
    (y, b, w)
}

/// Shared devices (`hca::link::udp::share`) on one address and port 4791: X, Y, B take slots
/// 0, 1, 2; X closes, so the kernel moves B's socket to index 0; W takes the free slot 0 and
/// joins at index 2. B's datagrams (slot 2) now reach W and W's (slot 0) reach B: each forwards
/// the other's to it, and RC traffic of both against a peer on another address is intact.
#[test]
fn shared_devices_forward_strays_after_the_group_reorders() {
    let pid = std::process::id();
    let (b1, b2) = ((pid >> 8) as u8, pid as u8);
    let shared = std::net::Ipv4Addr::new(127, b1, b2, 201);
    let other = format!("127.{b1}.{b2}.202");
    let (y, b, w) = reordered_shared_group(shared, None);
    let (sb, ob) = pair_of(
        b,
        open(&other, Progress::Thread),
        QpType::Rc,
        Conn::default(),
    );
    all_rc_operations(&ob, &sb);
    all_rc_operations(&sb, &ob);
    let (sw, ow) = pair_of(
        w,
        open(&other, Progress::Thread),
        QpType::Rc,
        Conn::default(),
    );
    all_rc_operations(&ow, &sw);
    all_rc_operations(&sw, &ow);
    let counters = |s: &Side| s.dev.with_link_mut(|l| *l.link().counters());
    let (cb, cw) = (counters(&sb), counters(&sw));
    assert!(cw.rx_forwarded > 0, "W forwarded B's datagrams: {cw:?}");
    assert!(cb.rx_forwarded > 0, "B forwarded W's datagrams: {cb:?}");
    // None is lost: strays that find their owner's slot queue full (net.unix.max_dgram_qlen
    // datagrams, 10 by default) are held back and sent when it has room (`rx_strays_held`).
    eprintln!(
        "strays: B forwarded {} held {}, W forwarded {} held {}",
        cb.rx_forwarded, cb.rx_strays_held, cw.rx_forwarded, cw.rx_strays_held
    );
    assert_eq!(
        (cb.rx_strays, cw.rx_strays),
        (0, 0),
        "strays lost: {cb:?} {cw:?}"
    );
    assert_eq!(
        (cb.rx_forward_refused, cw.rx_forward_refused),
        (0, 0),
        "only this user's processes forward"
    );
    drop(y);
}

/// `iters` SEND ping-pongs of 8 bytes between `a` and `b`, both busy-polled by this thread
/// ([`spin_one`]), data checked.
fn spin_ping_pong(a: &Side, b: &Side, iters: u64) {
    for i in 0..iters {
        b.post_recv(i, &[b.sge(4096, 8)]);
        a.write(0, &i.to_le_bytes());
        a.post_send(i, &[a.sge(0, 8)], SendOp::Send);
        let r = spin_one(b);
        assert_eq!((r.status, r.wr_id), (WcStatus::Success, i));
        assert_eq!(b.read(4096, 8), i.to_le_bytes());
        a.post_recv(i, &[a.sge(8192, 8)]);
        b.post_send(i, &[b.sge(4096, 8)], SendOp::Send);
        let mut got = [spin_one(a), spin_one(a)];
        got.sort_by_key(|w| w.opcode == WcOpcode::Send);
        assert!(
            got.iter()
                .all(|w| w.status == WcStatus::Success && w.wr_id == i),
            "{got:?}"
        );
        assert_eq!(a.read(8192, 8), i.to_le_bytes());
        assert_eq!(spin_one(b).wr_id, i, "b's SEND completed");
    }
}

/// A shared device (`hca::link::udp::share`) busy-polled with `Progress::Hybrid`: its rounds
/// read the slot socket for forwarded strays only every 16th round when nothing says a stray
/// waits (one receive system call per empty poll, as an unshared device, instead of two),
/// and the ping-pong is intact.
#[test]
fn busy_polled_shared_device_reads_its_slot_socket_every_16th_round() {
    let pid = std::process::id();
    let (b1, b2) = ((pid >> 8) as u8, pid as u8);
    let mut c = UdpDeviceConfig::new(IpAddr::V4(std::net::Ipv4Addr::new(127, b1, b2, 203)));
    c.share = true;
    c.progress = Progress::Hybrid;
    let shared = UdpDevice::open(c).unwrap();
    let (s, o) = pair_of(
        shared,
        open(&format!("127.{b1}.{b2}.204"), Progress::Hybrid),
        QpType::Rc,
        Conn::default(),
    );
    let reads = |d: &UdpDevice| d.with_link_mut(|l| l.link().counters().rx_slot_reads);
    let (reads_before, rounds_before) = (reads(&s.dev), s.dev.device_counters().rounds);
    spin_ping_pong(&s, &o, 1000);
    spin_ping_pong(&o, &s, 1000);
    let reads = reads(&s.dev) - reads_before;
    let rounds = s.dev.device_counters().rounds - rounds_before;
    eprintln!("shared device: {rounds} rounds, {reads} reads of the slot socket");
    assert!(rounds >= 4000, "rounds {rounds}");
    // Every 16th round (rounded up), a stray-less device's thread included: its wait never
    // sees the slot socket readable.
    assert!(
        reads > 0 && reads * 16 <= rounds + 16,
        "{reads} slot reads in {rounds} rounds"
    );
}

/// As [`shared_devices_forward_strays_after_the_group_reorders`], with both shared devices in
/// `Progress::Hybrid` and busy-polled: a stray forwarded to a polling process reaches it
/// although its rounds read the slot socket only every few rounds, none is lost, and the
/// ping-pongs through the forwarding are intact.
#[test]
fn busy_polled_shared_devices_receive_forwarded_strays() {
    let pid = std::process::id();
    let (b1, b2) = ((pid >> 8) as u8, pid as u8);
    let shared = std::net::Ipv4Addr::new(127, b1, b2, 205);
    let other = format!("127.{b1}.{b2}.206");
    // W takes slot 0 and index 2: B's datagrams reach W, W's reach B.
    let (y, b, w) = reordered_shared_group(shared, Some(Progress::Hybrid));
    let (sb, ob) = pair_of(
        b,
        open(&other, Progress::Hybrid),
        QpType::Rc,
        Conn::default(),
    );
    let (sw, ow) = pair_of(
        w,
        open(&other, Progress::Hybrid),
        QpType::Rc,
        Conn::default(),
    );
    spin_ping_pong(&ob, &sb, 300);
    spin_ping_pong(&sw, &ow, 300);
    spin_ping_pong(&sb, &ob, 300);
    spin_ping_pong(&ow, &sw, 300);
    let counters = |s: &Side| s.dev.with_link_mut(|l| *l.link().counters());
    let (cb, cw) = (counters(&sb), counters(&sw));
    assert!(cw.rx_forwarded > 0, "W forwarded B's datagrams: {cw:?}");
    assert!(cb.rx_forwarded > 0, "B forwarded W's datagrams: {cb:?}");
    assert_eq!(
        (cb.rx_strays, cw.rx_strays),
        (0, 0),
        "strays lost: {cb:?} {cw:?}"
    );
    drop(y);
}

/// Busy-polls `side`'s CQ for one completion (bounded in polls and time).
fn spin_one(side: &Side) -> WorkCompletion {
    let start = std::time::Instant::now();
    let mut wc = [WorkCompletion::success(0, WcOpcode::Send, 0, 0)];
    for _ in 0..50_000_000u64 {
        if side.dev.poll_cq(side.cq, &mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(start.elapsed() < WAIT, "no completion within {WAIT:?}");
    }
    panic!("no completion within 50 million polls");
}

/// `Progress::Hybrid` (the drop-in libibverbs' mode): a busy-polling ping-pong driven by the
/// polling thread completes with its data intact; a passive RDMA WRITE target that never polls,
/// and a program that arms its CQ and blocks, are still served by the progress thread.
#[test]
fn hybrid_progress_leaves_busy_polling_to_the_caller() {
    let (a, b) = pair(
        "127.0.0.83",
        "127.0.0.84",
        Progress::Hybrid,
        QpType::Rc,
        Conn::default(),
    );
    all_rc_operations(&a, &b);
    all_rc_operations(&b, &a);
    const N: u64 = 2000;
    let before = (a.dev.device_counters(), b.dev.device_counters());
    let engine_before = (a.dev.counters(), b.dev.counters());
    for i in 0..N {
        b.post_recv(i, &[b.sge(4096, 8)]);
        a.write(0, &i.to_le_bytes());
        a.post_send(i, &[a.sge(0, 8)], SendOp::Send);
        let r = spin_one(&b);
        assert_eq!((r.status, r.wr_id), (WcStatus::Success, i));
        assert_eq!(b.read(4096, 8), i.to_le_bytes());
        a.post_recv(i, &[a.sge(8192, 8)]);
        b.post_send(i, &[b.sge(4096, 8)], SendOp::Send);
        // a: its SEND's completion and the reply, in either order.
        let mut got = [spin_one(&a), spin_one(&a)];
        got.sort_by_key(|w| w.opcode == WcOpcode::Send);
        assert!(got
            .iter()
            .all(|w| w.status == WcStatus::Success && w.wr_id == i));
        assert_eq!(a.read(8192, 8), i.to_le_bytes());
        assert_eq!(spin_one(&b).wr_id, i, "b's SEND completed");
    }
    let after = (a.dev.device_counters(), b.dev.device_counters());
    let engine_after = (a.dev.counters(), b.dev.counters());
    // Nothing lost or ignored on the way (the question of the ib_send_lat stalls, README
    // "Hybrid progress"): every packet one end sent, the other received and validated, no
    // drop of any reason, and at least the N SENDs and N ACKs of each end left.
    let sent = (
        engine_after.0.sent_pkts - engine_before.0.sent_pkts,
        engine_after.1.sent_pkts - engine_before.1.sent_pkts,
    );
    let rcvd = (
        engine_after.0.rcvd_pkts - engine_before.0.rcvd_pkts,
        engine_after.1.rcvd_pkts - engine_before.1.rcvd_pkts,
    );
    assert_eq!(
        (sent.0, sent.1),
        (rcvd.1, rcvd.0),
        "sent a, b vs received b, a"
    );
    assert!(sent.0 >= 2 * N && sent.1 >= 2 * N, "sent {sent:?}");
    assert_eq!(
        (
            engine_after.0.total_drops() - engine_before.0.total_drops(),
            engine_after.1.total_drops() - engine_before.1.total_drops()
        ),
        (0, 0),
        "drops a {:?} b {:?}",
        engine_after.0,
        engine_after.1
    );
    // Printed, not asserted: a caller descheduled longer than the QP's ACK timeout (67 ms)
    // makes a retransmission legitimate.
    eprintln!(
        "over {N} round trips: retransmissions a {} b {}, caller round gaps > 1 ms a {} b {}",
        engine_after.0.completer_retry_err - engine_before.0.completer_retry_err,
        engine_after.1.completer_retry_err - engine_before.1.completer_retry_err,
        after.0.caller_round_gaps - before.0.caller_round_gaps,
        after.1.caller_round_gaps - before.1.caller_round_gaps,
    );
    let sleeps = (
        after.0.sleeps - before.0.sleeps,
        after.1.sleeps - before.1.sleeps,
    );
    // Printed, not asserted: how often the threads sleep depends on the scheduler (a caller
    // descheduled for a CALLER_WINDOW hands the socket back). The counts as evidence come from
    // release builds (README, "Benchmarks": voluntary context switches of ib_send_lat).
    eprintln!(
        "over {N} round trips: thread sleeps a {} b {}, wakes a {} b {}",
        sleeps.0,
        sleeps.1,
        after.0.wakes - before.0.wakes,
        after.1.wakes - before.1.wakes
    );
    // b never polls now: its thread serves the WRITE once b's caller window has ended.
    let data = pattern(4096, 7);
    a.write(0, &data);
    a.post_send(
        N,
        &[a.sge(0, 4096)],
        SendOp::RdmaWrite {
            remote_addr: b.addr(16384),
            rkey: b.mr.rkey(),
        },
    );
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.read(16384, 4096), data);
    // b arms its CQ and blocks: the thread receives.
    b.dev.req_notify_cq(b.cq, false).unwrap();
    b.post_recv(N, &[b.sge(4096, 8)]);
    a.post_send(N + 1, &[a.sge(0, 8)], SendOp::Send);
    assert_eq!(b.wait(1)[0].wr_id, N);
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
}
