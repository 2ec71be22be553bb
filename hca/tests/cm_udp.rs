//! The RDMA CM driven from real devices: `hca::rdma_cm::CmService` on software HCAs opened by
//! `hca::open::open` over UDP sockets on loopback (127.0.0.1 and 127.0.0.2, and two ports of ::1
//! where the host has IPv6; ephemeral ports told to each other). The service's thread receives
//! QP1's MADs and fires the CM's timers by itself; the tests only make the calls and read events,
//! through `get_event` with a timeout and through poll(2) on the event fd.
//!
//! Covered: resolve, listen, connect, accept, ESTABLISHED on both sides, an RDMA WRITE on the QPs
//! the CM connected, DISCONNECTED and TIMEWAIT_EXIT on both sides; a connect to a port nobody
//! listens on (REJECTED, reason 8); a consumer reject with private data (REJECTED, 28); a connect
//! to a dead peer (UNREACHABLE after exactly `max_cm_retries` resends); an idle service that does
//! not wake up; devices without a progress thread; UD over SIDR (`RDMA_PS_UDP`: accept with QPN
//! and Q_Key, reject, closed port). Every wait is bounded by a timeout or a count; no
//! assertion is on a duration.
#![cfg(all(feature = "std", target_os = "linux"))]

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::cm::CmConfig;
use hca::open::{open, DeviceSpec, OpenOptions};
use hca::rdma_cm::{CmService, RdmaCmEvent, RdmaCmEventType as E, ETIMEDOUT};
use hca::soft::Progress;
use hca::verbs::api::Verbs;
use hca::{
    AccessFlags, CqHandle, MemoryRegion, QpCap, QpInitAttr, QpType, SendFlags, SendOp, SendWr, Sge,
    WcStatus,
};

/// Longest wait for one event; the CM's own timers (below) are far shorter.
const WAIT: Duration = Duration::from_secs(20);

fn config() -> CmConfig {
    CmConfig {
        response_timeout: 16, // 268 ms
        max_cm_retries: 3,
        timewait: Duration::from_millis(100),
        ..CmConfig::default()
    }
}

struct Side {
    dev: Arc<dyn Verbs>,
    cm: CmService,
    cq: CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

impl Side {
    fn open(addr: &str, config: CmConfig) -> Side {
        Side::open_with(addr, config, Progress::Thread)
    }

    fn open_with(addr: &str, config: CmConfig, progress: Progress) -> Side {
        let options = OpenOptions {
            default_udp_port: 0,
            progress,
            ..OpenOptions::default()
        };
        let dev = open(&addr.parse::<DeviceSpec>().unwrap(), &options).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mem = Arc::new(HostMemory::new(1 << 16).unwrap());
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = dev
            .reg_mr(pd, mem.clone(), 0, 1 << 16, 0x1000, access)
            .unwrap();
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qpn = dev.create_qp(pd, &init).unwrap();
        let cm = CmService::start(dev.clone(), config).unwrap();
        Side {
            dev,
            cm,
            cq,
            qpn,
            mem,
            mr,
        }
    }

    fn ip(&self) -> IpAddr {
        self.dev.default_gid().1.to_ip()
    }

    fn port(&self) -> u16 {
        self.dev.udp_port().unwrap()
    }

    /// The next event, which must be `ev` (after at most `WAIT`).
    fn expect(&self, ev: E) -> RdmaCmEvent {
        let e = self
            .cm
            .get_event(WAIT)
            .unwrap_or_else(|| panic!("no {ev:?} event within {WAIT:?}"));
        assert_eq!(e.event, ev, "{e:?}");
        e
    }

