//! The RDMA CM layer (`hca/src/rdma_cm.rs`) between two software HCAs on the in-memory fabric,
//! IPv4 and IPv6: address and route resolution, a wildcard and a specific-address listener, the
//! `cma_hdr` in the REQ's private data, accept with data flowing, reject with private data, a
//! closed port (REJECTED, reason 8), a dead peer (UNREACHABLE, -ETIMEDOUT), disconnect from either
//! side (DISCONNECTED, TIMEWAIT_EXIT), and link-local destinations without a scope id.
//! UD over SIDR (`RDMA_PS_UDP`, Linux `cma.c` `cma_resolve_ib_udp` / `cma_sidr_rep_handler`):
//! resolve + accept + a UD SEND with the QPN and Q_Key `ESTABLISHED` carried, reject (status 2),
//! a closed port (status 1), a dead peer (-ETIMEDOUT), private-data limits.

mod common;

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use common::*;
use hca::cm::CmConfig;
use hca::fabric::Fabric;
use hca::rdma_cm::{
    RdmaCm, RdmaCmError, RdmaCmEvent, RdmaCmEventType as E, RdmaId, UdParam, EADDRNOTAVAIL, EINVAL,
    ETIMEDOUT, RDMA_UDP_QKEY, SIDR_REQ_USER_DATA_LEN,
};
use hca::verbs::connect::{self, ConnectAttr};
use hca::{QpState, QpType, WcStatus};
use roce::cm::port_space;

const PORT: u16 = 7471;

struct World {
    f: Fabric,
    a: Peer,
    b: Peer,
    cms: [RdmaCm; 2],
    events: [Vec<RdmaCmEvent>; 2],
    b_alive: bool,
}

fn config() -> CmConfig {
    CmConfig {
        response_timeout: 14,
        max_cm_retries: 2,
        timewait: Duration::from_millis(50),
        ..CmConfig::default()
    }
}

impl World {
    fn new(ipv6: bool) -> World {
        World::with_opts(&Opts {
            ipv6,
            ..Opts::default()
        })
    }

    fn with_opts(o: &Opts) -> World {
        let o = o.clone();
        let mut f = Fabric::new(o.seed, o.faults);
        let a = side(&mut f, 1, A_IOVA, &o);
        let b = side(&mut f, 2, B_IOVA, &o);
        World {
            f,
            a,
            b,
            cms: [RdmaCm::new(config()), RdmaCm::new(config())],
            events: [Vec::new(), Vec::new()],
            b_alive: true,
        }
    }

    fn pump(&mut self) {
        let now = self.f.now();
        for i in 0..2 {
            if i == 1 && !self.b_alive {
                continue;
            }
            let node = if i == 0 { self.a.node } else { self.b.node };
            for _ in 0..1000 {
                let Some(m) = self.f.node_mut(node).poll_mad() else {
                    break;
                };
                self.cms[i].handle_mad(now, self.f.node_mut(node), &m);
            }
            if self.cms[i].poll_timeout().is_some_and(|t| t <= now) {
                self.cms[i].handle_timeout(now, self.f.node_mut(node));
            }
            while let Some(e) = self.cms[i].poll_event() {
                self.events[i].push(e);
            }
        }
    }

    fn run_until(&mut self, max_ms: usize, mut done: impl FnMut(&World) -> bool) -> bool {
        for _ in 0..max_ms {
            self.pump();
            if done(self) {
                return true;
            }
            self.f.run_for(Duration::from_millis(1));
        }
        self.pump();
        done(self)
    }

    fn find(&self, i: usize, ev: E) -> Option<&RdmaCmEvent> {
        self.events[i].iter().find(|e| e.event == ev)
    }

    /// B listens on `listen`; A resolves B's address and route and connects with `data`.
    fn start(&mut self, listen: Option<SocketAddr>, data: &[u8]) -> RdmaId {
        self.start_ps(port_space::TCP, listen, data)
    }

