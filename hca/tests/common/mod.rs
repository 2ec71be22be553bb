//! Shared set-up for the engine tests: two software HCAs on a fabric, one QP each, connected,
//! with a memory region of host memory on each side.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::fabric::{self, Fabric, Faults, NodeId};
use hca::verbs::connect::{self, ConnectAttr};
use hca::{
    AccessFlags, CqHandle, DropReason, EngineConfig, Gid, MemoryRegion, PathMtu, PdHandle, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, WorkCompletion,
};

/// IOVA where side A's MR starts (different from B's so address bugs show).
pub const A_IOVA: u64 = 0x10_0000;
/// IOVA where side B's MR starts.
pub const B_IOVA: u64 = 0x7700_0000;

/// One side of a connection.
pub struct Peer {
    pub node: NodeId,
    pub ip: IpAddr,
    pub pd: PdHandle,
    pub cq: CqHandle,
    pub qpn: u32,
    pub mem: Arc<HostMemory>,
    pub mr: MemoryRegion,
}

impl Peer {
    /// An SGE of `len` bytes at byte `offset` of this side's MR.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.iova() + offset,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    /// The I/O virtual address of byte `offset` of the MR.
    pub fn addr(&self, offset: u64) -> u64 {
        self.mr.iova() + offset
    }

    pub fn write(&self, offset: usize, bytes: &[u8]) {
        self.mem.write(offset, bytes).unwrap();
    }

    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(offset, &mut v).unwrap();
        v
    }
}

/// Connection parameters.
#[derive(Clone)]
pub struct Opts {
    pub qp_type: QpType,
    pub pmtu: PathMtu,
    pub a_psn: u32,
    pub b_psn: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub mem_len: usize,
    pub depth: u32,
    pub cq_depth: u32,
    pub seed: u64,
    pub faults: Faults,
    pub config: EngineConfig,
    pub ipv6: bool,
    /// `Some(seed)`: MR keys and QPNs from a [`fabric::SeededRandom`], so that two runs send the
    /// same bytes; `None` (default): from the OS, as on every device.
    pub random_seed: Option<u64>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            qp_type: QpType::Rc,
            pmtu: PathMtu::Mtu1024,
            a_psn: 100,
            b_psn: 0xff_fff0,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 8,
            mem_len: 1 << 20,
            depth: 64,
            cq_depth: 1024,
            seed: 1,
            faults: Faults::none(),
            config: EngineConfig::default(),
            ipv6: false,
            random_seed: None,
        }
    }
}

pub fn ip_of(n: u8, ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(std::net::Ipv6Addr::new(
            0xfd00,
            0,
            0,
            0,
            0,
            0,
            0,
            u16::from(n),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }
}

/// Creates side `n` (PD, CQ, MR, a QP in RESET) on a new node of `fabric`.
pub fn side(fabric: &mut Fabric, n: u8, iova: u64, o: &Opts) -> Peer {
    let ip = ip_of(n, o.ipv6);
    let hca = match o.random_seed {
        Some(seed) => fabric::soft_hca_random(
            ip,
            9000,
            o.config.clone(),
            Box::new(fabric::SeededRandom::new(seed ^ u64::from(n))),
        ),
        None => fabric::soft_hca_with(ip, 9000, o.config.clone()),
    };
    let node = fabric.add_node(hca);
    let h = fabric.node_mut(node);
    let pd = h.alloc_pd().unwrap();
    let cq = h.create_cq(o.cq_depth).unwrap();
    let mem = Arc::new(HostMemory::new(o.mem_len).unwrap());
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = h.reg_mr(pd, mem.clone(), iova, access).unwrap();
    let qpn = h
        .create_qp(
            pd,
            &QpInitAttr {
                qp_type: o.qp_type,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: o.depth,
                    max_recv_wr: o.depth,
                    max_send_sge: 8,
                    max_recv_sge: 8,
                    max_inline_data: 256,
                },
                sq_sig_all: false,
            },
        )
        .unwrap();
    // Setting up the GID table raised IBV_EVENT_GID_CHANGE: tests look at later events.
    while h.poll_event().is_some() {}
    Peer {
        node,
        ip,
        pd,
        cq,
        qpn,
        mem,
        mr,
    }
}

