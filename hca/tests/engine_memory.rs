//! MR memory (`engine/memory.rs`): device memory behind the staging pipeline as a memory region of
//! the software HCA, the path the software engine takes to GPU memory (`gpu_p2p::staging`),
//! checked end to end without a GPU. The "device" is `gpu_p2p::staging::HostStagingDevice` (host
//! memory with a copy-engine thread, small chunks so every transfer spans several pipelined
//! chunks); the engine reaches it only through `Memory::read` / `write` / atomics of `Staged`, as
//! it would reach CUDA memory wrapped in `Staged<CudaStaging>`. An RDMA WRITE lands in it, an RDMA
//! READ and a SEND are served from it, the atomics act on it, and the staging log shows that the
//! bytes went through the slots; a failing copy is an error, never silent data.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use gpu_p2p::staging::{Faults, HostStagingDevice, Staged, Step};
use gpu_p2p::{HostMemory, Memory};
use hca::{AccessFlags, MemoryRegion, SendOp, Sge, WcOpcode, WcStatus};

/// IOVA of the staged MR on side B.
const STAGED_IOVA: u64 = 0x9000_0000;
const STAGED_LEN: usize = 64 * 1024;
/// Staging chunk in bytes: a 10,000-byte transfer is 10 pipelined chunks.
const CHUNK: usize = 1000;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn staged_mr(
    f: &mut hca::fabric::Fabric,
    p: &Peer,
) -> (Arc<Staged<HostStagingDevice>>, MemoryRegion) {
    let device_mem = Arc::new(HostMemory::new(STAGED_LEN).expect("map"));
    let staged = Arc::new(
        Staged::new(
            HostStagingDevice::new(device_mem, Faults::default()),
            2,
            CHUNK,
            Duration::from_secs(10),
        )
        .expect("slots"),
    );
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = f
        .node_mut(p.node)
        .reg_mr(p.pd, staged.clone(), STAGED_IOVA, access)
        .expect("register the staged memory");
    (staged, mr)
}

fn uploads_and_downloads(s: &Staged<HostStagingDevice>) -> (usize, usize) {
    let log = s.device().log();
    (
        log.iter()
            .filter(|st| matches!(st, Step::Upload(..)))
            .count(),
        log.iter()
            .filter(|st| matches!(st, Step::Download(..)))
            .count(),
    )
}

#[test]
fn staged_device_memory_is_an_rdma_write_target_and_a_read_and_send_source() {
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    let (staged, mr) = staged_mr(&mut f, &b);
    let remote = |off: u64| STAGED_IOVA + off;

    // RDMA WRITE from A's host MR into B's staged memory.
    let data = pattern(10_000, 5);
    a.write(0, &data);
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 10_000)],
            SendOp::RdmaWrite {
                remote_addr: remote(300),
                rkey: mr.rkey(),
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(50));
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let device = staged.device().memory().to_vec();
    assert_eq!(
        &device[300..10_300],
        &data[..],
        "WRITE payload in device memory"
    );
    assert!(device[..300].iter().all(|&x| x == 0) && device[10_300..].iter().all(|&x| x == 0));
    let (up, _) = uploads_and_downloads(&staged);
    assert!(
        up >= 10_000 / CHUNK,
        "the payload went through the staging slots ({up} uploads)"
    );

    // RDMA READ by A of B's staged memory (other bytes, written on the device side directly).
    let more = pattern(12_345, 9);
    staged.device().memory().write(20_000, &more).unwrap();
    post_send(
        &mut f,
        &a,
        &send_wr(
            2,
            &[a.sge(100_000, 12_345)],
            SendOp::RdmaRead {
                remote_addr: remote(20_000),
                rkey: mr.rkey(),
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(50));
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(
        a.read(100_000, 12_345),
        more,
        "READ response from device memory"
    );
    let (_, down) = uploads_and_downloads(&staged);
    assert!(down >= 12_345 / CHUNK, "{down} downloads");

    // SEND from B's staged memory (two SGEs, one of them in host memory) into A's receive buffer.
    post_recv(&mut f, &a, 70, &[a.sge(200_000, 30_000)]);
    let host_part = pattern(777, 1);
    b.write(0, &host_part);
    let sg = [
        Sge {
            addr: remote(300),
            length: 10_000,
            lkey: mr.lkey(),
        },
        b.sge(0, 777),
    ];
    post_send(&mut f, &b, &send_wr(3, &sg, SendOp::Send));
    let wb = run_for_completions(&mut f, &b, 1, Duration::from_millis(50));
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode),
        (3, WcStatus::Success, WcOpcode::Send)
    );
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(50));
    assert_eq!((wa[0].wr_id, wa[0].status), (70, WcStatus::Success));
    assert_eq!(wa[0].byte_len, 10_777);
    let mut want = data.clone();
    want.extend_from_slice(&host_part);
    assert_eq!(
        a.read(200_000, 10_777),
        want,
        "SEND payload gathered from device memory"
    );

    // Atomics on the staged memory act on the device word.
    staged
        .device()
        .memory()
        .write(40_000, &41u64.to_ne_bytes())
        .unwrap();
    post_send(
        &mut f,
        &a,
        &send_wr(
            4,
            &[a.sge(300_000, 8)],
            SendOp::AtomicFetchAndAdd {
                remote_addr: remote(40_000),
                rkey: mr.rkey(),
                add: 1,
            },
        ),
    );
    post_send(
        &mut f,
        &a,
        &send_wr(
            5,
            &[a.sge(300_008, 8)],
            SendOp::AtomicCmpAndSwp {
                remote_addr: remote(40_000),
                rkey: mr.rkey(),
                compare: 42,
                swap: 7,
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 2, Duration::from_millis(50));
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(a.read(300_000, 8), 41u64.to_ne_bytes());
    assert_eq!(a.read(300_008, 8), 42u64.to_ne_bytes());
    let mut word = [0u8; 8];
    staged.device().memory().read(40_000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 7);

    let c = f.node(b.node).counters();
    assert_eq!(c.total_drops(), 0, "{c:?}");
}

#[test]
fn a_failing_staging_copy_is_a_remote_access_error_not_silent_data() {
    // The staging device fails its first copy: the WRITE's payload cannot reach device memory,
    // which the responder must report (NAK: remote access error), never complete as success.
    let o = Opts::default();
    let (mut f, a, b) = pair(&o);
    let device_mem = Arc::new(HostMemory::new(STAGED_LEN).expect("map"));
    let staged = Arc::new(
        Staged::new(
            HostStagingDevice::new(
                device_mem,
                Faults {
                    fail_copy: Some(0),
                    ..Faults::default()
                },
            ),
            2,
            CHUNK,
            Duration::from_secs(10),
        )
        .expect("slots"),
    );
    let mr = f
        .node_mut(b.node)
        .reg_mr(
            b.pd,
            staged.clone(),
            STAGED_IOVA,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("register");
    a.write(0, &pattern(3000, 2));
    post_send(
        &mut f,
        &a,
        &send_wr(
            1,
            &[a.sge(0, 3000)],
            SendOp::RdmaWrite {
                remote_addr: STAGED_IOVA,
                rkey: mr.rkey(),
            },
        ),
    );
    let wa = run_for_completions(&mut f, &a, 1, Duration::from_millis(50));
    assert_eq!(wa[0].status, WcStatus::RemAccessErr, "{wa:?}");
}