    /// As [`World::start`] with IDs of port space `ps` (of its default QP type).
    fn start_ps(&mut self, ps: u16, listen: Option<SocketAddr>, data: &[u8]) -> RdmaId {
        let ud = ps == port_space::UDP;
        self.start_qpt(ps, ud, ud, listen, data)
    }

    /// As [`World::start`] with IDs of port space `ps`, the listener's for a UD QP if `ud_l`,
    /// the connecting one's if `ud_a` (`RDMA_PS_IB` takes either, `rdma_create_ep`'s way).
    fn start_qpt(
        &mut self,
        ps: u16,
        ud_l: bool,
        ud_a: bool,
        listen: Option<SocketAddr>,
        data: &[u8],
    ) -> RdmaId {
        if let Some(addr) = listen {
            let l = self.cms[1].create_id_qpt(ps, ud_l).unwrap();
            self.cms[1].listen(l, addr).unwrap();
        }
        let id = self.cms[0].create_id_qpt(ps, ud_a).unwrap();
        let node = self.a.node;
        self.cms[0]
            .resolve_addr(
                self.f.node(node),
                id,
                None,
                SocketAddr::new(self.b.ip, PORT),
            )
            .unwrap();
        self.cms[0].resolve_route(id).unwrap();
        self.pump();
        assert_eq!(self.events[0][0].event, E::AddrResolved);
        assert_eq!(self.events[0][1].event, E::RouteResolved);
        assert_eq!(self.cms[0].remote_gid(id), Some(hca::Gid::from(self.b.ip)));
        let now = self.f.now();
        let qpn = self.a.qpn;
        self.cms[0]
            .connect(now, self.f.node_mut(node), id, qpn, data)
            .unwrap();
        id
    }
}

fn wildcard(ipv6: bool) -> SocketAddr {
    if ipv6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), PORT)
    } else {
        SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), PORT)
    }
}

fn connect_write_disconnect(ipv6: bool, passive_closes: bool) {
    connect_write_disconnect_ps(port_space::TCP, ipv6, passive_closes);
}

