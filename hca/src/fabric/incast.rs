//! Congestion experiments on the switched fabric ([`super::switch`]): N:1 incast and the victim
//! flow, as in the DCQCN paper (Zhu et al., SIGCOMM 2015, §5 / §6), each a function of its
//! [`Scenario`] and seed only.
//!
//! Every flow is one RC QP pair keeping `depth` RDMA WRITEs of `message` bytes posted (one is
//! reposted as each completes), path MTU 4096, from its sender node to its receiver node. The
//! result gives every flow's throughput per trace interval (wire bytes leaving the switch
//! toward the receiver), the receiver port's queue trace and counters, and the NIC pauses.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::net::{IpAddr, Ipv4Addr};
use core::time::Duration;

use gpu_p2p::HostMemory;

use super::switch::{PortCounters, SwitchConfig};
use super::{soft_hca_random, Fabric, Faults, NodeId, SeededRandom};
use crate::engine::dcqcn::DcqcnParams;
use crate::engine::{EngineConfig, Instant};
use crate::verbs::connect::{self, ConnectAttr};
use crate::verbs::device::PathMtu;
use crate::verbs::gid::Gid;
use crate::verbs::mr::AccessFlags;
use crate::verbs::qp::{QpCap, QpInitAttr, QpState, QpType};
use crate::verbs::wc::{WcStatus, WorkCompletion};
use crate::verbs::wr::{SendFlags, SendOp, SendWr, Sge};

/// What the fabric does about congestion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// PFC, no rate control (ECN marks are answered with CNPs that nothing acts on).
    Pfc,
    /// No PFC: full queues drop, RC recovers by go-back-N (IBTA vol. 1 §9.7.5.1.2, NAK
    /// PSN sequence error).
    Lossy,
    /// PFC and DCQCN (the paper's parameters, [`DcqcnParams::paper`]).
    DcqcnPfc,
}

impl Control {
    /// A short name for tables and file names.
    pub fn name(self) -> &'static str {
        match self {
            Control::Pfc => "pfc",
            Control::Lossy => "lossy",
            Control::DcqcnPfc => "dcqcn+pfc",
        }
    }
}

/// One experiment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    /// Senders to the one receiver.
    pub senders: usize,
    /// Add the victim flow: sender 0 also writes to a second receiver, whose port is not
    /// congested.
    pub victim: bool,
    /// Congestion handling.
    pub control: Control,
    /// Virtual time to run.
    pub duration: Duration,
    /// Bytes per WRITE.
    pub message: u32,
    /// WRITEs each flow keeps posted.
    pub depth: u32,
    /// Seed of the fabric (RED draws) and of the QPNs and keys.
    pub seed: u64,
    /// The switch (its `mode` is set from `control`).
    pub switch: SwitchConfig,
}

impl Scenario {
    /// N:1 incast at the paper's settings (40 Gb/s, RED 5 KB / 200 KB / 1 %), 64 KiB WRITEs,
    /// 8 posted per flow.
    pub fn incast(senders: usize, control: Control, duration: Duration) -> Scenario {
        Scenario {
            senders,
            victim: false,
            control,
            duration,
            message: 64 << 10,
            depth: 8,
            seed: 22,
            switch: SwitchConfig::paper(control != Control::Lossy),
        }
    }
}

/// A flow's identity and totals.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowResult {
    /// Sending node.
    pub from: NodeId,
    /// Receiving node.
    pub to: NodeId,
    /// Wire bytes per trace interval, indexed by interval from 0.
    pub bytes: Vec<u64>,
    /// WRITEs completed successfully.
    pub completed: u64,
    /// Completions with an error status (a flow that failed stops).
    pub failed: u64,
    /// The sender's CNPs received and the reaction point's cuts.
    pub cnps: u64,
    /// Go-back-N retries of the sender node, all its QPs (`completer_retry_err`, rxe's
    /// counter of the same name).
    pub retries: u64,
}

/// What an experiment measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// The flows: first the N incast flows, then the victim flow if any.
    pub flows: Vec<FlowResult>,
    /// The trace interval.
    pub interval: Duration,
    /// The congested (receiver's) port's largest egress backlog per interval, wire bytes.
    pub queue: Vec<u64>,
    /// The receiver port's counters.
    pub receiver_port: PortCounters,
    /// The counters of every sender's port (PAUSEs sent to it, its drops).
    pub sender_ports: Vec<PortCounters>,
}

