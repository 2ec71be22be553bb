//! The collectives' device forms (`*_mem`, `*_mem_in_place`) on buffers behind the `Memory` trait,
//! without a GPU: host memory, and device memory reached through the staging pipeline
//! (`gpu_p2p::staging::Staged` over the host stand-in with an asynchronous copy engine). Every
//! collective, in place and out of place, on 1..=4 ranks, checked element by element against
//! `collectives::perf::data` on every rank. The GPU peer-to-peer all-reduce needs CUDA and separate
//! processes; `tests/gpu/check.sh` runs it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use collectives::device::DeviceBuffer;
use collectives::perf::{Case, Collective};
use collectives::{DataType, RedOp, TransportKind};
use gpu_p2p::staging::{Faults, HostStagingDevice, Staged};
use gpu_p2p::HostMemory;

const COLLECTIVES: [Collective; 8] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllToAll,
    Collective::Scatter,
    Collective::Gather,
];

fn host(n: usize) -> Result<Box<dyn DeviceBuffer>, String> {
    HostMemory::new(n)
        .map(|m| Box::new(m) as Box<dyn DeviceBuffer>)
        .map_err(|e| e.to_string())
}

fn staged(n: usize) -> Result<Box<dyn DeviceBuffer>, String> {
    let mem = Arc::new(HostMemory::new(n).map_err(|e| e.to_string())?);
    // Small chunks so that every buffer spans several pipelined chunks.
    let s = Staged::new(
        HostStagingDevice::new(mem, Faults::default()),
        2,
        64,
        Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())?;
    Ok(Box::new(s))
}

fn check(alloc: fn(usize) -> Result<Box<dyn DeviceBuffer>, String>) {
    for n in 1..=4 {
        let failures =
            common::with_ranks(n, common::config(TransportKind::InProcess), move |comm| {
                let mut failures = Vec::new();
                let mut rep = 0;
                for (i, coll) in COLLECTIVES.iter().enumerate() {
                    for (count, dt, op) in [
                        (0, DataType::F32, RedOp::Sum),
                        (13, DataType::Bf16, RedOp::Avg),
                        (301, DataType::I32, RedOp::Prod),
                    ] {
                        for in_place in [false, true] {
                            rep += 1;
                            let case = Case {
                                collective: *coll,
                                datatype: dt,
                                op,
                                root: (i + count) % n,
                                count,
                                in_place,
                            };
                            match case.run_checked_mem(comm, rep, &alloc) {
                                Ok(0) => {}
                                Ok(w) => failures
                                    .push(format!("rank {} {case:?}: {w} wrong", comm.rank())),
                                Err(e) => {
                                    failures.push(format!("rank {} {case:?}: {e}", comm.rank()))
                                }
                            }
                        }
                    }
                }
                failures
            });
        let failures: Vec<String> = failures.into_iter().flatten().collect();
        assert!(failures.is_empty(), "{n} ranks:\n{}", failures.join("\n"));
    }
}

#[test]
fn every_collective_on_host_memory_buffers() {
    check(host);
}

#[test]
fn every_collective_on_staged_device_buffers() {
    check(staged);
}

#[test]
fn a_short_device_buffer_is_an_argument_error_not_a_panic() {
    let errs = common::with_ranks(2, common::config(TransportKind::InProcess), |comm| {
        let small = HostMemory::new(8).unwrap();
        let big = HostMemory::new(64).unwrap();
        comm.all_reduce_mem(&small, &big, 16, DataType::F32, RedOp::Sum)
            .unwrap_err()
            .to_string()
    });
    for e in errs {
        assert!(e.contains("send buffer has 8 bytes"), "{e}");
    }
}

#[test]
fn a_failing_device_is_a_device_error_naming_the_rank() {
    let errs = common::with_ranks(2, common::config(TransportKind::InProcess), |comm| {
        let mem = Arc::new(HostMemory::new(4096).unwrap());
        let dev = HostStagingDevice::new(
            mem,
            Faults {
                fail_copy: Some(0),
                ..Faults::default()
            },
        );
        let bad = Staged::new(dev, 2, 64, Duration::from_secs(10)).unwrap();
        let good = HostMemory::new(4096).unwrap();
        if comm.rank() == 1 {
            comm.all_reduce_mem(&bad, &good, 16, DataType::F32, RedOp::Sum)
        } else {
            comm.all_reduce_mem(&good, &good, 16, DataType::F32, RedOp::Sum)
        }
        .map_err(|e| e.to_string())
    });
    let e1 = errs[1].clone().unwrap_err();
    assert!(
        e1.contains("rank 1") && e1.contains("device failure"),
        "{e1}"
    );
    assert!(
        errs[0].is_err(),
        "rank 0 learns of the abort instead of hanging"
    );
}