fn connect_write_disconnect_ps(ps: u16, ipv6: bool, passive_closes: bool) {
    let mut w = World::new(ipv6);
    let a_id = w.start_ps(ps, Some(wildcard(ipv6)), b"ping");
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    let req = w.find(1, E::ConnectRequest).unwrap().clone();
    assert!(req.listen_id.is_some());
    assert_eq!(w.cms[1].port_space(req.id), Some(ps));
    assert_eq!(
        w.cms[1].cm().listeners(),
        &[roce::cm::service_id(ps, PORT)][..],
        "the listener's service ID, which the IB CM matched the REQ's to, is (ps << 16) | port"
    );
    assert_eq!(&req.private_data[..4], b"ping");
    assert_eq!(
        req.private_data.len(),
        56,
        "92 bytes minus the 36-byte cma_hdr"
    );
    let now = w.f.now();
    let (node, qpn) = (w.b.node, w.b.qpn);
    w.cms[1]
        .accept(now, w.f.node_mut(node), req.id, qpn, b"pong")
        .unwrap();
    assert!(w.run_until(1000, |w| w.find(0, E::Established).is_some()
        && w.find(1, E::Established).is_some()));
    assert_eq!(
        &w.find(0, E::Established).unwrap().private_data[..4],
        b"pong"
    );
    assert_eq!(
        (state(&w.f, &w.a), state(&w.f, &w.b)),
        (QpState::Rts, QpState::Rts)
    );
    w.a.write(0, &[7; 256]);
    common::work_requests::post(
        &mut w.f,
        &w.a,
        common::work_requests::write(&w.a, 1, (0, 256), &w.b, 0),
    );
    let wcs = run_for_completions(&mut w.f, &w.a, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!(w.b.read(0, 256), vec![7; 256]);

    let (closer, id, node) = if passive_closes {
        (1, req.id, w.b.node)
    } else {
        (0, a_id, w.a.node)
    };
    let now = w.f.now();
    w.cms[closer]
        .disconnect(now, w.f.node_mut(node), id)
        .unwrap();
    let done = |w: &World| {
        (0..2).all(|i| w.find(i, E::Disconnected).is_some() && w.find(i, E::TimewaitExit).is_some())
    };
    assert!(w.run_until(2000, done), "{:?}", w.events);
    assert_eq!(
        (state(&w.f, &w.a), state(&w.f, &w.b)),
        (QpState::Err, QpState::Err)
    );
    assert_eq!(
        w.cms[0].cm().connection_count() + w.cms[1].cm().connection_count(),
        0
    );
}

#[test]
fn ipv4_connect_write_active_disconnect() {
    connect_write_disconnect(false, false);
}

#[test]
fn ps_ib_connects_rc_with_its_own_service_id() {
    connect_write_disconnect_ps(port_space::IB, false, true);
    connect_write_disconnect_ps(port_space::IB, true, false);
}

#[test]
fn ipv6_connect_write_passive_disconnect() {
    connect_write_disconnect(true, true);
}

#[test]
fn reject_with_private_data_and_a_closed_port() {
    let mut w = World::new(false);
    w.start(Some(wildcard(false)), b"");
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    let id = w.find(1, E::ConnectRequest).unwrap().id;
    let node = w.b.node;
    w.cms[1].reject(w.f.node_mut(node), id, b"full").unwrap();
    assert!(w.run_until(1000, |w| w.find(0, E::Rejected).is_some()));
    let rej = w.find(0, E::Rejected).unwrap();
    assert_eq!(rej.status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
    assert_eq!(&rej.private_data[..4], b"full");
    assert_eq!(state(&w.f, &w.a), QpState::Err);

    let mut w = World::new(false);
    w.start(None, b"");
    assert!(w.run_until(1000, |w| w.find(0, E::Rejected).is_some()));
    assert_eq!(
        w.find(0, E::Rejected).unwrap().status,
        8,
        "IB_CM_REJ_INVALID_SERVICE_ID"
    );
}

#[test]
fn a_listener_on_another_address_does_not_take_the_request() {
    let mut w = World::new(false);
    // B listens on an address that is not the one A connects to.
    w.start(
        Some(SocketAddr::new("10.9.9.9".parse().unwrap(), PORT)),
        b"",
    );
    assert!(w.run_until(1000, |w| w.find(0, E::Rejected).is_some()));
    assert!(w.find(1, E::ConnectRequest).is_none());
    assert_eq!(w.cms[1].refused(), 1);
    assert_eq!(w.cms[1].cm().connection_count(), 0);
}

#[test]
fn a_listener_bound_with_a_scope_id_takes_the_request() {
    // `rping -s -a fe80::...%br0` binds its listener with the interface's scope id; the REQ's
    // cma_hdr names the destination without one (seen against Linux rxe in the guest matrix:
    // `rping:rdma-cm:ipv6ll:drop-in:ours-server`, REJ 28 before this was matched by IP and port).
    let mut w = World::new(true);
    let IpAddr::V6(b_ip) = w.b.ip else {
        panic!("an IPv6 world")
    };
    let scoped = SocketAddr::V6(SocketAddrV6::new(b_ip, PORT, 0, 7));
    w.start(Some(scoped), b"");
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()
        || w.find(0, E::Rejected).is_some()));
    assert!(w.find(0, E::Rejected).is_none(), "{:?}", w.events);
    assert!(w.find(1, E::ConnectRequest).unwrap().listen_id.is_some());
    assert_eq!(w.cms[1].refused(), 0);
}

#[test]
fn a_dead_peer_is_unreachable() {
    let mut w = World::new(true);
    w.b_alive = false;
    w.start(Some(wildcard(true)), b"");
    // 3 tries of 67 ms each.
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    assert_eq!(w.find(0, E::Unreachable).unwrap().status, ETIMEDOUT);
    assert_eq!(state(&w.f, &w.a), QpState::Err);
}