    /// Resolves `dst` and connects this side's QP to it with `data`; returns the ID.
    fn connect(&self, dst: SocketAddr, data: &[u8]) -> u32 {
        let id = self.cm.create_id().unwrap();
        self.cm.resolve_addr(id, None, dst).unwrap();
        assert_eq!(self.expect(E::AddrResolved).id, id);
        self.cm.resolve_route(id).unwrap();
        assert_eq!(self.expect(E::RouteResolved).id, id);
        self.cm.connect(id, self.qpn, data).unwrap();
        id
    }
}

fn pair(a: &str, b: &str, config: CmConfig) -> (Side, Side) {
    let a = Side::open(a, config.clone());
    let b = Side::open(b, config);
    a.dev.set_peer_port(b.ip(), b.port()).unwrap();
    b.dev.set_peer_port(a.ip(), a.port()).unwrap();
    (a, b)
}

/// Whether `fd` is readable now (poll(2) with a zero timeout).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one live pollfd for the call; `fd` stays open while borrowed.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    assert!(rc >= 0, "poll: {}", std::io::Error::last_os_error());
    p.revents & libc::POLLIN != 0
}

/// Blocks in poll(2) on `fd` until it is readable, at most `WAIT`.
fn wait_readable(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: as in `readable`.
    let rc = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as libc::c_int) };
    rc > 0 && p.revents & libc::POLLIN != 0
}

/// The whole life of a connection between `a` (active) and `b` (passive, listening on `listen`).
fn connect_write_disconnect(a: &Side, b: &Side, listen: SocketAddr) {
    let l = b.cm.create_id().unwrap();
    b.cm.listen(l, listen).unwrap();
    assert!(!readable(b.cm.event_fd()), "no event yet");

    let id = a.connect(SocketAddr::new(b.ip(), listen.port()), b"over udp");
    // The passive side's event fd becomes readable by itself (the service thread took the REQ).
    assert!(wait_readable(b.cm.event_fd()));
    let req = b.expect(E::ConnectRequest);
    assert!(!readable(b.cm.event_fd()), "queue drained: not readable");
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(&req.private_data[..8], b"over udp");
    let (local, remote) = b.cm.addresses(req.id).unwrap();
    assert_eq!(local.unwrap().ip(), b.ip());
    assert_eq!(remote.unwrap().ip(), a.ip());
    b.cm.accept(req.id, b.qpn, b"welcome").unwrap();
    let est_a = a.expect(E::Established);
    assert_eq!(est_a.id, id);
    assert_eq!(&est_a.private_data[..7], b"welcome");
    assert_eq!(b.expect(E::Established).id, req.id);

    // The CM moved both QPs to RTS with each other's QPN and PSN: an RDMA WRITE lands.
    a.mem.write(0, &[0xc3; 4096]).unwrap();
    let sge = [Sge {
        addr: a.mr.iova(),
        length: 4096,
        lkey: a.mr.lkey(),
    }];
    let wr = SendWr {
        wr_id: 5,
        sg_list: &sge,
        op: SendOp::RdmaWrite {
            remote_addr: b.mr.iova() + 8192,
            rkey: b.mr.rkey(),
        },
        send_flags: SendFlags::SIGNALED,
    };
    a.dev.post_send(a.qpn, &wr).unwrap();
    let wc = a.dev.wait_cq(a.cq, 1, WAIT).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
    let mut got = vec![0u8; 4096];
    b.mem.read(8192, &mut got).unwrap();
    assert_eq!(got, vec![0xc3; 4096]);

    // The passive side disconnects; both see DISCONNECTED, then TIMEWAIT_EXIT.
    b.cm.disconnect(req.id).unwrap();
    for (s, id) in [(a, id), (b, req.id)] {
        assert_eq!(s.expect(E::Disconnected).id, id);
        assert_eq!(s.expect(E::TimewaitExit).id, id);
        assert_eq!(s.cm.with_cm(|cm| cm.cm().connection_count()), 0);
        assert!(s.cm.get_event(Duration::ZERO).is_none());
        let c = s.cm.counters();
        assert!(c.mads >= 2 && c.events_lost == 0, "{c:?}");
    }
    for s in [a, b] {
        let st = s.dev.stats().unwrap();
        assert!(st[0].1.contains("gsi_sent"), "{st:?}");
    }
}

#[test]
fn connect_write_disconnect_over_ipv4_loopback() {
    let (a, b) = pair("udp:127.0.0.1", "udp:127.0.0.2", config());
    connect_write_disconnect(&a, &b, "0.0.0.0:7471".parse().unwrap());
}

