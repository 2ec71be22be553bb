//! The CM state machine (`hca/src/cm.rs`) between two software HCAs on the in-memory fabric, on
//! a virtual clock, with faults: connect / accept / disconnect with QP transitions and data, lost
//! REQ / REP / RTU / DREQ (retries), a duplicated REQ (reported once), a peer that never answers
//! (bounded, then UNREACHABLE and ERR), REJ for an unknown service, a consumer reject with private
//! data, a REQ flood that cannot grow the passive side's state past its bound, a REP for no REQ,
//! malformed and unsupported MADs, and SIDR (UD service resolution) with loss, duplicates and a
//! dead peer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hca::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmEventKind, CommId, ConnParam, ConnectParams};
use hca::fabric::{Fabric, Tap, WirePacket};
use hca::{AccessFlags, Instant, QpState, WcStatus};
use roce::cm::{port_space, service_id, AttrId, RejReason};
use roce::mad;

const QUANTUM: Duration = Duration::from_millis(1);

fn config() -> CmConfig {
    CmConfig {
        response_timeout: 14, // 67 ms
        max_cm_retries: 3,
        max_connections: 64,
        max_per_remote: 8,
        timewait: Duration::from_millis(100),
        local_ack_timeout: hca::cm::ACK_TIMEOUT,
    }
}

fn sid() -> u64 {
    service_id(port_space::TCP, 18515)
}

struct World {
    f: Fabric,
    a: Peer,
    b: Peer,
    cms: [Cm; 2],
    events: [Vec<CmEvent>; 2],
    /// Whether B's CM reads its QP1 (false: a peer that never answers).
    b_alive: bool,
}

impl World {
    fn new() -> World {
        let o = Opts::default();
        let mut f = Fabric::new(o.seed, o.faults);
        let a = side(&mut f, 1, A_IOVA, &o);
        let b = side(&mut f, 2, B_IOVA, &o);
        World {
            f,
            a,
            b,
            cms: [Cm::new(config()), Cm::new(config())],
            events: [Vec::new(), Vec::new()],
            b_alive: true,
        }
    }

    fn peer(&self, i: usize) -> &Peer {
        if i == 0 {
            &self.a
        } else {
            &self.b
        }
    }

