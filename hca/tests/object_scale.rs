//! How long creating and destroying many QPs and MRs takes on a software device over UDP
//! (`hca::soft`): each create / destroy is meant to cost O(1) in the number of live objects.
//! Ignored by default (it takes seconds); it prints the times and asserts only correctness:
//!
//! ```text
//! cargo test -p hca --release --test object_scale -- --ignored --nocapture
//! ```
#![cfg(feature = "std")]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use gpu_p2p::HostMemory;
use hca::soft::{UdpDevice, UdpDeviceConfig};
use hca::{AccessFlags, QpCap, QpInitAttr, QpType};

const N: usize = 100_000;

fn device() -> UdpDevice {
    let mut c = UdpDeviceConfig::new("127.0.0.1".parse().unwrap());
    c.port = 0;
    UdpDevice::open(c).unwrap()
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture (release build)"]
fn create_and_destroy_100k_qps() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
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
    let t = Instant::now();
    let qpns: Vec<u32> = (0..N).map(|_| dev.create_qp(pd, &init).unwrap()).collect();
    let created = t.elapsed();
    assert_eq!(
        qpns.iter().collect::<HashSet<_>>().len(),
        N,
        "QPNs are distinct"
    );
    let t = Instant::now();
    for q in &qpns {
        dev.destroy_qp(*q).unwrap();
    }
    let destroyed = t.elapsed();
    println!(
        "{N} QPs: create {:.3} s ({:.2} us each), destroy {:.3} s ({:.2} us each)",
        created.as_secs_f64(),
        created.as_secs_f64() * 1e6 / N as f64,
        destroyed.as_secs_f64(),
        destroyed.as_secs_f64() * 1e6 / N as f64,
    );
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture (release build)"]
fn register_and_deregister_100k_mrs() {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mem = Arc::new(HostMemory::new(4096).unwrap());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let t = Instant::now();
    let keys: Vec<u32> = (0..N)
        .map(|_| dev.reg_mr(pd, mem.clone(), 0x1000, access).unwrap().lkey())
        .collect();
    let registered = t.elapsed();
    assert_eq!(
        keys.iter().collect::<HashSet<_>>().len(),
        N,
        "keys are distinct"
    );
    let t = Instant::now();
    for k in &keys {
        dev.dereg_mr(*k).unwrap();
    }
    let deregistered = t.elapsed();
    println!(
        "{N} MRs: register {:.3} s ({:.2} us each), deregister {:.3} s ({:.2} us each)",
        registered.as_secs_f64(),
        registered.as_secs_f64() * 1e6 / N as f64,
        deregistered.as_secs_f64(),
        deregistered.as_secs_f64() * 1e6 / N as f64,
    );
}
