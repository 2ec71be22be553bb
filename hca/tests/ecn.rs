//! ECN and CNPs (IBTA Annex A17.9): a CE-marked packet makes the receiver send a CNP to the
//! sender's QP, rate-limited; a received CNP is counted and handed to the rate-control hook.

mod common;

use std::sync::{Arc, Mutex};

use common::work_requests::write;
use common::*;
use hca::{Instant, RateControl};
use roce::ipv4::Ecn;
use roce::Opcode;

struct Recorder(Arc<Mutex<Vec<(Instant, u32)>>>);

impl RateControl for Recorder {
    fn on_cnp(&mut self, now: Instant, qpn: u32) {
        self.0.lock().unwrap().push((now, qpn));
    }
}

#[test]
fn data_packets_are_ecn_capable_and_ce_marks_are_answered_with_a_rate_limited_cnp() {
    let (mut f, a, b) = pair(&Opts::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    f.node_mut(a.node)
        .set_rate_control(Box::new(Recorder(seen.clone())));
    for i in 0..3 {
        let (id, sg, op) = write(&a, i, (0, 8), &b, 0);
        post_send(&mut f, &a, &send_wr(id, &sg, op));
    }
    let mut pkts = transmit(&mut f, &a, t_us(0));
    assert!(
        pkts.iter().all(|p| p.tx.ecn == Ecn::Ect0),
        "ECT(0) by default"
    );
    for p in &mut pkts {
        p.tx.ecn = Ecn::Ce;
    }
    deliver_all(&mut f, &b, &pkts, t_us(10));
    let out = transmit(&mut f, &b, t_us(10));
    let cnps: Vec<_> = out.iter().filter(|p| p.opcode() == Opcode::Cnp).collect();
    assert_eq!(cnps.len(), 1, "one CNP per 50 us per QP");
    let bth = cnps[0].parsed().transport.bth;
    assert_eq!(bth.dest_qpn, a.qpn, "addressed to the sender's QP");
    assert!(bth.becn);
    assert_eq!(cnps[0].tx.ecn, Ecn::NotEct);
    assert_eq!(cnps[0].tx.dscp, 48);
    let c = f.node(b.node).counters();
    assert_eq!((c.cnp_sent, c.cnp_suppressed), (1, 2));
    // After the interval, the next CE mark gets a CNP again.
    let (id, sg, op) = write(&a, 9, (0, 8), &b, 0);
    post_send(&mut f, &a, &send_wr(id, &sg, op));
    let mut late = transmit(&mut f, &a, t_us(100));
    late[0].tx.ecn = Ecn::Ce;
    deliver(&mut f, &b, &late[0], t_us(100));
    let out2 = transmit(&mut f, &b, t_us(100));
    assert_eq!(out2.iter().filter(|p| p.opcode() == Opcode::Cnp).count(), 1);
    // The sender counts the CNPs and tells its rate control.
    for p in out.iter().chain(&out2) {
        deliver(&mut f, &a, p, t_us(120));
    }
    assert_eq!(f.node(a.node).counters().cnp_rcvd, 2);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.as_slice(), &[(t_us(120), a.qpn), (t_us(120), a.qpn)]);
    assert_eq!(f.node(a.node).counters().total_drops(), 0);
}

#[test]
fn ce_marks_under_a_fabric_produce_cnps_and_traffic_completes() {
    let o = Opts {
        faults: hca::fabric::Faults {
            ce_mark: 0.5,
            ..hca::fabric::Faults::none()
        },
        ..Opts::default()
    };
    let (mut f, a, b) = pair(&o);
    for i in 0..50 {
        let (id, sg, op) = write(&a, i, (0, 8), &b, 0);
        post_send(&mut f, &a, &send_wr(id, &sg, op));
    }
    let wcs = run_for_completions(&mut f, &a, 50, std::time::Duration::from_millis(10));
    assert!(wcs.iter().all(|w| w.status == hca::WcStatus::Success));
    assert!(f.stats().ce_marked > 0);
    assert!(f.node(b.node).counters().cnp_sent > 0);
    assert_eq!(
        f.node(a.node).counters().cnp_rcvd,
        f.node(b.node).counters().cnp_sent
    );
}
