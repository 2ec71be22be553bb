//! The RDMA CM (`hca::rdma_cm` over `hca::cm` and QP1) between two software HCAs over real UDP
//! sockets on loopback (127.0.0.1 and 127.0.0.2, ephemeral ports told to each other): resolve,
//! listen, connect, accept, an RDMA WRITE on the connected QPs, disconnect, timewait; and a
//! connect to a port nobody listens on (REJECTED, reason 8). The CMs are pumped through
//! `SoftDevice::with_engine` with the device clock; every wait is bounded in iterations, nothing
//! asserts on wall-clock durations.
#![cfg(feature = "std")]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::cm::CmConfig;
use hca::rdma_cm::{RdmaCm, RdmaCmEvent, RdmaCmEventType as E};
use hca::soft::{Progress, UdpDevice, UdpDeviceConfig};
use hca::{AccessFlags, QpCap, QpInitAttr, QpType, SendFlags, SendOp, SendWr, Sge, WcStatus};

const WAIT: Duration = Duration::from_secs(20);

struct Side {
    dev: UdpDevice,
    cq: hca::CqHandle,
    qpn: u32,
    mem: Arc<HostMemory>,
    mr: hca::MemoryRegion,
    cm: RdmaCm,
    events: Vec<RdmaCmEvent>,
}

impl Side {
    fn new(addr: &str) -> Side {
        let mut c = UdpDeviceConfig::new(addr.parse().unwrap());
        c.port = 0;
        c.progress = Progress::Thread;
        let dev = UdpDevice::open(c).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mem = Arc::new(HostMemory::new(1 << 16).unwrap());
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = dev.reg_mr(pd, mem.clone(), 0x1000, access).unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: false,
        };
        let qpn = dev.create_qp(pd, &init).unwrap();
        let config = CmConfig {
            response_timeout: 16, // 268 ms
            max_cm_retries: 5,
            timewait: Duration::from_millis(100),
            ..CmConfig::default()
        };
        Side {
            dev,
            cq,
            qpn,
            mem,
            mr,
            cm: RdmaCm::new(config),
            events: Vec::new(),
        }
    }

    fn ip(&self) -> IpAddr {
        self.dev.local_addr().ip()
    }

    /// Feeds the CM its QP1 MADs and due timers.
    fn pump(&mut self) {
        let now = self.dev.now();
        let cm = &mut self.cm;
        self.dev.with_engine(|h| {
            for _ in 0..1000 {
                let Some(m) = h.poll_mad() else { break };
                cm.handle_mad(now, h, &m);
            }
            if cm.poll_timeout().is_some_and(|t| t <= now) {
                cm.handle_timeout(now, h);
            }
        });
        while let Some(e) = self.cm.poll_event() {
            self.events.push(e);
        }
    }

    fn find(&self, ev: E) -> Option<&RdmaCmEvent> {
        self.events.iter().find(|e| e.event == ev)
    }
}

fn pair() -> (Side, Side) {
    let a = Side::new("127.0.0.1");
    let b = Side::new("127.0.0.2");
    a.dev.set_peer_port(b.ip(), b.dev.local_addr().port());
    b.dev.set_peer_port(a.ip(), a.dev.local_addr().port());
    (a, b)
}

/// Pumps both CMs every millisecond until `done` holds; at most `WAIT` worth of iterations.
fn run_until(a: &mut Side, b: &mut Side, mut done: impl FnMut(&Side, &Side) -> bool) -> bool {
    for _ in 0..WAIT.as_millis() {
        a.pump();
        b.pump();
        if done(a, b) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

fn connect(a: &mut Side, b: &Side, port: u16) {
    let id = a.cm.create_id().unwrap();
    let dst = SocketAddr::new(b.ip(), port);
    let cm = &mut a.cm;
    a.dev
        .with_engine(|h| cm.resolve_addr(h, id, None, dst))
        .unwrap();
    a.cm.resolve_route(id).unwrap();
    let (now, qpn, cm) = (a.dev.now(), a.qpn, &mut a.cm);
    a.dev
        .with_engine(|h| cm.connect(now, h, id, qpn, b"over udp"))
        .unwrap();
}

#[test]
fn rdma_cm_connects_two_udp_devices_and_data_flows() {
    let (mut a, mut b) = pair();
    let l = b.cm.create_id().unwrap();
    b.cm.listen(l, "0.0.0.0:7471".parse().unwrap()).unwrap();
    connect(&mut a, &b, 7471);
    assert!(run_until(&mut a, &mut b, |_, b| b
        .find(E::ConnectRequest)
        .is_some()));
    let req = b.find(E::ConnectRequest).unwrap().clone();
    assert_eq!(&req.private_data[..8], b"over udp");
    let (now, qpn, cm) = (b.dev.now(), b.qpn, &mut b.cm);
    b.dev
        .with_engine(|h| cm.accept(now, h, req.id, qpn, b""))
        .unwrap();
    assert!(run_until(&mut a, &mut b, |a, b| {
        a.find(E::Established).is_some() && b.find(E::Established).is_some()
    }));

    // The CM connected the QPs: an RDMA WRITE lands.
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

    let (now, cm) = (b.dev.now(), &mut b.cm);
    b.dev
        .with_engine(|h| cm.disconnect(now, h, req.id))
        .unwrap();
    assert!(run_until(&mut a, &mut b, |a, b| {
        [a, b]
            .iter()
            .all(|s| s.find(E::Disconnected).is_some() && s.find(E::TimewaitExit).is_some())
    }));
    assert_eq!(
        a.cm.cm().connection_count() + b.cm.cm().connection_count(),
        0
    );
    let c = a.dev.with_engine(|h| h.counters().clone());
    assert!(c.gsi_sent >= 2 && c.gsi_rcvd >= 2, "{c:?}");
}

#[test]
fn a_closed_port_is_rejected_over_udp() {
    let (mut a, mut b) = pair();
    connect(&mut a, &b, 9);
    assert!(run_until(&mut a, &mut b, |a, _| a
        .find(E::Rejected)
        .is_some()));
    assert_eq!(a.find(E::Rejected).unwrap().status, 8);
}