#[test]
fn connect_write_disconnect_over_ipv6_loopback() {
    let options = OpenOptions {
        default_udp_port: 0,
        ..OpenOptions::default()
    };
    if open(&"udp:::1".parse::<DeviceSpec>().unwrap(), &options).is_err() {
        eprintln!("SKIP: this host has no IPv6 loopback (::1)");
        return;
    }
    // Two devices on ::1, told each other's port: a listener on the specific address.
    let (a, b) = pair("udp:::1", "udp:::1", config());
    connect_write_disconnect(&a, &b, "[::1]:7472".parse().unwrap());
}

#[test]
fn a_closed_port_is_rejected_and_a_consumer_reject_carries_its_data() {
    let (a, b) = pair("udp:127.0.0.1", "udp:127.0.0.2", config());
    let id = a.connect(SocketAddr::new(b.ip(), 9), b"");
    let e = a.expect(E::Rejected);
    assert_eq!(
        (e.id, e.status),
        (id, 8),
        "REJ reason 8: invalid service ID"
    );

    let l = b.cm.create_id().unwrap();
    b.cm.listen(l, "0.0.0.0:7473".parse().unwrap()).unwrap();
    let id = a.connect(SocketAddr::new(b.ip(), 7473), b"let me in");
    let req = b.expect(E::ConnectRequest);
    b.cm.reject(req.id, b"no").unwrap();
    let e = a.expect(E::Rejected);
    assert_eq!(
        (e.id, e.status),
        (id, 28),
        "REJ reason 28: consumer defined"
    );
    assert_eq!(&e.private_data[..2], b"no");

    // A destroyed listener's port is closed again: REJ reason 8.
    b.cm.destroy_id(l);
    let id = a.connect(SocketAddr::new(b.ip(), 7473), b"");
    let e = a.expect(E::Rejected);
    assert_eq!((e.id, e.status), (id, 8));
}

#[test]
fn a_dead_peer_is_unreachable_after_the_retries() {
    let cfg = CmConfig {
        response_timeout: 14, // 67 ms
        max_cm_retries: 3,
        ..config()
    };
    let (a, b) = pair("udp:127.0.0.1", "udp:127.0.0.2", cfg);
    let dst = SocketAddr::new(b.ip(), 7474);
    // The peer goes away: its socket is closed, nothing answers (the kernel may answer ICMP
    // port unreachable, which the device counts and ignores).
    drop(b);
    let id = a.connect(dst, b"anyone?");
    let e = a.expect(E::Unreachable);
    assert_eq!((e.id, e.status), (id, ETIMEDOUT));
    let c = a.cm.with_cm(|cm| cm.cm().counters().clone());
    assert_eq!(
        c.retransmits, 3,
        "the REQ was resent max_cm_retries times: {c:?}"
    );
    assert!(a.cm.get_event(Duration::ZERO).is_none());
    // The CM moved the QP to ERR.
    let (attr, _) = a.dev.query_qp(a.qpn).unwrap();
    assert_eq!(attr.qp_state, hca::QpState::Err);
}

#[test]
fn an_idle_service_sleeps() {
    let (a, b) = pair("udp:127.0.0.1", "udp:127.0.0.2", config());
    let l = b.cm.create_id().unwrap();
    b.cm.listen(l, "0.0.0.0:7475".parse().unwrap()).unwrap();
    let _id = a.connect(SocketAddr::new(b.ip(), 7475), b"");
    let req = b.expect(E::ConnectRequest);
    b.cm.accept(req.id, b.qpn, b"").unwrap();
    a.expect(E::Established);
    b.expect(E::Established);
    // Established and quiet: no timer is armed and no MAD arrives, so neither service thread
    // runs a turn while nothing happens (a polling loop would run thousands).
    let before = [a.cm.counters().turns, b.cm.counters().turns];
    assert!(a.cm.get_event(Duration::from_millis(300)).is_none());
    let after = [a.cm.counters().turns, b.cm.counters().turns];
    for (x, y) in before.iter().zip(after) {
        assert!(y - x <= 2, "turns {before:?} -> {after:?}");
    }
}

