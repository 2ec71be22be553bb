//! Every collective on 1..=8 ranks, in place and out of place, on odd sizes (0 and 1 element,
//! counts not divisible by the rank count, counts spanning many chunks), checked element by
//! element against the reference of `collectives::perf::data` on every rank.

mod common;

use collectives::perf::{Case, Collective};
use collectives::{DataType, RedOp, TransportKind};

fn check(collective: Collective, transport: TransportKind, max_ranks: usize) {
    common::cases::check_every_count(
        collective,
        1..=max_ranks,
        common::config(transport),
        |_, _| {},
    );
}

#[test]
fn all_reduce() {
    check(Collective::AllReduce, TransportKind::InProcess, 8);
}

#[test]
fn broadcast() {
    check(Collective::Broadcast, TransportKind::InProcess, 8);
}

#[test]
fn reduce() {
    check(Collective::Reduce, TransportKind::InProcess, 8);
}

#[test]
fn all_gather() {
    check(Collective::AllGather, TransportKind::InProcess, 8);
}

#[test]
fn reduce_scatter() {
    check(Collective::ReduceScatter, TransportKind::InProcess, 8);
}

#[test]
fn all_to_all() {
    check(Collective::AllToAll, TransportKind::InProcess, 8);
}

#[test]
fn scatter() {
    check(Collective::Scatter, TransportKind::InProcess, 8);
}

#[test]
fn gather() {
    check(Collective::Gather, TransportKind::InProcess, 8);
}

/// The same schedules over POSIX shared memory (the ranks are threads, the segments real
/// `/dev/shm` objects).
#[test]
fn all_reduce_and_all_to_all_over_posix_shm() {
    check(Collective::AllReduce, TransportKind::Shm, 5);
    check(Collective::AllToAll, TransportKind::Auto, 3);
}

/// Several channels per peer: chunks striped round-robin over them.
#[test]
fn several_channels() {
    let config = collectives::CommConfig {
        nchannels: 3,
        ..common::config(TransportKind::InProcess)
    };
    let wrong = common::with_ranks(4, config, |comm| {
        let mut wrong = 0;
        for (k, collective) in [
            Collective::AllReduce,
            Collective::Broadcast,
            Collective::AllToAll,
        ]
        .into_iter()
        .enumerate()
        {
            let case = Case {
                collective,
                datatype: DataType::F32,
                op: RedOp::Sum,
                root: 1,
                count: 777,
                in_place: k % 2 == 1,
            };
            wrong += case.run_checked(comm, k as u64).unwrap();
        }
        wrong
    });
    assert_eq!(wrong, vec![0; 4]);
}

#[test]
fn results_are_bit_identical_across_runs_and_in_place() {
    // Floats that do not add exactly: any change of reduction order would show in the bits.
    let n = 5;
    let count = 1234;
    let runs = common::with_ranks(n, common::config(TransportKind::InProcess), |comm| {
        let r = comm.rank() as f32;
        let input: Vec<f32> = (0..count)
            .map(|i| ((i as f32 + 0.1) * (r + 1.3)).sin() * 1e3 + 1e-3 * r)
            .collect();
        let mut outs = Vec::new();
        for _ in 0..3 {
            let mut out = vec![0f32; count];
            comm.all_reduce_typed(&input, &mut out, RedOp::Sum).unwrap();
            outs.push(out);
            let mut inplace = input.clone();
            comm.all_reduce_typed_in_place(&mut inplace, RedOp::Sum)
                .unwrap();
            outs.push(inplace);
        }
        outs
    });
    let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let first = bits(&runs[0][0]);
    for (rank, outs) in runs.iter().enumerate() {
        for o in outs {
            assert_eq!(
                bits(o),
                first,
                "rank {rank}: every run, every rank, same bits"
            );
        }
    }
}