impl Outcome {
    /// Gb/s of flow `f` over intervals `range`.
    pub fn gbps(&self, f: usize, range: core::ops::Range<usize>) -> f64 {
        let n = range.len().max(1) as f64;
        let bytes: u64 = range
            .map(|i| self.flows[f].bytes.get(i).copied().unwrap_or(0))
            .sum();
        bytes as f64 * 8.0 / (n * self.interval.as_nanos() as f64)
    }

    /// Jain's fairness index of the incast flows' throughput over intervals `range`
    /// (`(sum x)^2 / (n sum x^2)`, 1 = equal shares; Jain, Chiu, Hawe 1984).
    pub fn jain(&self, range: core::ops::Range<usize>) -> f64 {
        let xs: Vec<f64> = (0..self.scenario.senders)
            .map(|f| self.gbps(f, range.clone()))
            .collect();
        jain(&xs)
    }

    /// Number of trace intervals.
    pub fn intervals(&self) -> usize {
        (self.scenario.duration.as_nanos() / self.interval.as_nanos().max(1)) as usize
    }

    /// PAUSE frames the switch sent, all ports.
    pub fn pauses(&self) -> u64 {
        self.sender_ports.iter().map(|p| p.pause_sent).sum::<u64>() + self.receiver_port.pause_sent
    }

    /// Packets the switch dropped, all ports.
    pub fn drops(&self) -> u64 {
        self.sender_ports
            .iter()
            .chain(core::iter::once(&self.receiver_port))
            .map(|p| p.drops + p.headroom_drops)
            .sum()
    }
}

/// Jain's fairness index of `xs` (1.0 for an empty or all-zero list).
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 {
        1.0
    } else {
        s * s / (xs.len() as f64 * q)
    }
}

struct Flow {
    from: NodeId,
    to: NodeId,
    qpn: u32,
    cq: crate::verbs::cq::CqHandle,
    sge: Sge,
    remote_addr: u64,
    rkey: u32,
    completed: u64,
    failed: u64,
    alive: bool,
}

fn ip(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, (n >> 8) as u8, n as u8 + 1))
}