#[test]
fn one_cm_per_device_qp1() {
    let a = Side::open("udp:127.0.0.1", config());
    let err = CmService::start(a.dev.clone(), config()).unwrap_err();
    assert!(err.to_string().contains("second MAD consumer"), "{err}");
    // Dropping the service frees QP1 for another.
    let Side { dev, cm, .. } = a;
    drop(cm);
    let again = CmService::start(dev.clone(), config()).unwrap();
    drop(again);
}

#[test]
fn devices_without_a_progress_thread_connect_too() {
    // Progress::Caller: nobody else receives, so the service thread drives progress rounds itself
    // (every CALLER_POLL at most) and still gets the MADs.
    let a = Side::open_with("udp:127.0.0.1", config(), Progress::Caller);
    let b = Side::open_with("udp:127.0.0.2", config(), Progress::Caller);
    a.dev.set_peer_port(b.ip(), b.port()).unwrap();
    b.dev.set_peer_port(a.ip(), a.port()).unwrap();
    let l = b.cm.create_id().unwrap();
    b.cm.listen(l, "0.0.0.0:7476".parse().unwrap()).unwrap();
    let id = a.connect(SocketAddr::new(b.ip(), 7476), b"caller");
    let req = b.expect(E::ConnectRequest);
    b.cm.accept(req.id, b.qpn, b"").unwrap();
    assert_eq!(a.expect(E::Established).id, id);
    assert_eq!(b.expect(E::Established).id, req.id);
    a.cm.disconnect(id).unwrap();
    assert_eq!(a.expect(E::Disconnected).id, id);
    assert_eq!(b.expect(E::Disconnected).id, req.id);
}

/// UD over SIDR through `CmService` (`RDMA_PS_UDP`): a SIDR_REQ accepted (the active side's
/// `ESTABLISHED` carries the QPN and Q_Key the accept named), one rejected (`UNREACHABLE`, SIDR
/// status 2, with the reject's private data) and one to a UDP port nobody listens on
/// (`UNREACHABLE`, status 1) between two devices on loopback.
#[test]
fn ud_sidr_accept_reject_and_a_closed_port() {
    use hca::rdma_cm::{UdParam, RDMA_UDP_QKEY};
    use roce::cm::port_space;
    let (a, b) = pair("udp:127.0.0.1", "udp:127.0.0.2", config());
    let l = b.cm.create_id_ps(port_space::UDP).unwrap();
    let listen = SocketAddr::new(b.ip(), 7175);
    b.cm.listen(l, listen).unwrap();
    let resolve = |port: u16| {
        let id = a.cm.create_id_ps(port_space::UDP).unwrap();
        a.cm.resolve_addr(id, None, SocketAddr::new(b.ip(), port))
            .unwrap();
        a.expect(E::AddrResolved);
        a.cm.resolve_route(id).unwrap();
        a.expect(E::RouteResolved);
        id
    };
    let id = resolve(7175);
    a.cm.connect(id, 0, b"ud?").unwrap();
    let req = b.expect(E::ConnectRequest);
    assert_eq!((req.listen_id, req.ud), (Some(l), Some(UdParam::default())));
    assert_eq!(&req.private_data[..3], b"ud?");
    b.cm.accept(req.id, b.qpn, b"ud!").unwrap();
    let est = a.expect(E::Established);
    assert_eq!(est.id, id);
    assert_eq!(
        est.ud,
        Some(UdParam {
            qp_num: b.qpn,
            qkey: RDMA_UDP_QKEY
        })
    );
    assert_eq!(&est.private_data[..3], b"ud!");

    let id = resolve(7175);
    a.cm.connect(id, 0, b"").unwrap();
    let req = b.expect(E::ConnectRequest);
    b.cm.reject(req.id, b"no").unwrap();
    let u = a.expect(E::Unreachable);
    assert_eq!((u.id, u.status, &u.private_data[..2]), (id, 2, &b"no"[..]));

    let id = resolve(7176);
    a.cm.connect(id, 0, b"").unwrap();
    let u = a.expect(E::Unreachable);
    assert_eq!((u.id, u.status), (id, 1));
    assert!(b.cm.get_event(Duration::ZERO).is_none());
}