/// Brings `me` to RTS, connected (RC/UC) to `peer`.
pub fn bring_up(fabric: &mut Fabric, me: &Peer, peer: &Peer, my_psn: u32, peer_psn: u32, o: &Opts) {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let a = ConnectAttr {
        qp_type: o.qp_type,
        access: if o.qp_type == QpType::Uc {
            AccessFlags::REMOTE_WRITE
        } else {
            access
        },
        qkey: 0x1111_1111,
        path_mtu: o.pmtu,
        ah_attr: ConnectAttr::av(Gid::from(peer.ip), 2, 64, 0),
        remote_qpn: peer.qpn,
        remote_psn: peer_psn,
        local_psn: my_psn,
        max_dest_rd_atomic: o.max_rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
        rnr_retry: o.rnr_retry,
        max_rd_atomic: o.max_rd_atomic,
        ..ConnectAttr::default()
    };
    let h = fabric.node_mut(me.node);
    connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
        h.modify_qp(me.qpn, qp, mask).map(|_| ())
    })
    .unwrap();
}

/// Brings `me` to RTR only, connected to `peer`.
pub fn bring_up_to_rtr(f: &mut hca::fabric::Fabric, me: &Peer, peer: &Peer, peer_psn: u32) {
    let a = ConnectAttr {
        access: AccessFlags::REMOTE_WRITE,
        path_mtu: hca::PathMtu::Mtu1024,
        ah_attr: ConnectAttr::av(hca::Gid::from(peer.ip), 2, 64, 0),
        remote_qpn: peer.qpn,
        remote_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..ConnectAttr::default()
    };
    let h = f.node_mut(me.node);
    connect::bring_up(&a, QpState::Reset, QpState::Rtr, |qp, mask| {
        h.modify_qp(me.qpn, qp, mask).map(|_| ())
    })
    .unwrap();
}

/// A fabric with two connected sides.
pub fn pair(o: &Opts) -> (Fabric, Peer, Peer) {
    let mut fabric = Fabric::new(o.seed, o.faults);
    let a = side(&mut fabric, 1, A_IOVA, o);
    let b = side(&mut fabric, 2, B_IOVA, o);
    bring_up(&mut fabric, &a, &b, o.a_psn, o.b_psn, o);
    bring_up(&mut fabric, &b, &a, o.b_psn, o.a_psn, o);
    (fabric, a, b)
}

/// The default options with A's first PSN `a_psn`.
pub fn opts_with_psn(a_psn: u32) -> Opts {
    Opts {
        a_psn,
        ..Opts::default()
    }
}

/// A posts one 64-byte RDMA WRITE (PSN `A_PSN`) and transmits it; B never sees it.
pub fn a_with_one_write() -> (hca::fabric::Fabric, Peer, Peer) {
    let (mut f, a, b) = pair(&Opts::default());
    work_requests::post(&mut f, &a, work_requests::write(&a, 1, (0, 64), &b, 0));
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    (f, a, b)
}

/// A posts a READ of `len` bytes into byte 4096 of its region and transmits the request.
pub fn a_with_one_read(len: u32, pmtu: hca::PathMtu) -> (hca::fabric::Fabric, Peer, Peer) {
    let (mut f, a, b) = pair(&Opts {
        pmtu,
        ..Opts::default()
    });
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(4096, len)],
            SendOp::RdmaRead {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey(),
            },
        ),
    );
    assert_eq!(transmit(&mut f, &a, t_us(0)).len(), 1);
    (f, a, b)
}

pub fn send_wr<'a>(wr_id: u64, sg: &'a [Sge], op: SendOp) -> SendWr<'a> {
    SendWr {
        wr_id,
        sg_list: sg,
        op,
        send_flags: SendFlags::SIGNALED,
    }
}