#[test]
fn address_errors() {
    let mut w = World::new(false);
    let id = w.cms[0].create_id().unwrap();
    let node = w.a.node;
    // Link-local IPv6 without a scope id: -EINVAL; with one it resolves to the device's
    // link-local GID (index 0, from the MAC, as rxe's).
    let ll = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2);
    w.cms[0]
        .resolve_addr(
            w.f.node(node),
            id,
            None,
            SocketAddr::V6(SocketAddrV6::new(ll, PORT, 0, 0)),
        )
        .unwrap();
    w.cms[0]
        .resolve_addr(
            w.f.node(node),
            id,
            None,
            SocketAddr::V6(SocketAddrV6::new(ll, PORT, 0, 3)),
        )
        .unwrap();
    // An IPv4 source that is not ours.
    w.cms[0]
        .resolve_addr(
            w.f.node(node),
            id,
            Some("10.9.9.9".parse().unwrap()),
            SocketAddr::new(w.b.ip, PORT),
        )
        .unwrap();
    w.pump();
    let got: Vec<(E, i32)> = w.events[0].iter().map(|e| (e.event, e.status)).collect();
    assert_eq!(
        got,
        vec![
            (E::AddrError, EINVAL),
            (E::AddrResolved, 0),
            (E::AddrError, EADDRNOTAVAIL)
        ]
    );
    let id = w.cms[0].create_id().unwrap();
    assert!(
        w.cms[0].resolve_route(id).is_err(),
        "no route before an address"
    );
    let now = w.f.now();
    let qpn = w.a.qpn;
    assert!(w.cms[0]
        .connect(now, w.f.node_mut(node), id, qpn, b"")
        .is_err());
    // An IPv4-mapped IPv6 destination resolves as IPv4.
    let mapped = SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0x0a00, 0x0002)),
        PORT,
    );
    w.cms[0]
        .resolve_addr(w.f.node(node), id, None, mapped)
        .unwrap();
    w.pump();
    assert_eq!(w.events[0].last().unwrap().event, E::AddrResolved);
    assert_eq!(w.cms[0].remote_gid(id), Some(hca::Gid::from(w.b.ip)));
    assert!(
        w.cms[0]
            .connect(now, w.f.node_mut(node), id, qpn, &[0; 57])
            .is_err(),
        "57 > 56 bytes"
    );
}

/// Both UD QPs to RTS with Q_Key `RDMA_UDP_QKEY`, as librdmacm's `ucma_init_ud_qp` does.
fn ud_world(ipv6: bool) -> World {
    let mut w = World::with_opts(&Opts {
        qp_type: QpType::Ud,
        ipv6,
        ..Opts::default()
    });
    for p in [(w.a.node, w.a.qpn), (w.b.node, w.b.qpn)] {
        let a = ConnectAttr {
            qp_type: QpType::Ud,
            qkey: RDMA_UDP_QKEY,
            local_psn: 0,
            ..ConnectAttr::default()
        };
        let h = w.f.node_mut(p.0);
        connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
            h.modify_qp(p.1, qp, mask).map(|_| ())
        })
        .unwrap();
    }
    w
}

fn ud_resolve_accept_send(ipv6: bool) {
    ud_resolve_accept_send_ps(port_space::UDP, ipv6);
}