    /// Feeds each CM its QP1 MADs and due timers, and collects events.
    fn pump(&mut self) {
        let now = self.f.now();
        for i in 0..2 {
            if i == 1 && !self.b_alive {
                continue;
            }
            let node = self.peer(i).node;
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

    /// Runs (in 1 ms quanta of virtual time, at most `max`) until `done` holds.
    fn run_until(&mut self, max: Duration, mut done: impl FnMut(&World) -> bool) -> bool {
        let steps = max.as_millis() as usize;
        for _ in 0..steps {
            self.pump();
            if done(self) {
                return true;
            }
            self.f.run_for(QUANTUM);
        }
        self.pump();
        done(self)
    }

    fn has(&self, i: usize, pred: impl Fn(&CmEvent) -> bool) -> bool {
        self.events[i].iter().any(pred)
    }

    fn connect(&mut self, private_data: &[u8]) -> CommId {
        self.connect_qp(private_data, false)
    }

    fn connect_qp(&mut self, private_data: &[u8], external_qp: bool) -> CommId {
        let now = self.f.now();
        let p = ConnectParams {
            qpn: self.a.qpn,
            local_ip: self.a.ip,
            remote_ip: self.b.ip,
            service_id: sid(),
            path_mtu: hca::PathMtu::Mtu1024,
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            responder_resources: 3,
            initiator_depth: 5,
            retry_count: 6,
            rnr_retry_count: 5,
            flow_control: true,
            srq: false,
            private_data,
            external_qp,
        };
        let node = self.a.node;
        self.cms[0].connect(now, self.f.node_mut(node), &p).unwrap()
    }

    /// B accepts the first connection request it got.
    fn accept_first(&mut self) -> CommId {
        self.accept_first_qp(false)
    }

    fn accept_first_qp(&mut self, external_qp: bool) -> CommId {
        let id = self.events[1]
            .iter()
            .find(|e| matches!(e.kind, CmEventKind::ConnectRequest { .. }))
            .expect("a connection request")
            .id;
        let now = self.f.now();
        let node = self.b.node;
        let p = AcceptParams {
            qpn: self.b.qpn,
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            responder_resources: 6,
            initiator_depth: 8,
            rnr_retry_count: 4,
            flow_control: false,
            srq: true,
            private_data: b"welcome",
            external_qp,
        };
        self.cms[1]
            .accept(now, self.f.node_mut(node), id, &p)
            .unwrap();
        id
    }

    fn established(&self, i: usize) -> bool {
        self.has(i, |e| matches!(e.kind, CmEventKind::Established { .. }))
    }
}

fn is_req(e: &CmEvent) -> bool {
    matches!(e.kind, CmEventKind::ConnectRequest { .. })
}

/// Drops the first `count` MADs of attribute `attr` on the wire.
struct DropFirst {
    attr: AttrId,
    count: Arc<Mutex<u32>>,
}

impl Tap for DropFirst {
    fn on_packet(&mut self, _now: Instant, packet: &mut WirePacket) -> bool {
        let Ok(p) = roce::packet::parse_udp_payload(&packet.data) else {
            return true;
        };
        let is_attr = p.transport.bth.dest_qpn == 1
            && mad::Repr::parse_mad(p.payload).is_ok_and(|h| AttrId::from(h.attr_id) == self.attr);
        let mut left = self.count.lock().unwrap();
        if is_attr && *left > 0 {
            *left -= 1;
            return false;
        }
        true
    }
}

fn drop_first(w: &mut World, attr: AttrId, n: u32) -> Arc<Mutex<u32>> {
    let count = Arc::new(Mutex::new(n));
    w.f.set_tap(Some(Box::new(DropFirst {
        attr,
        count: count.clone(),
    })));
    count
}

/// Connects A to B (B listening, accepting), checks both QPs in RTS and an RDMA WRITE through.
fn connect_and_check(w: &mut World) -> (CommId, CommId) {
    w.cms[1].listen(sid()).unwrap();
    let a_id = w.connect(b"hello");
    assert!(
        w.run_until(Duration::from_secs(2), |w| w.has(1, is_req)),
        "{:?}",
        w.events
    );
    let req = w.events[1].iter().find(|e| is_req(e)).unwrap().clone();
    let CmEventKind::ConnectRequest {
        service_id: s,
        remote_ip,
        remote_qpn,
        private_data,
        ..
    } = req.kind
    else {
        unreachable!()
    };
    assert_eq!((s, remote_ip, remote_qpn), (sid(), w.a.ip, w.a.qpn));
    assert_eq!(&private_data[..5], b"hello");
    let b_id = w.accept_first();
    assert!(
        w.run_until(Duration::from_secs(2), |w| w.established(0)
            && w.established(1)),
        "{:?}",
        w.events
    );
    assert_eq!(state(&w.f, &w.a), QpState::Rts);
    assert_eq!(state(&w.f, &w.b), QpState::Rts);
    // Both QPs got Linux's RC ACK timeout over RoCE (cm.c: packet_life_time + 1 = 17), not the
    // verbs default of 14 (67 ms a try: a loaded peer that answered within 0.5 s was given up).
    for p in [&w.a, &w.b] {
        let qp = w.f.node(p.node).context().qp(p.qpn).unwrap();
        assert_eq!(qp.attr().timeout, hca::cm::ACK_TIMEOUT);
    }
    let rep_data = w.events[0]
        .iter()
        .find_map(|e| match &e.kind {
            CmEventKind::Established { private_data, .. } => Some(private_data.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(&rep_data[..7], b"welcome");
    // The QPs are connected to each other with matching PSNs: a WRITE completes.
    w.f.set_tap(None);
    w.a.write(0, &[0x5a; 512]);
    common::work_requests::post(
        &mut w.f,
        &w.a,
        common::work_requests::write(&w.a, 9, (0, 512), &w.b, 64),
    );
    let wcs = run_for_completions(&mut w.f, &w.a, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), vec![(9, WcStatus::Success)]);
    assert_eq!(w.b.read(64, 512), vec![0x5a; 512]);
    (a_id, b_id)
}

fn disconnect_and_check(w: &mut World, a_id: CommId, b_id: CommId) {
    let now = w.f.now();
    let node = w.a.node;
    w.cms[0].disconnect(now, w.f.node_mut(node), a_id).unwrap();
    let done = |w: &World| {
        [0, 1].iter().all(|&i| {
            let id = [a_id, b_id][i];
            w.has(i, |e| e.id == id && e.kind == CmEventKind::Disconnected)
                && w.has(i, |e| e.id == id && e.kind == CmEventKind::TimewaitExit)
        })
    };
    assert!(w.run_until(Duration::from_secs(3), done), "{:?}", w.events);
    assert_eq!(state(&w.f, &w.a), QpState::Err);
    assert_eq!(state(&w.f, &w.b), QpState::Err);
    assert_eq!(w.cms[0].connection_count(), 0);
    assert_eq!(w.cms[1].connection_count(), 0);
}

#[test]
fn connect_accept_write_disconnect() {
    let mut w = World::new();
    let (a, b) = connect_and_check(&mut w);
    assert_eq!(w.cms[0].counters().retransmits, 0);
    disconnect_and_check(&mut w, a, b);
    assert_eq!(
        w.cms[0].counters().retransmits + w.cms[1].counters().retransmits,
        0
    );
}

/// Moves `p`'s QP to `to` with `attr` and `mask` (the consumer's own ibv_modify_qp).
fn modify(w: &mut World, p: Peer2, to: QpState, cm: usize, id: CommId) {
    let node = w.peer(p as usize).node;
    let qpn = w.peer(p as usize).qpn;
    let (attr, mask) = if to == QpState::Init {
        hca::verbs::connect::step(
            &hca::verbs::connect::ConnectAttr {
                access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
                ..Default::default()
            },
            QpState::Init,
        )
        .unwrap()
    } else {
        w.cms[cm].init_qp_attr(w.f.node(node), id, to).unwrap()
    };
    w.f.node_mut(node).modify_qp(qpn, &attr, mask).unwrap();
}

#[derive(Clone, Copy)]
enum Peer2 {
    A = 0,
    B = 1,
}

/// librdmacm's external QP (an ID without `id->qp`): the CM never moves the QP; the passive side
/// brings it to RTS with `init_qp_attr` before accepting, the active side gets
/// `ConnectResponse` for the REP, brings its QP up the same way and sends the RTU with
/// `establish`; the PSNs, QPNs and depths the CM hands out connect the two QPs.
#[test]
fn an_external_qp_is_moved_by_the_consumer_with_init_qp_attr() {
    let mut w = World::new();
    w.cms[1].listen(sid()).unwrap();
    let a_id = w.connect_qp(b"hello", true);
    assert_eq!(
        state(&w.f, &w.a),
        QpState::Reset,
        "the CM left A's QP alone"
    );
    assert!(w.run_until(Duration::from_secs(2), |w| w.has(1, is_req)));
    let b_id = w.events[1].iter().find(|e| is_req(e)).unwrap().id;
    // Before the REP, the active side has no RTR attributes (Linux: EINVAL).
    let a_node = w.a.node;
    assert_eq!(
        w.cms[0].init_qp_attr(w.f.node(a_node), a_id, QpState::Rtr),
        Err(hca::cm::CmError::BadState)
    );
    // Nor an RTU to send (rdma_establish before CONNECT_RESPONSE), and the passive side never
    // sends one.
    assert_eq!(
        w.cms[0].establish(w.f.node_mut(a_node), a_id),
        Err(hca::cm::CmError::BadState)
    );
    let b_node = w.b.node;
    assert_eq!(
        w.cms[1].establish(w.f.node_mut(b_node), b_id),
        Err(hca::cm::CmError::BadState)
    );
    for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
        modify(&mut w, Peer2::B, to, 1, b_id);
    }
    w.accept_first_qp(true);
    assert!(
        w.run_until(Duration::from_secs(2), |w| w
            .has(0, |e| matches!(e.kind, CmEventKind::ConnectResponse { .. }))),
        "{:?}",
        w.events
    );
    let CmEventKind::ConnectResponse {
        private_data,
        param,
    } = w.events[0]
        .iter()
        .find(|e| matches!(e.kind, CmEventKind::ConnectResponse { .. }))
        .unwrap()
        .kind
        .clone()
    else {
        unreachable!()
    };
    assert_eq!(&private_data[..7], b"welcome");
    assert_eq!(param.qp_num, w.b.qpn);
    assert_eq!(
        w.cms[1].establish(w.f.node_mut(b_node), b_id),
        Err(hca::cm::CmError::BadState),
        "the passive side, after its REP"
    );
    // No RTU yet: neither side is established, A's QP is still untouched.
    w.run_until(Duration::from_millis(50), |_| false);
    assert!(!w.established(0) && !w.established(1), "{:?}", w.events);
    assert_eq!(state(&w.f, &w.a), QpState::Reset);
    for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
        modify(&mut w, Peer2::A, to, 0, a_id);
    }
    let qa = w.f.node(w.a.node).context().qp(w.a.qpn).unwrap().attr();
    let qb = w.f.node(w.b.node).context().qp(w.b.qpn).unwrap().attr();
    assert_eq!((qa.dest_qp_num, qb.dest_qp_num), (w.b.qpn, w.a.qpn));
    assert_eq!((qa.sq_psn, qa.rq_psn), (qb.rq_psn, qb.sq_psn));
    // The depths as the REQ and REP negotiated them (A asked 3 / 5, B answered 6 / 8).
    assert_eq!((qa.max_dest_rd_atomic, qa.max_rd_atomic), (3, 5));
    assert_eq!(qb.max_dest_rd_atomic, 5);
    w.cms[0].establish(w.f.node_mut(a_node), a_id).unwrap();
    assert_eq!(
        w.cms[0].establish(w.f.node_mut(a_node), a_id),
        Err(hca::cm::CmError::BadState),
        "one RTU"
    );
    assert!(
        w.run_until(Duration::from_secs(2), |w| w.established(1)),
        "{:?}",
        w.events
    );
    assert!(
        !w.established(0),
        "rdma_establish reports nothing on the active side"
    );
    assert_eq!(state(&w.f, &w.b), QpState::Rts);
    w.f.set_tap(None);
    w.a.write(0, &[0xa5; 256]);
    common::work_requests::post(
        &mut w.f,
        &w.a,
        common::work_requests::write(&w.a, 4, (0, 256), &w.b, 128),
    );
    let wcs = run_for_completions(&mut w.f, &w.a, 1, Duration::from_secs(1));
    assert_eq!(statuses(&wcs), vec![(4, WcStatus::Success)]);
    assert_eq!(w.b.read(128, 256), vec![0xa5; 256]);
    // A disconnect closes the connection; the QPs stay the consumer's (no move to ERR).
    let now = w.f.now();
    w.cms[0]
        .disconnect(now, w.f.node_mut(a_node), a_id)
        .unwrap();
    assert!(
        w.run_until(Duration::from_secs(2), |w| w
            .has(1, |e| e.id == b_id && e.kind == CmEventKind::Disconnected)),
        "{:?}",
        w.events
    );
    assert_eq!(state(&w.f, &w.a), QpState::Rts);
    assert_eq!(state(&w.f, &w.b), QpState::Rts);
}

#[test]
fn lost_req_rep_rtu_dreq_are_retried() {
    for attr in [AttrId::Req, AttrId::Rep, AttrId::Rtu, AttrId::Dreq] {
        let mut w = World::new();
        let mut left = drop_first(&mut w, attr, 1);
        let (a, b) = connect_and_check(&mut w);
        if attr == AttrId::Dreq {
            // connect_and_check removed the tap for its data check.
            left = drop_first(&mut w, attr, 1);
        }
        disconnect_and_check(&mut w, a, b);
        assert_eq!(*left.lock().unwrap(), 0, "{attr:?} was dropped");
        let retransmits = w.cms[0].counters().retransmits + w.cms[1].counters().retransmits;
        assert!(retransmits >= 1, "{attr:?}: nothing was resent");
        assert_eq!(
            w.events[1].iter().filter(|e| is_req(e)).count(),
            1,
            "{attr:?}"
        );
    }
}

#[test]
fn a_duplicated_req_is_reported_once() {
    let mut w = World::new();
    w.cms[1].listen(sid()).unwrap();
    w.connect(b"dup");
    let now = w.f.now();
    let pkts = transmit(&mut w.f, &w.a, now);
    assert_eq!(pkts.len(), 1, "one REQ");
    let now = w.f.now();
    deliver(&mut w.f, &w.b, &pkts[0], now);
    deliver(&mut w.f, &w.b, &pkts[0], now);
    w.pump();
    assert_eq!(w.events[1].iter().filter(|e| is_req(e)).count(), 1);
    assert_eq!(w.cms[1].counters().duplicate_req, 1);
    assert_eq!(w.cms[1].connection_count(), 1);
    w.accept_first();
    assert!(w.run_until(Duration::from_secs(2), |w| w.established(0)
        && w.established(1)));
    // A late copy of the REQ after the connection is up changes nothing.
    let now = w.f.now();
    deliver(&mut w.f, &w.b, &pkts[0], now);
    w.pump();
    assert_eq!(w.events[1].iter().filter(|e| is_req(e)).count(), 1);
    assert_eq!(w.cms[1].counters().duplicate_req, 2);
    assert_eq!(state(&w.f, &w.b), QpState::Rts);
}

#[test]
fn a_peer_that_never_answers_is_unreachable_in_bounded_time() {
    let mut w = World::new();
    w.b_alive = false;
    let start = w.f.now();
    let id = w.connect(b"anyone?");
    let unreachable = |w: &World| w.has(0, |e| e.id == id && e.kind == CmEventKind::Unreachable);
    assert!(
        w.run_until(Duration::from_secs(2), unreachable),
        "{:?}",
        w.events
    );
    // 1 + max_cm_retries REQs, one response timeout (67 ms) apart; each timer is seen up to one
    // 1 ms quantum late (virtual time).
    let waited = w.f.now().saturating_duration_since(start);
    let per_try = hca::cm::timeout_of(config().response_timeout);
    assert!(
        waited >= per_try * 4 && waited <= per_try * 4 + QUANTUM * 5,
        "{waited:?}"
    );
    assert_eq!(w.cms[0].counters().retransmits, 3);
    assert_eq!(state(&w.f, &w.a), QpState::Err);
    assert_eq!(w.cms[0].connection_count(), 0);
    assert_eq!(w.cms[0].poll_timeout(), None);
}

#[test]
fn rej_for_an_unknown_service_and_a_consumer_reject() {
    let mut w = World::new();
    let id = w.connect(b"");
    let rejected = |w: &World| w.has(0, |e| matches!(e.kind, CmEventKind::Rejected { .. }));
    assert!(w.run_until(Duration::from_secs(1), rejected));
    let CmEventKind::Rejected { reason, .. } = &w.events[0].last().unwrap().kind else {
        unreachable!()
    };
    assert_eq!(*reason, RejReason::InvalidServiceId);
    assert_eq!(w.events[0].last().unwrap().id, id);
    assert_eq!(state(&w.f, &w.a), QpState::Err);
    assert_eq!(w.cms[1].connection_count(), 0);

    let mut w = World::new();
    w.cms[1].listen(sid()).unwrap();
    w.connect(b"let me in");
    assert!(w.run_until(Duration::from_secs(1), |w| w.has(1, is_req)));
    let req_id = w.events[1][0].id;
    let node = w.b.node;
    w.cms[1]
        .reject(w.f.node_mut(node), req_id, b"go away")
        .unwrap();
    assert!(w.run_until(Duration::from_secs(1), rejected));
    let CmEventKind::Rejected {
        reason,
        private_data,
    } = &w.events[0].last().unwrap().kind
    else {
        unreachable!()
    };
    assert_eq!(*reason, RejReason::ConsumerDefined);
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(w.cms[1].connection_count(), 0);
    assert_eq!(state(&w.f, &w.a), QpState::Err);
}

/// After a REJ, the active side of an external-QP connection has no RTU to send and no RTR /
/// RTS attributes (rdma_establish / rdma_init_qp_attr: EINVAL), and its QP, which the CM never
/// owned, is left as the consumer put it.
#[test]
fn after_a_rej_an_external_qp_connection_has_nothing_to_establish() {
    let mut w = World::new();
    let id = w.connect_qp(b"", true);
    let rejected = |w: &World| w.has(0, |e| matches!(e.kind, CmEventKind::Rejected { .. }));
    assert!(w.run_until(Duration::from_secs(1), rejected));
    let node = w.a.node;
    assert_eq!(
        w.cms[0].establish(w.f.node_mut(node), id),
        Err(hca::cm::CmError::BadState)
    );
    for to in [QpState::Rtr, QpState::Rts] {
        assert_eq!(
            w.cms[0].init_qp_attr(w.f.node(node), id, to),
            Err(hca::cm::CmError::BadState)
        );
    }
    assert_eq!(state(&w.f, &w.a), QpState::Reset);
    assert_eq!(w.cms[0].connection_count(), 0);
}

#[test]
fn a_req_flood_is_bounded_per_remote() {
    let mut w = World::new();
    w.cms[1].listen(sid()).unwrap();
    // A's CM allows more than B does per remote; B never answers the requests.
    w.cms[0] = Cm::new(CmConfig {
        max_per_remote: 40,
        ..config()
    });
    for _ in 0..40 {
        w.connect(b"");
    }
    let all_answered = |w: &World| {
        w.events[1].len() == 8
            && w.events[0]
                .iter()
                .filter(|e| {
                    matches!(
                        e.kind,
                        CmEventKind::Rejected {
                            reason: RejReason::NoResources,
                            ..
                        }
                    )
                })
                .count()
                == 32
    };
    assert!(
        w.run_until(Duration::from_secs(1), all_answered),
        "{:?}",
        w.events
    );
    assert_eq!(w.cms[1].connection_count(), 8);
    assert_eq!(w.cms[1].counters().refused_resources, 32);
}

#[test]
fn a_rep_for_no_req_and_malformed_or_unsupported_mads() {
    let mut w = World::new();
    // A forged REP for a REQ B never sent: B answers REJ InvalidCommId (Linux cm_rep_handler).
    let mut buf = [0u8; mad::MAD_LEN];
    roce::cm::Message::Rep(roce::cm::Rep {
        local_comm_id: 0x1234,
        remote_comm_id: 0x5678,
        local_qkey: 0,
        local_qpn: 0x99,
        local_eecn: 0,
        starting_psn: 1,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0,
        private_data: [0; roce::cm::REP_PRIVATE_DATA_LEN],
    })
    .emit_mad(77, &mut buf)
    .unwrap();
    let (a_ip, b_ip, a_node) = (w.a.ip, w.b.ip, w.a.node);
    w.f.node_mut(a_node).gsi_send(a_ip, b_ip, 1, &buf).unwrap();
    // A REJ with a Rejected Info Length above 72: malformed.
    let mut bad = [0u8; mad::MAD_LEN];
    roce::cm::Message::Rtu(roce::cm::Rtu {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: [0; roce::cm::RTU_PRIVATE_DATA_LEN],
    })
    .emit_mad(78, &mut bad)
    .unwrap();
    bad[17] = 0x12; // attribute REJ
    bad[mad::HEADER_LEN + 9] = 73 << 1;
    w.f.node_mut(a_node).gsi_send(a_ip, b_ip, 1, &bad).unwrap();
    // A LAP: refused as unsupported.
    let mut lap = bad;
    lap[17] = 0x19;
    w.f.node_mut(a_node).gsi_send(a_ip, b_ip, 1, &lap).unwrap();
    // Only A's CM sees the REJ that comes back; it matches none of A's connections.
    assert!(
        w.run_until(Duration::from_secs(1), |w| w.cms[0].counters().unmatched
            == 1)
    );
    let c = w.cms[1].counters();
    assert_eq!((c.unmatched, c.malformed, c.unsupported), (1, 1, 1));
    assert_eq!(w.cms[1].connection_count(), 0);
    assert!(w.events.iter().all(Vec::is_empty), "{:?}", w.events);
}

fn sidr_resolve(w: &mut World, sid: u64) -> u32 {
    let (now, a_ip, b_ip, node) = (w.f.now(), w.a.ip, w.b.ip, w.a.node);
    w.cms[0]
        .sidr_resolve(now, w.f.node_mut(node), a_ip, b_ip, sid, b"which qp?")
        .unwrap()
}

#[test]
fn sidr_resolves_a_ud_service_with_a_lost_req_and_a_duplicate() {
    let mut w = World::new();
    let ud = service_id(port_space::UDP, 7174);
    w.cms[1].listen(ud).unwrap();
    let left = drop_first(&mut w, AttrId::SidrReq, 1);
    let id = sidr_resolve(&mut w, ud);
    assert!(w.run_until(Duration::from_secs(1), |w| !w.events[1].is_empty()));
    assert_eq!(*left.lock().unwrap(), 0, "the first SIDR_REQ was lost");
    let req = w.events[1][0].clone();
    let CmEventKind::SidrRequest {
        service_id: s,
        remote_ip,
        private_data,
        ..
    } = &req.kind
    else {
        panic!("{req:?}")
    };
    assert_eq!((*s, *remote_ip), (ud, w.a.ip));
    assert_eq!(&private_data[..9], b"which qp?");
    // A's next resend arrives while the request waits for the consumer: not reported again.
    assert!(w.run_until(Duration::from_secs(1), |w| w.cms[1]
        .counters()
        .duplicate_req
        >= 1));
    assert_eq!(w.events[1].len(), 1);
    let node = w.b.node;
    w.cms[1]
        .sidr_answer(
            w.f.node_mut(node),
            req.id,
            Some((0x4242, 0x1111_2222)),
            b"here",
        )
        .unwrap();
    let resolved = |w: &World| {
        w.has(0, |e| {
            e.id == id && matches!(e.kind, CmEventKind::SidrResolved { .. })
        })
    };
    assert!(
        w.run_until(Duration::from_secs(1), resolved),
        "{:?}",
        w.events
    );
    let CmEventKind::SidrResolved {
        status,
        qpn,
        qkey,
        private_data,
    } = &w.events[0].last().unwrap().kind
    else {
        unreachable!()
    };
    assert_eq!(
        (*status, *qpn, *qkey),
        (roce::cm::SidrStatus::Success, 0x4242, 0x1111_2222)
    );
    assert_eq!(&private_data[..4], b"here");
    assert_eq!(w.cms[0].poll_timeout(), None, "nothing outstanding");
    assert!(w.cms[1]
        .sidr_answer(w.f.node_mut(node), req.id, None, b"")
        .is_err());
}

#[test]
fn sidr_for_an_unknown_service_and_a_dead_peer() {
    let mut w = World::new();
    let id = sidr_resolve(&mut w, service_id(port_space::UDP, 1));
    assert!(w.run_until(Duration::from_secs(1), |w| !w.events[0].is_empty()));
    assert!(matches!(
        w.events[0][0].kind,
        CmEventKind::SidrResolved {
            status: roce::cm::SidrStatus::Unsupported,
            ..
        }
    ));
    assert_eq!(w.events[0][0].id, id);

    let mut w = World::new();
    w.b_alive = false;
    let id = sidr_resolve(&mut w, service_id(port_space::UDP, 1));
    let gone = |w: &World| w.has(0, |e| e.id == id && e.kind == CmEventKind::Unreachable);
    assert!(w.run_until(Duration::from_secs(2), gone));
    assert_eq!(w.cms[0].counters().retransmits, 3);
    assert_eq!(w.cms[0].poll_timeout(), None);
}

/// The caller's RDMA READ / atomic depths, retry and RNR retry counts travel in the REQ / REP,
/// reach the peer's event from its own view (Linux `cm.c` `cm_format_req_event` /
/// `cm_format_rep_event` swap responder resources and initiator depth) and the QPs; the passive
/// side's ACK timeout is the REQ's local ACK timeout (`cm_format_paths_from_req` +
/// `cm_init_av_by_path`), the active side's `cm_ack_timeout` of it and the REP's ACK delay.
#[test]
fn conn_params_and_the_reqs_ack_timeout_reach_events_and_qps() {
    let mut w = World::new();
    // A states local ACK timeout 12 (16.8 ms) in its REQ.
    w.cms[0] = Cm::new(CmConfig {
        local_ack_timeout: 12,
        ..config()
    });
    w.cms[1].listen(sid()).unwrap();
    // A: responder resources 3, initiator depth 5, retry 6, RNR retry 5 (World::connect).
    w.connect(b"params");
    assert!(w.run_until(Duration::from_secs(2), |w| w.has(1, is_req)));
    let req = w.events[1].iter().find(|e| is_req(e)).unwrap().clone();
    let CmEventKind::ConnectRequest { param, .. } = req.kind else {
        unreachable!()
    };
    assert_eq!(
        param,
        ConnParam {
            responder_resources: 5,
            initiator_depth: 3,
            flow_control: true,
            retry_count: 6,
            rnr_retry_count: 5,
            srq: false,
            qp_num: w.a.qpn,
        }
    );
    // B: responder resources 6, initiator depth 8 (held to A's 3), RNR retry 4.
    w.accept_first();
    assert!(w.run_until(Duration::from_secs(2), |w| w.established(0)
        && w.established(1)));
    let rep = w.events[0]
        .iter()
        .find_map(|e| match &e.kind {
            CmEventKind::Established { param, .. } => Some(*param),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        rep,
        Some(ConnParam {
            responder_resources: 3,
            initiator_depth: 6,
            flow_control: false,
            retry_count: 0,
            rnr_retry_count: 4,
            srq: true,
            qp_num: w.b.qpn,
        })
    );
    let passive = w.events[1]
        .iter()
        .find_map(|e| match &e.kind {
            CmEventKind::Established { param, .. } => Some(*param),
            _ => None,
        })
        .unwrap();
    assert_eq!(passive, None, "an RTU carries no parameters");
    let attr = |p: &Peer| *w.f.node(p.node).context().qp(p.qpn).unwrap().attr();
    let (a, b) = (attr(&w.a), attr(&w.b));
    assert_eq!(
        (
            a.max_dest_rd_atomic,
            a.max_rd_atomic,
            a.retry_cnt,
            a.rnr_retry,
            a.timeout
        ),
        (3, 5, 6, 4, 12)
    );
    assert_eq!(
        (
            b.max_dest_rd_atomic,
            b.max_rd_atomic,
            b.retry_cnt,
            b.rnr_retry,
            b.timeout
        ),
        (6, 3, 6, 5, 12)
    );
}

/// Linux `cm.c`'s `cm_ack_timeout` and the passive side's timeout from a REQ, by value.
#[test]
fn ack_timeout_arithmetic_as_linux() {
    use hca::cm::{cm_ack_timeout, passive_ack_timeout};
    // RoCE: packet life time 16, our REP's ACK delay 0 -> 17; rxe's ACK delay 15 -> 17.
    assert_eq!(cm_ack_timeout(0, 16), 17);
    assert_eq!(cm_ack_timeout(15, 16), 17);
    // An ACK delay about as large as the life time adds one; a larger one wins.
    assert_eq!(cm_ack_timeout(16, 15), 17);
    assert_eq!(cm_ack_timeout(17, 16), 18);
    assert_eq!(cm_ack_timeout(20, 10), 20);
    assert_eq!(cm_ack_timeout(20, 18), 21);
    assert_eq!(cm_ack_timeout(31, 31), 31);
    assert_eq!(passive_ack_timeout(17), 17);
    assert_eq!(passive_ack_timeout(0), 1);
    assert_eq!(passive_ack_timeout(40), 31);
}