pub fn post_send(f: &mut Fabric, p: &Peer, wr: &SendWr<'_>) {
    f.node_mut(p.node).post_send(p.qpn, wr).unwrap();
}

pub fn post_recv(f: &mut Fabric, p: &Peer, wr_id: u64, sg: &[Sge]) {
    f.node_mut(p.node)
        .post_recv(p.qpn, &RecvWr { wr_id, sg_list: sg })
        .unwrap();
}

/// Drains a side's CQ.
pub fn poll(f: &mut Fabric, p: &Peer) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::success(0, hca::WcOpcode::Send, 0, 0); 64];
    loop {
        let n = f.node_mut(p.node).poll_cq(p.cq, &mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            return out;
        }
    }
}

/// The (`wr_id`, status) of each completion, in order: what most tests compare.
pub fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, hca::WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// Runs until `n` completions have been polled from `p` (collecting them), or fails.
pub fn run_for_completions(
    f: &mut Fabric,
    p: &Peer,
    n: usize,
    max: Duration,
) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let r = f.run_until(
        |f| {
            got.extend(poll(f, p));
            got.len() >= n
        },
        max,
    );
    assert!(
        r.is_ok(),
        "{r:?}: got {} of {n} completions: {got:?}",
        got.len()
    );
    got
}

pub mod crafted_packets;
pub mod uc_ud;
pub mod work_requests;
pub mod workload;

/// A packet taken from an engine by hand (scenario tests drive the link themselves).
#[derive(Clone, Debug)]
pub struct Pkt {
    pub tx: hca::Transmit,
    pub data: Vec<u8>,
}

impl Pkt {
    /// The parsed headers (the packet is well-formed: the engine built it).
    pub fn parsed(&self) -> roce::packet::ParsedTransport<'_> {
        roce::packet::parse_udp_payload(&self.data).unwrap()
    }

    pub fn opcode(&self) -> roce::Opcode {
        self.parsed().transport.bth.opcode
    }

    pub fn psn(&self) -> u32 {
        self.parsed().transport.bth.psn
    }

    pub fn aeth(&self) -> Option<roce::aeth::Repr> {
        self.parsed().transport.ext.aeth
    }

    /// Rebuilds the packet with new transport headers and payload (a valid ICRC: the receiver
    /// must judge the content, not the checksum).
    pub fn rebuilt(&self, transport: roce::packet::TransportRepr, payload: &[u8]) -> Pkt {
        let ip = match (self.tx.src_ip, self.tx.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
                src_addr: s,
                dst_addr: d,
                protocol: roce::ipv4::IpProtocol::Udp,
                payload_len: 0,
                hop_limit: self.tx.hop_limit,
                dscp: self.tx.dscp,
                ecn: self.tx.ecn,
                ident: hca::engine::IPV4_IDENT,
                dont_frag: true,
            }),
            (IpAddr::V6(s), IpAddr::V6(d)) => roce::packet::IpRepr::Ipv6(roce::ipv6::Repr {
                src_addr: s,
                dst_addr: d,
                next_header: roce::ipv4::IpProtocol::Udp,
                payload_len: 0,
                hop_limit: self.tx.hop_limit,
                dscp: self.tx.dscp,
                ecn: self.tx.ecn,
                flow_label: 0,
            }),
            _ => unreachable!("mixed families"),
        };
        let repr = roce::packet::PacketRepr {
            ip,
            udp_src_port: self.tx.src_port,
            udp_checksum: false,
            transport,
        };
        let mut out = vec![0u8; 9000];
        let len = roce::packet::build_udp_payload(&repr, &[payload], &mut out).unwrap();
        out.truncate(len);
        let mut tx = self.tx;
        tx.len = len;
        Pkt { tx, data: out }
    }
}