fn ud_resolve_accept_send_ps(ps: u16, ipv6: bool) {
    let mut w = ud_world(ipv6);
    let a_id = w.start_qpt(ps, true, true, Some(wildcard(ipv6)), b"udp?");
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    let req = w.find(1, E::ConnectRequest).unwrap().clone();
    assert_eq!(&req.private_data[..4], b"udp?");
    assert_eq!(
        req.private_data.len(),
        SIDR_REQ_USER_DATA_LEN,
        "216 bytes minus the 36-byte cma_hdr"
    );
    assert_eq!(
        req.ud,
        Some(UdParam::default()),
        "cma.c reports no QPN / Q_Key"
    );
    assert_eq!(w.cms[1].port_space(req.id), Some(ps));
    let (_, remote) = w.cms[1].addresses(req.id).unwrap();
    assert_eq!(remote.map(|r| r.ip()), Some(w.a.ip));
    let now = w.f.now();
    let (node, qpn) = (w.b.node, w.b.qpn);
    w.cms[1]
        .accept(now, w.f.node_mut(node), req.id, qpn, b"udp!")
        .unwrap();
    assert!(w.run_until(1000, |w| w.find(0, E::Established).is_some()));
    let est = w.find(0, E::Established).unwrap().clone();
    assert_eq!(est.id, a_id);
    assert_eq!(
        est.ud,
        Some(UdParam {
            qp_num: w.b.qpn,
            qkey: RDMA_UDP_QKEY
        })
    );
    assert_eq!(&est.private_data[..4], b"udp!");
    assert!(
        w.find(1, E::Established).is_none(),
        "UD: no event on the passive side"
    );
    // A answers to what ESTABLISHED said: one UD SEND lands in B's receive (after the GRH).
    w.b.write(4096, &[0; 64]);
    post_recv(&mut w.f, &w.b, 9, &[w.b.sge(4096, 64 + 40)]);
    w.a.write(0, b"datagram");
    let ah =
        w.f.node_mut(w.a.node)
            .create_ah(
                w.a.pd,
                &hca::AhAttr {
                    dgid: w.cms[0].remote_gid(a_id).unwrap(),
                    sgid_index: 2,
                    hop_limit: 64,
                    ..hca::AhAttr::default()
                },
            )
            .unwrap();
    let op = hca::SendOp::UdSend {
        dest: hca::UdDest {
            ah,
            remote_qpn: est.ud.unwrap().qp_num,
            remote_qkey: est.ud.unwrap().qkey,
        },
        imm_data: None,
    };
    let sg = [w.a.sge(0, 8)];
    post_send(&mut w.f, &w.a, &send_wr(1, &sg, op));
    let wcs = run_for_completions(&mut w.f, &w.b, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), vec![(9, WcStatus::Success)]);
    assert_eq!(w.b.read(4096 + 40, 8), b"datagram");
    assert_eq!(
        w.cms[0].cm().connection_count() + w.cms[1].cm().connection_count(),
        0
    );
}

#[test]
fn ud_ipv4_resolve_accept_send() {
    ud_resolve_accept_send(false);
}

#[test]
fn ud_ipv6_resolve_accept_send() {
    ud_resolve_accept_send(true);
}

#[test]
fn ud_over_ps_ib() {
    ud_resolve_accept_send_ps(port_space::IB, false);
    ud_resolve_accept_send_ps(port_space::IB, true);
}

#[test]
fn port_space_and_qp_type_must_fit() {
    let mut w = World::new(false);
    for (ps, ud) in [(port_space::TCP, true), (port_space::UDP, false)] {
        assert_eq!(
            w.cms[0].create_id_qpt(ps, ud),
            Err(RdmaCmError::BadParam),
            "ps {ps:#x} ud {ud}"
        );
    }
    for ps in [port_space::IPOIB, 0x0107] {
        assert_eq!(w.cms[0].create_id_ps(ps), Err(RdmaCmError::Unsupported));
    }
    // An RC REQ to an RDMA_PS_IB listener made for UD is not taken (cma.c
    // cma_check_req_qp_type): rejected as for an unknown service, and no CONNECT_REQUEST.
    w.start_qpt(port_space::IB, true, false, Some(wildcard(false)), b"");
    assert!(w.run_until(1000, |w| w.find(0, E::Rejected).is_some()));
    assert!(w.find(1, E::ConnectRequest).is_none());
    assert_eq!(w.cms[1].refused(), 1);
    // A SIDR_REQ to an RDMA_PS_IB listener made for RC: refused likewise.
    let mut w = ud_world(false);
    w.start_qpt(port_space::IB, false, true, Some(wildcard(false)), b"");
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    assert!(w.find(1, E::ConnectRequest).is_none());
    // The same port number in another port space is another service: a TCP listener does not
    // take an RDMA_PS_IB REQ (the IB CM answers REJ 8, invalid service ID).
    let mut w = World::new(false);
    let l = w.cms[1].create_id().unwrap();
    w.cms[1].listen(l, wildcard(false)).unwrap();
    w.start_ps(port_space::IB, None, b"");
    assert!(w.run_until(1000, |w| w.find(0, E::Rejected).is_some()));
    assert_eq!(w.find(0, E::Rejected).unwrap().status, 8);
    assert!(w.find(1, E::ConnectRequest).is_none());
}