/// A small all-reduce (one slot: recursive doubling) reduces one balanced tree, the same on every
/// rank and in place: with floats that do not add exactly, the sum's bits are those of
/// `op(op(x0 (+ x4), x1), op(x2, x3))` computed here, on 2..=8 ranks (powers of two and not);
/// `min` / `max` over signed zeros and NaNs (where swapping two operands can change the bits)
/// give every rank the same bits.
#[test]
fn small_all_reduce_is_one_tree_on_every_rank() {
    let count = 48; // 192 bytes: one 256-byte slot of the test configuration
    let value =
        |r: usize, i: usize| ((i as f32 + 0.3) * (r as f32 + 1.7)).sin() * 1e3 + 1e-3 * r as f32;
    let signed = |r: usize, i: usize| match (r + i) % 4 {
        0 => 0.0f32,
        1 => -0.0,
        2 => f32::from_bits(0x7fc0_0000 | (r as u32 + 1)),
        _ => -1.5 * (i % 3) as f32,
    };
    for n in 2..=8usize {
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let tree = |i: usize| {
            let mut vals: Vec<f32> = (0..p)
                .map(|r| {
                    if r + p < n {
                        value(r, i) + value(r + p, i)
                    } else {
                        value(r, i)
                    }
                })
                .collect();
            while vals.len() > 1 {
                vals = vals.chunks(2).map(|c| c[0] + c[1]).collect();
            }
            vals[0]
        };
        let want: Vec<u32> = (0..count).map(|i| tree(i).to_bits()).collect();
        let got = common::with_ranks(n, common::config(TransportKind::InProcess), |comm| {
            let r = comm.rank();
            let input: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
            let mut out = vec![0f32; count];
            comm.all_reduce_typed(&input, &mut out, RedOp::Sum).unwrap();
            let mut inplace = input.clone();
            comm.all_reduce_typed_in_place(&mut inplace, RedOp::Sum)
                .unwrap();
            let odd: Vec<f32> = (0..count).map(|i| signed(r, i)).collect();
            let mut min = vec![0f32; count];
            comm.all_reduce_typed(&odd, &mut min, RedOp::Min).unwrap();
            let mut max = vec![0f32; count];
            comm.all_reduce_typed(&odd, &mut max, RedOp::Max).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            (bits(&out), bits(&inplace), bits(&min), bits(&max))
        });
        for (rank, (out, inplace, min, max)) in got.iter().enumerate() {
            assert_eq!(
                out, &want,
                "{n} ranks, rank {rank}: sum in the tree's order"
            );
            assert_eq!(inplace, &want, "{n} ranks, rank {rank}: in place");
            assert_eq!(
                min, &got[0].2,
                "{n} ranks, rank {rank}: min bits as rank 0's"
            );
            assert_eq!(
                max, &got[0].3,
                "{n} ranks, rank {rank}: max bits as rank 0's"
            );
        }
    }
}

#[test]
fn point_to_point_and_barrier() {
    let n = 4;
    let got = common::with_ranks(n, common::config(TransportKind::InProcess), |comm| {
        let r = comm.rank();
        let send = common::ring_shift(comm);
        // Plain send/recv pairs: even ranks send first.
        let peer = r ^ 1;
        let mut got = vec![0u8; 5];
        if r % 2 == 0 {
            comm.send(&send[..5], 5, DataType::U8, peer).unwrap();
            comm.recv(&mut got, 5, DataType::U8, peer).unwrap();
        } else {
            comm.recv(&mut got, 5, DataType::U8, peer).unwrap();
            comm.send(&send[..5], 5, DataType::U8, peer).unwrap();
        }
        // To itself.
        let mut me = [0u8; 3];
        comm.send_recv(&[1, 2, 3], 3, Some(r), &mut me, 3, Some(r), DataType::U8)
            .unwrap();
        assert_eq!(me, [1, 2, 3]);
        comm.barrier().unwrap();
        got
    });
    for (r, g) in got.iter().enumerate() {
        let peer = r ^ 1;
        assert_eq!(g, &(0..5).map(|i| (i * 7 + peer) as u8).collect::<Vec<_>>());
    }
}