impl Pkt {
    /// The packet with its ICRC recomputed for IPv4 identification `ident` (the ICRC covers it,
    /// IBTA vol. 1 Annex A17.3.3), as a sender whose kernel numbers its packets would send it.
    /// IPv4 only.
    pub fn resealed_for_ident(&self, ident: u16) -> Pkt {
        let (IpAddr::V4(src_addr), IpAddr::V4(dst_addr)) = (self.tx.src_ip, self.tx.dst_ip) else {
            panic!("not an IPv4 packet");
        };
        let ip = roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
            src_addr,
            dst_addr,
            protocol: roce::ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: self.tx.hop_limit,
            dscp: self.tx.dscp,
            ecn: self.tx.ecn,
            ident,
            dont_frag: true,
        });
        let udp = roce::udp::Repr {
            src_port: self.tx.src_port,
            dst_port: self.tx.dst_port,
            payload_len: self.data.len(),
        };
        let icrc = roce::packet::icrc_of_udp_payload(&ip, &udp, &self.data).unwrap();
        let mut out = self.clone();
        let n = out.data.len();
        out.data[n - 4..].copy_from_slice(&roce::icrc::to_wire(icrc));
        out
    }
}

/// Everything `p`'s engine wants to send now.
pub fn transmit(f: &mut Fabric, p: &Peer, now: hca::Instant) -> Vec<Pkt> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; hca::engine::MAX_UDP_PAYLOAD];
    while let Some(tx) = f.node_mut(p.node).poll_transmit(now, &mut buf) {
        out.push(Pkt {
            tx,
            data: buf[..tx.len].to_vec(),
        });
        assert!(out.len() < 100_000, "endless transmit");
    }
    out
}

/// Hands `pkt` to `to`'s engine.
pub fn deliver(f: &mut Fabric, to: &Peer, pkt: &Pkt, now: hca::Instant) {
    deliver_with_ident(f, to, pkt, now, hca::engine::IPV4_IDENT);
}

/// Hands `pkt` to `to`'s engine as an IPv4 datagram that arrived with identification `ident`
/// (the ICRC covers it: a GSO train's segment k arrives with k).
pub fn deliver_with_ident(f: &mut Fabric, to: &Peer, pkt: &Pkt, now: hca::Instant, ident: u16) {
    f.node_mut(to.node).handle_datagram(
        now,
        &hca::Datagram {
            src_ip: pkt.tx.src_ip,
            dst_ip: pkt.tx.dst_ip,
            src_port: pkt.tx.src_port,
            dst_port: pkt.tx.dst_port,
            ecn: pkt.tx.ecn,
            dscp: pkt.tx.dscp,
            hop_limit: pkt.tx.hop_limit,
            ip_ident: Some(ident),
            payload: &pkt.data,
        },
    );
}

/// Delivers every packet of `pkts` to `to`.
pub fn deliver_all(f: &mut Fabric, to: &Peer, pkts: &[Pkt], now: hca::Instant) {
    for p in pkts {
        deliver(f, to, p, now);
    }
}

pub fn t_us(us: u64) -> hca::Instant {
    hca::Instant::from_micros(us)
}

/// The state of `p`'s QP.
pub fn state(f: &hca::fabric::Fabric, p: &Peer) -> QpState {
    f.node(p.node).context().qp(p.qpn).unwrap().state()
}

/// Packets `p`'s engine dropped for `r`.
pub fn drops(f: &hca::fabric::Fabric, p: &Peer, r: DropReason) -> u64 {
    f.node(p.node).counters().drops(r)
}

/// Registers `len` more bytes on `p`'s node with `access`; returns the region and its memory.
pub fn extra_mr(
    f: &mut hca::fabric::Fabric,
    p: &Peer,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> (hca::MemoryRegion, Arc<HostMemory>) {
    let mem = Arc::new(HostMemory::new(len).unwrap());
    let mr = f
        .node_mut(p.node)
        .reg_mr(p.pd, mem.clone(), iova, access)
        .unwrap();
    (mr, mem)
}

/// `len` bytes of a pattern that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