#[test]
fn ud_reject_closed_port_and_a_tcp_listener() {
    let mut w = ud_world(false);
    w.start_ps(port_space::UDP, Some(wildcard(false)), b"");
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    let id = w.find(1, E::ConnectRequest).unwrap().id;
    let node = w.b.node;
    w.cms[1].reject(w.f.node_mut(node), id, b"full").unwrap();
    assert!(
        w.cms[1].reject(w.f.node_mut(node), id, b"").is_err(),
        "answered once"
    );
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    let u = w.find(0, E::Unreachable).unwrap();
    assert_eq!(u.status, 2, "IB_SIDR_REJECT");
    assert_eq!(&u.private_data[..4], b"full");
    assert!(w.find(0, E::Established).is_none());

    // Nobody listens on the UDP port (a TCP listener on the same number does not count).
    let mut w = ud_world(false);
    let l = w.cms[1].create_id().unwrap();
    w.cms[1].listen(l, wildcard(false)).unwrap();
    w.start_ps(port_space::UDP, None, b"");
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    assert_eq!(
        w.find(0, E::Unreachable).unwrap().status,
        1,
        "IB_SIDR_UNSUPPORTED"
    );
    assert!(w.find(1, E::ConnectRequest).is_none());

    // A UDP listener on another address: the SIDR_REQ is rejected at the RDMA CM layer.
    let mut w = ud_world(false);
    w.start_ps(
        port_space::UDP,
        Some(SocketAddr::new("10.9.9.9".parse().unwrap(), PORT)),
        b"",
    );
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    assert_eq!(w.find(0, E::Unreachable).unwrap().status, 2);
    assert_eq!(w.cms[1].refused(), 1);
}

#[test]
fn ud_dead_peer_is_unreachable() {
    let mut w = ud_world(true);
    w.b_alive = false;
    w.start_ps(port_space::UDP, Some(wildcard(true)), b"");
    // 1 + 2 tries of 67 ms virtual time.
    assert!(w.run_until(1000, |w| w.find(0, E::Unreachable).is_some()));
    assert_eq!(w.find(0, E::Unreachable).unwrap().status, ETIMEDOUT);
    assert_eq!(w.cms[0].cm().counters().retransmits, 2);
}

#[test]
fn ud_limits() {
    let mut w = ud_world(false);
    let id = w.cms[0].create_id_ps(port_space::UDP).unwrap();
    let node = w.a.node;
    w.cms[0]
        .resolve_addr(w.f.node(node), id, None, SocketAddr::new(w.b.ip, PORT))
        .unwrap();
    w.cms[0].resolve_route(id).unwrap();
    let (now, qpn) = (w.f.now(), w.a.qpn);
    assert_eq!(
        w.cms[0].connect(
            now,
            w.f.node_mut(node),
            id,
            qpn,
            &[0; SIDR_REQ_USER_DATA_LEN + 1]
        ),
        Err(RdmaCmError::PrivateDataTooLong)
    );
    w.cms[0]
        .connect(
            now,
            w.f.node_mut(node),
            id,
            qpn,
            &[1; SIDR_REQ_USER_DATA_LEN],
        )
        .unwrap();
    assert_eq!(
        w.cms[0].connect(now, w.f.node_mut(node), id, qpn, b""),
        Err(RdmaCmError::BadState),
        "one SIDR_REQ at a time"
    );
    assert!(
        w.cms[0].disconnect(now, w.f.node_mut(node), id).is_err(),
        "UD IDs have no connection"
    );
}