/// Runs `s`. Deterministic: the same scenario gives the same outcome.
///
/// # Panics
/// If setting up the nodes, memory or QPs fails (a bug, or no memory for the MRs).
pub fn run(s: &Scenario) -> Outcome {
    let mut switch = s.switch;
    switch.mode = match (s.control, s.switch.mode) {
        (Control::Lossy, super::switch::SwitchMode::Lossless(_)) => {
            super::switch::SwitchMode::Lossy { buffer: 300_000 }
        }
        (Control::Lossy, m) => m,
        (_, super::switch::SwitchMode::Lossless(p)) => super::switch::SwitchMode::Lossless(p),
        (_, super::switch::SwitchMode::Lossy { .. }) => super::switch::SwitchMode::Lossless(
            super::switch::Pfc::for_link(switch.line_rate, switch.link_delay, 300_000),
        ),
    };
    let config = EngineConfig {
        dcqcn: (s.control == Control::DcqcnPfc).then(|| DcqcnParams::paper(switch.line_rate)),
        ..EngineConfig::default()
    };
    let mut fabric = Fabric::new(s.seed, Faults::none());
    fabric.set_switch(Some(switch));
    let receivers = if s.victim { 2 } else { 1 };
    let nodes: Vec<NodeId> = (0..s.senders + receivers)
        .map(|i| {
            fabric.add_node(soft_hca_random(
                ip(i),
                9000,
                config.clone(),
                alloc::boxed::Box::new(SeededRandom::new(s.seed ^ (i as u64) << 8)),
            ))
        })
        .collect();
    // Per node: a PD, a CQ, an MR.
    let mut res = Vec::new();
    for &n in &nodes {
        let h = fabric.node_mut(n);
        let pd = h.alloc_pd().expect("pd");
        let cq = h.create_cq(4096).expect("cq");
        let mem = Arc::new(HostMemory::new(s.message as usize).expect("memory"));
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = h.reg_mr(pd, mem, 0x1000, access).expect("mr");
        res.push((pd, cq, mr));
    }
    let mut pairs: Vec<(usize, usize)> = (0..s.senders).map(|i| (i, s.senders)).collect();
    if s.victim {
        pairs.push((0, s.senders + 1));
    }
    let mut flows = Vec::new();
    for &(a, b) in &pairs {
        let mk = |fabric: &mut Fabric, n: usize| {
            let (pd, cq, _) = res[n];
            fabric
                .node_mut(nodes[n])
                .create_qp(
                    pd,
                    &QpInitAttr {
                        qp_type: QpType::Rc,
                        send_cq: cq,
                        recv_cq: cq,
                        srq: None,
                        cap: QpCap {
                            max_send_wr: s.depth.max(1),
                            max_recv_wr: 1,
                            max_send_sge: 1,
                            max_recv_sge: 1,
                            max_inline_data: 0,
                        },
                        sq_sig_all: false,
                    },
                )
                .expect("qp")
        };
        let qa = mk(&mut fabric, a);
        let qb = mk(&mut fabric, b);
        for (me, my_qp, peer, peer_qp) in [(a, qa, b, qb), (b, qb, a, qa)] {
            let attr = ConnectAttr {
                access: AccessFlags::REMOTE_WRITE,
                path_mtu: PathMtu::Mtu4096,
                ah_attr: ConnectAttr::av(Gid::from(ip(peer)), 2, 64, 0),
                remote_qpn: peer_qp,
                remote_psn: 0,
                local_psn: 0,
                max_dest_rd_atomic: 1,
                max_rd_atomic: 1,
                timeout: 8,
                retry_cnt: 7,
                rnr_retry: 7,
                ..ConnectAttr::default()
            };
            let h = fabric.node_mut(nodes[me]);
            connect::bring_up(&attr, QpState::Reset, QpState::Rts, |qp, mask| {
                h.modify_qp(my_qp, qp, mask).map(|_| ())
            })
            .expect("connect");
        }
        let (_, cq, mr) = &res[a];
        let (_, _, rmr) = &res[b];
        flows.push(Flow {
            from: nodes[a],
            to: nodes[b],
            qpn: qa,
            cq: *cq,
            sge: Sge {
                addr: mr.iova(),
                length: s.message,
                lkey: mr.lkey(),
            },
            remote_addr: rmr.iova(),
            rkey: rmr.rkey(),
            completed: 0,
            failed: 0,
            alive: true,
        });
    }
    let post = |fabric: &mut Fabric, f: &Flow, idx: usize| {
        let sg = [f.sge];
        let wr = SendWr {
            wr_id: idx as u64,
            sg_list: &sg,
            op: SendOp::RdmaWrite {
                remote_addr: f.remote_addr,
                rkey: f.rkey,
            },
            send_flags: SendFlags::SIGNALED,
        };
        fabric.node_mut(f.from).post_send(f.qpn, &wr).is_ok()
    };
    for (i, f) in flows.iter().enumerate() {
        for _ in 0..s.depth {
            post(&mut fabric, f, i);
        }
    }
    let mut wcs = [WorkCompletion::success(0, crate::verbs::wc::WcOpcode::Send, 0, 0); 64];
    let end = Instant::ZERO + s.duration;
    // Each step delivers, times out or advances the clock; the run ends at `end` (or when
    // nothing can happen any more, e.g. every flow failed).
    while fabric.now() < end {
        if !fabric.step_to(end) {
            break;
        }
        for i in 0..flows.len() {
            let (node, cq) = (flows[i].from, flows[i].cq);
            // Completions of one CQ may belong to several flows of the node (the victim).
            loop {
                let n = fabric.node_mut(node).poll_cq(cq, &mut wcs).unwrap_or(0);
                for wc in &wcs[..n] {
                    let k = wc.wr_id as usize;
                    let Some(f) = flows.get_mut(k) else { continue };
                    if wc.status == WcStatus::Success {
                        f.completed += 1;
                        if f.alive {
                            let f = &flows[k];
                            post(&mut fabric, f, k);
                        }
                    } else {
                        f.failed += 1;
                        f.alive = false;
                    }
                }
                if n < wcs.len() {
                    break;
                }
            }
        }
    }
    let sw = fabric.switch().expect("switch");
    let interval = sw.config().trace_interval;
    let intervals = (s.duration.as_nanos() / interval.as_nanos().max(1)) as usize;
    let series = |trace: &[(u64, u64)]| {
        let mut v = alloc::vec![0u64; intervals];
        for &(i, b) in trace {
            if let Some(x) = v.get_mut(i as usize) {
                *x = b;
            }
        }
        v
    };
    let receiver = nodes[s.senders];
    let flows_out = flows
        .iter()
        .map(|f| {
            let h = fabric.node(f.from);
            FlowResult {
                from: f.from,
                to: f.to,
                bytes: series(&sw.flow_trace(f.from, f.to)),
                completed: f.completed,
                failed: f.failed,
                cnps: h.counters().cnp_rcvd,
                retries: h.counters().completer_retry_err,
            }
        })
        .collect();
    Outcome {
        scenario: *s,
        flows: flows_out,
        interval,
        queue: series(sw.queue_trace(receiver)),
        receiver_port: sw.port_counters(receiver),
        sender_ports: (0..s.senders).map(|i| sw.port_counters(nodes[i])).collect(),
    }
}