/// `rdma_conn_param` through the RDMA CM: the caller's depths and counts reach the peer's
/// `CONNECT_REQUEST` and the active side's `ESTABLISHED` (as `cma.c` fills them), the accept's
/// `RDMA_MAX_RD_ATOMIC` takes the request's depths, the path MTU is the port's active MTU (not a
/// fixed 1024), and depths above the device's limit are refused.
#[test]
fn conn_param_in_events_and_on_the_qps() {
    use hca::rdma_cm::{ConnParam, RDMA_MAX_RD_ATOMIC};
    let mut w = World::new(false);
    let l = w.cms[1].create_id().unwrap();
    w.cms[1].listen(l, wildcard(false)).unwrap();
    let id = w.cms[0].create_id().unwrap();
    let node = w.a.node;
    w.cms[0]
        .resolve_addr(w.f.node(node), id, None, SocketAddr::new(w.b.ip, PORT))
        .unwrap();
    w.cms[0].resolve_route(id).unwrap();
    let (now, qpn) = (w.f.now(), w.a.qpn);
    let max = w.f.node(node).context().query_device().max_qp_rd_atom;
    let too_deep = ConnParam {
        responder_resources: (max + 1) as u8,
        ..ConnParam::default()
    };
    assert_eq!(
        w.cms[0].connect_with(now, w.f.node_mut(node), id, qpn, b"", &too_deep),
        Err(RdmaCmError::BadParam)
    );
    let asked = ConnParam {
        responder_resources: 2,
        initiator_depth: 7,
        retry_count: 5,
        rnr_retry_count: 3,
        ..ConnParam::default()
    };
    w.cms[0]
        .connect_with(now, w.f.node_mut(node), id, qpn, b"cp", &asked)
        .unwrap();
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    let req = w.find(1, E::ConnectRequest).unwrap().clone();
    let got = req.conn.unwrap();
    assert_eq!(
        (
            got.responder_resources,
            got.initiator_depth,
            got.retry_count,
            got.rnr_retry_count,
            got.qp_num
        ),
        (7, 2, 5, 3, w.a.qpn),
        "the REQ seen from B: A's initiator depth is what B serves"
    );
    let (bnode, bqpn) = (w.b.node, w.b.qpn);
    let all = ConnParam {
        responder_resources: RDMA_MAX_RD_ATOMIC,
        initiator_depth: RDMA_MAX_RD_ATOMIC,
        rnr_retry_count: 6,
        ..ConnParam::default()
    };
    let now = w.f.now();
    w.cms[1]
        .accept_with(now, w.f.node_mut(bnode), req.id, bqpn, b"", &all)
        .unwrap();
    assert!(w.run_until(1000, |w| w.find(0, E::Established).is_some()
        && w.find(1, E::Established).is_some()));
    let est = w.find(0, E::Established).unwrap().conn.unwrap();
    assert_eq!(
        (
            est.responder_resources,
            est.initiator_depth,
            est.rnr_retry_count,
            est.qp_num
        ),
        (2, 7, 6, w.b.qpn)
    );
    assert_eq!(w.find(1, E::Established).unwrap().conn, None);
    let attr = |n, q| *w.f.node(n).context().qp(q).unwrap().attr();
    let (a, b) = (attr(node, qpn), attr(bnode, bqpn));
    assert_eq!(
        (
            a.max_dest_rd_atomic,
            a.max_rd_atomic,
            a.retry_cnt,
            a.rnr_retry
        ),
        (2, 7, 5, 6)
    );
    assert_eq!(
        (
            b.max_dest_rd_atomic,
            b.max_rd_atomic,
            b.retry_cnt,
            b.rnr_retry
        ),
        (7, 2, 5, 3)
    );
    let port_mtu = w.f.node(node).context().query_port(1).unwrap().active_mtu;
    assert_ne!(
        port_mtu,
        hca::PathMtu::Mtu1024,
        "the fabric's 9000-byte links"
    );
    assert_eq!((a.path_mtu, b.path_mtu), (port_mtu, port_mtu));
}

/// A SIDR_REQ for a listened-on UDP port whose private data is no `cma_hdr` (sent by a bare IB
/// CM, not the RDMA CM) is refused at the RDMA CM layer (SIDR_REP `Reject`, counted), never
/// reported.
#[test]
fn ud_sidr_req_without_a_cma_hdr_is_refused() {
    let mut w = ud_world(false);
    let l = w.cms[1].create_id_ps(port_space::UDP).unwrap();
    w.cms[1].listen(l, wildcard(false)).unwrap();
    let mut raw = hca::cm::Cm::new(config());
    let (node, a_ip, b_ip) = (w.a.node, w.a.ip, w.b.ip);
    let now = w.f.now();
    raw.sidr_resolve(
        now,
        w.f.node_mut(node),
        a_ip,
        b_ip,
        roce::cm::service_id(port_space::UDP, PORT),
        &[0xee; 40],
    )
    .unwrap();
    assert!(w.run_until(1000, |w| w.cms[1].refused() == 1));
    w.run_until(50, |_| false);
    assert!(w.find(1, E::ConnectRequest).is_none());
    assert!(
        w.cms[0].cm().counters().unmatched >= 1,
        "the SIDR_REP went to A's RDMA CM, which sent no SIDR_REQ"
    );
}

/// Hostile SIDR_REQs from a bare IB CM, each with a well-formed `cma_hdr`: one for an
/// `RDMA_PS_TCP` service ID (a TCP listener on the port is an RC listener: refused at the RDMA
/// CM layer, as `cma_check_req_qp_type`), and ones whose service ID has bits set above the
/// port space (`0x0000_0000_pppp_xxxx` is the RDMA CM's whole range, IBTA vol. 1 A3.2.3: the IB
/// CM serves no such ID and answers unsupported). None is reported as a `CONNECT_REQUEST`.
#[test]
fn sidr_reqs_for_other_services_are_refused() {
    let mut w = ud_world(false);
    let tcp = w.cms[1].create_id().unwrap();
    w.cms[1].listen(tcp, wildcard(false)).unwrap();
    let udp = w.cms[1].create_id_ps(port_space::UDP).unwrap();
    w.cms[1].listen(udp, wildcard(false)).unwrap();
    let (node, a_ip, b_ip) = (w.a.node, w.a.ip, w.b.ip);
    let mut hdr = [0u8; roce::cm::CmaHdr::LEN];
    roce::cm::CmaHdr {
        src_port: 4242,
        src_addr: a_ip,
        dst_addr: b_ip,
    }
    .emit(&mut hdr)
    .unwrap();
    let mut raw = hca::cm::Cm::new(config());
    let udp_sid = roce::cm::service_id(port_space::UDP, PORT);
    let sids = [
        roce::cm::service_id(port_space::TCP, PORT),
        udp_sid | 1 << 32,
        udp_sid | 1 << 63,
        udp_sid | 0xffff_0000_0000,
    ];
    for sid in sids {
        let now = w.f.now();
        raw.sidr_resolve(now, w.f.node_mut(node), a_ip, b_ip, sid, &hdr)
            .unwrap();
    }
    // The TCP service's SIDR_REQ reaches the RDMA CM, which refuses it; the others stop at
    // the IB CM (no listener for their service IDs).
    assert!(w.run_until(1000, |w| w.cms[1].refused() == 1));
    w.run_until(50, |_| false);
    assert_eq!(w.cms[1].refused(), 1);
    assert!(w.find(1, E::ConnectRequest).is_none());
    // The UDP listener still takes a proper SIDR_REQ.
    let now = w.f.now();
    raw.sidr_resolve(now, w.f.node_mut(node), a_ip, b_ip, udp_sid, &hdr)
        .unwrap();
    assert!(w.run_until(1000, |w| w.find(1, E::ConnectRequest).is_some()));
    assert_eq!(w.find(1, E::ConnectRequest).unwrap().listen_id, Some(udp));
}
