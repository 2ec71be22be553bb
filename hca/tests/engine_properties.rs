//! Properties of the whole engine over random operation sequences and fault schedules:
//!
//! * random RC operation sequences (SEND, SEND with immediate, RDMA WRITE, WRITE with immediate,
//!   RDMA READ, fetch-and-add, compare-and-swap; 0 bytes .. 1 MiB, 1..4 SGEs) between two QPs
//!   under random fault schedules deliver exactly what a lossless run delivers and what the
//!   sequential model says, complete in order, never panic, and execute each atomic exactly once
//!   (the model's fetch-and-add sums and compare-and-swap outcomes would differ otherwise);
//! * soak: 10^5 RC operations through a fabric with 10% loss, 5% reordering, 1% duplication and
//!   0.1% bit corruption, checked byte for byte against the sequential model;
//! * random sequences of hostile packets from a peer that lies: the engine never panics, hangs,
//!   grows a queue without bound, or touches memory out of bounds.

mod common;

use std::time::Duration;

use common::crafted_packets::*;
use common::workload::{check, generate, generate_sized, run};
use common::*;
use hca::fabric::Faults;
use hca::{AccessFlags, PathMtu, SendOp};
use proptest::prelude::*;
use roce::aeth::Syndrome;
use roce::packet::{ExtReprs, TransportRepr};
use roce::{aeth, atomic_eth, bth, reth, Opcode};

// ---- random operations under random faults, against the model ----

fn arb_faults() -> impl Strategy<Value = Faults> {
    (
        0.0..0.12f64,
        0.0..0.03f64,
        0.0..0.08f64,
        0.0..0.005f64,
        0.0..0.2f64,
        0u64..3_000,
    )
        .prop_map(
            |(loss, duplicate, reorder, corrupt, ce_mark, jitter)| Faults {
                loss,
                duplicate,
                reorder,
                corrupt,
                ce_mark,
                jitter: Duration::from_nanos(jitter),
                ..Faults::none()
            },
        )
}

/// The cases are drawn from a fixed seed, so that the suite is reproducible: under 12% loss an
/// RC QP may legitimately exhaust `retry_cnt` (eight rounds in a row without progress, about
/// 0.2^8 per stall), which a random seed would turn into a rare flake. Set `HCA_PROPTEST_SEED`
/// (and `PROPTEST_CASES`) to explore other cases.
fn config() -> ProptestConfig {
    seeded_config(0x5eed_0003, 10)
}

/// `cases` cases drawn from `seed`, unless `PROPTEST_CASES` / `HCA_PROPTEST_SEED` say otherwise;
/// no failure persistence.
fn seeded_config(seed: u64, cases: u32) -> ProptestConfig {
    let seed = std::env::var("HCA_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_operations_under_random_faults_match_a_lossless_run_and_the_model(
        seed in any::<u64>(),
        count in 1usize..40,
        faults in arb_faults(),
        pmtu in prop_oneof![
            Just(PathMtu::Mtu256),
            Just(PathMtu::Mtu1024),
            Just(PathMtu::Mtu2048),
            Just(PathMtu::Mtu4096)
        ],
        max_rd_atomic in 1u8..8,
        a_psn in prop_oneof![Just(0xff_ff00u32), 0u32..0x100_0000],
        window in prop_oneof![Just(4u32), Just(32), Just(128)],
        ack_req_every in prop_oneof![Just(1u32), Just(16), Just(64)],
        ack_delay_us in prop_oneof![Just(0u64), Just(20)],
    ) {
        // Messages up to 1 MiB; 64 KiB at PMTU 256 keeps the packet count of a case bounded.
        let max_len = if pmtu == PathMtu::Mtu256 { 64 << 10 } else { 1 << 20 };
        let ops = generate(seed, count, max_len);
        let base = Opts {
            seed,
            pmtu,
            max_rd_atomic,
            a_psn,
            config: hca::EngineConfig {
                max_unacked_psns: window,
                ack_req_every,
                ack_delay: Duration::from_micros(ack_delay_us),
                ..hca::EngineConfig::default()
            },
            ..Opts::default()
        };
        let lossless = run(&ops, &base, Duration::from_secs(60));
        check(&ops, seed, &lossless);
        let faulty = run(&ops, &Opts { faults, ..base }, Duration::from_secs(600));
        check(&ops, seed, &faulty);
        prop_assert_eq!(&faulty.a_wcs, &lossless.a_wcs);
        prop_assert_eq!(&faulty.b_wcs, &lossless.b_wcs);
        prop_assert!(faulty.a_mem == lossless.a_mem);
        prop_assert!(faulty.b_mem == lossless.b_mem);
    }
}

// ---- soak ----

fn faults() -> Faults {
    Faults {
        loss: 0.10,
        duplicate: 0.01,
        reorder: 0.05,
        corrupt: 0.001,
        ..Faults::none()
    }
}

#[test]
fn a_lossless_workload_matches_the_model_without_drops() {
    let ops = generate(11, 300, 64 << 10);
    let o = Opts::default();
    let out = run(&ops, &o, Duration::from_secs(10));
    check(&ops, o.seed, &out);
    assert_eq!(
        out.a_counters.total_drops() + out.b_counters.total_drops(),
        0
    );
}

/// 10^5 messages (SEND, WRITE, READ, atomics; mostly up to 256 bytes, some up to 4 KiB) under
/// the fault mix. Zero wrong bytes, every WR completes successfully and in order.
#[test]
fn soak_100k_messages_under_loss_reordering_duplication_and_corruption() {
    let n = 100_000;
    let ops = generate_sized(99, n, 4096, 256);
    let o = Opts {
        faults: faults(),
        seed: 5,
        ..Opts::default()
    };
    let started = std::time::Instant::now();
    let out = run(&ops, &o, Duration::from_secs(3600));
    check(&ops, o.seed, &out);
    let s = out.fabric;
    eprintln!(
        "soak: {n} messages in {:?} (virtual {:?}); fabric {s:?}; A {:?}; B {:?}",
        started.elapsed(),
        out.virtual_time,
        out.a_counters,
        out.b_counters
    );
    assert!(s.lost > 0 && s.reordered > 0 && s.duplicated > 0 && s.corrupted > 0);
    let icrc = out.a_counters.icrc_errors + out.b_counters.icrc_errors;
    let drops = out.a_counters.total_drops() + out.b_counters.total_drops();
    assert!(icrc > 0, "corruption is caught by the ICRC");
    assert!(drops >= icrc);
    assert!(out.b_counters.duplicate_request > 0 && out.a_counters.completer_retry_err > 0);
}

// ---- random hostile packets ----

const OPCODES: &[Opcode] = &[
    Opcode::RcSendFirst,
    Opcode::RcSendMiddle,
    Opcode::RcSendLast,
    Opcode::RcSendLastWithImmediate,
    Opcode::RcSendOnly,
    Opcode::RcSendOnlyWithImmediate,
    Opcode::RcRdmaWriteFirst,
    Opcode::RcRdmaWriteMiddle,
    Opcode::RcRdmaWriteLast,
    Opcode::RcRdmaWriteLastWithImmediate,
    Opcode::RcRdmaWriteOnly,
    Opcode::RcRdmaWriteOnlyWithImmediate,
    Opcode::RcRdmaReadRequest,
    Opcode::RcRdmaReadResponseFirst,
    Opcode::RcRdmaReadResponseMiddle,
    Opcode::RcRdmaReadResponseLast,
    Opcode::RcRdmaReadResponseOnly,
    Opcode::RcAcknowledge,
    Opcode::RcAtomicAcknowledge,
    Opcode::RcCompareSwap,
    Opcode::RcFetchAdd,
    Opcode::RcSendLastWithInvalidate,
    Opcode::RcSendOnlyWithInvalidate,
    Opcode::UcSendOnly,
    Opcode::UcRdmaWriteOnly,
    Opcode::UdSendOnly,
    Opcode::Cnp,
];

/// The opcodes thrown at UC and UD QPs (and a few of the other transports').
const UC_UD_OPCODES: &[Opcode] = &[
    Opcode::UcSendFirst,
    Opcode::UcSendMiddle,
    Opcode::UcSendLast,
    Opcode::UcSendLastWithImmediate,
    Opcode::UcSendOnly,
    Opcode::UcSendOnlyWithImmediate,
    Opcode::UcRdmaWriteFirst,
    Opcode::UcRdmaWriteMiddle,
    Opcode::UcRdmaWriteLast,
    Opcode::UcRdmaWriteLastWithImmediate,
    Opcode::UcRdmaWriteOnly,
    Opcode::UcRdmaWriteOnlyWithImmediate,
    Opcode::UdSendOnly,
    Opcode::UdSendOnlyWithImmediate,
    Opcode::UdSendOnly,
    Opcode::UdSendOnlyWithImmediate,
    Opcode::RcSendOnly,
    Opcode::RcAcknowledge,
    Opcode::RcRdmaReadRequest,
    Opcode::Cnp,
];

/// One hostile packet: an opcode, a PSN offset from the expected one, header field values from
/// a small set of nasty ones, a payload length.
#[derive(Debug, Clone)]
struct Hostile {
    opcode: usize,
    psn_delta: u32,
    to_requester: bool,
    va: u64,
    rkey_kind: u8,
    dma_len: u32,
    syndrome: u8,
    payload: usize,
    unchecked_icrc_flip: Option<(usize, u8)>,
}

fn arb_hostile() -> impl Strategy<Value = Hostile> {
    (
        0..OPCODES.len(),
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(0xff_ffff),
            Just(1 << 23),
            Just((1 << 23) - 1),
            0u32..8,
            any::<u32>()
        ],
        any::<bool>(),
        prop_oneof![
            Just(0u64),
            Just(B_IOVA),
            Just(B_IOVA + 8),
            Just(B_IOVA + (1 << 20) - 8),
            Just(A_IOVA),
            Just(u64::MAX),
            Just(u64::MAX - 7),
            any::<u64>()
        ],
        0u8..4,
        prop_oneof![
            Just(0u32),
            Just(8),
            Just(PMTU as u32),
            Just(PMTU as u32 + 1),
            Just(1 << 20),
            Just(1 << 31),
            Just((1 << 31) + 1),
            Just(u32::MAX),
            any::<u32>()
        ],
        any::<u8>(),
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(8),
            Just(PMTU - 1),
            Just(PMTU),
            Just(PMTU + 1),
            Just(4096),
            0usize..2048
        ],
        proptest::option::weighted(0.1, (0usize..64, 1u8..=255)),
    )
        .prop_map(
            |(opcode, psn_delta, to_requester, va, rkey_kind, dma_len, syndrome, payload, flip)| {
                Hostile {
                    opcode,
                    psn_delta,
                    to_requester,
                    va,
                    rkey_kind,
                    dma_len,
                    syndrome,
                    payload,
                    unchecked_icrc_flip: flip,
                }
            },
        )
}

/// Builds the packet `h` describes (or `None` if the headers cannot be built: an opcode whose
/// payload rule the builder enforces).
fn build_hostile(
    h: &Hostile,
    qp_type: hca::QpType,
    a: &Peer,
    b: &Peer,
    rkeys: [u32; 4],
) -> Option<Pkt> {
    let opcode = match qp_type {
        hca::QpType::Rc => OPCODES[h.opcode % OPCODES.len()],
        _ => UC_UD_OPCODES[h.opcode % UC_UD_OPCODES.len()],
    };
    let (from, to) = if h.to_requester { (b, a) } else { (a, b) };
    let rkey = rkeys[usize::from(h.rkey_kind)];
    let info = opcode.info()?;
    let has = info.ext_headers;
    use roce::opcode::ExtHeaders as E;
    let mut ext = ExtReprs::default();
    if has.contains(E::RETH) {
        ext.reth = Some(reth::Repr {
            virtual_address: h.va,
            rkey,
            dma_len: h.dma_len,
        });
    }
    if has.contains(E::AETH) {
        ext.aeth = Some(aeth::Repr {
            syndrome: Syndrome::from_byte(h.syndrome),
            msn: h.dma_len & 0xff_ffff,
        });
    }
    if has.contains(E::ATOMIC_ETH) {
        ext.atomic_eth = Some(atomic_eth::request::Repr {
            virtual_address: h.va,
            rkey,
            swap_add_data: 1,
            compare_data: h.va,
        });
    }
    if has.contains(E::ATOMIC_ACK_ETH) {
        ext.atomic_ack_eth = Some(atomic_eth::ack::Repr {
            orig_remote_data: h.va,
        });
    }
    if has.contains(E::IMMDT) {
        ext.immdt = Some(roce::immdt::Repr {
            imm_data: h.dma_len,
        });
    }
    if has.contains(E::IETH) {
        ext.ieth = Some(roce::ieth::Repr { rkey });
    }
    if has.contains(E::DETH) {
        ext.deth = Some(roce::deth::Repr {
            qkey: if h.syndrome & 4 == 0 {
                0x1111_1111
            } else {
                0x2222_2222
            },
            src_qpn: h.dma_len,
        });
    }
    let payload = if info.has_payload {
        vec![0xa5; h.payload]
    } else {
        vec![]
    };
    let psn = A_PSN.wrapping_add(h.psn_delta) & 0xff_ffff;
    let transport = TransportRepr {
        bth: bth::Repr {
            opcode,
            solicited: h.syndrome & 1 != 0,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: to.qpn,
            ack_req: h.syndrome & 2 != 0,
            psn,
        },
        ext,
    };
    try_build(tx_between(from, to), transport, &payload)
}

fn hostile_config() -> ProptestConfig {
    seeded_config(0xadc0_0001, 64)
}

proptest! {
    #![proptest_config(hostile_config())]

    /// Sequences of hostile packets (every opcode, nasty PSNs, addresses, keys, lengths,
    /// syndromes, payload sizes; some with a flipped byte under a recomputed ICRC, identification
    /// unknown) interleaved with legitimate traffic: never a panic, every queue stays bounded,
    /// memory outside the registered regions is never touched, and the engines stay usable or
    /// fail cleanly.
    #[test]
    fn hostile_packet_sequences_never_panic_and_keep_every_queue_bounded(
        packets in proptest::collection::vec(arb_hostile(), 1..60),
        legit_every in 1usize..8,
        qp_type in prop_oneof![
            3 => Just(hca::QpType::Rc),
            1 => Just(hca::QpType::Uc),
            1 => Just(hca::QpType::Ud),
        ],
    ) {
        let o = Opts { mem_len: 1 << 20, qp_type, ..Opts::default() };
        let (mut f, a, b) = pair(&o);
        let (other, _mem) = extra_mr(&mut f, &b, 4096, 0x3000_0000, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        let rkeys = [b.mr.rkey(), other.rkey(), 0xdead_beef, b.mr.lkey() ^ 1];
        for i in 0..8 {
            post_recv(&mut f, &b, i, &[b.sge(i * 4096, 4096)]);
        }
        let mut now = 1u64;
        for (i, h) in packets.iter().enumerate() {
            let Some(mut pkt) = build_hostile(h, qp_type, &a, &b, rkeys) else { continue };
            let to = if h.to_requester { &a } else { &b };
            // A flipped byte with the ICRC recomputed over it for another identification (a
            // corruption the ICRC cannot see) reaches the engine through a link that cannot see
            // the identification: the engine solves for it and judges the content.
            let ident = match h.unchecked_icrc_flip {
                Some((at, x)) => {
                    let n = pkt.data.len();
                    pkt.data[at % n] ^= x;
                    pkt = pkt.resealed_for_ident(u16::from(x) * 257);
                    None
                }
                None => Some(hca::engine::IPV4_IDENT),
            };
            f.node_mut(to.node).handle_datagram(
                t_us(now),
                &hca::Datagram {
                    src_ip: pkt.tx.src_ip,
                    dst_ip: pkt.tx.dst_ip,
                    src_port: pkt.tx.src_port,
                    dst_port: pkt.tx.dst_port,
                    ecn: pkt.tx.ecn,
                    dscp: 0,
                    hop_limit: 64,
                    ip_ident: ident,
                    payload: &pkt.data,
                },
            );
            if i % legit_every == 0 && qp_type != hca::QpType::Ud {
                let _ = f.node_mut(a.node).post_send(
                    a.qpn,
                    &send_wr(
                        i as u64,
                        &[a.sge(0, 100)],
                        SendOp::RdmaWrite { remote_addr: b.addr(8192), rkey: b.mr.rkey() },
                    ),
                );
            }
            // Every queue an engine keeps is bounded: a burst of transmits ends. The most a
            // responder can owe is one READ stream of the whole 1 MiB region (1 024 packets) per
            // responder resource (8), plus ACKs.
            for p in [&a, &b] {
                let out = transmit(&mut f, p, t_us(now));
                prop_assert!(out.len() <= 8 * 1024 + 64, "{} packets at once", out.len());
            }
            let _ = poll(&mut f, &a);
            let _ = poll(&mut f, &b);
            now += 1;
        }
        // Let the engines settle: timers are bounded and the fabric goes idle or times out.
        let _ = f.run_until(|_| false, Duration::from_millis(500));
        for p in [&a, &b] {
            let h = f.node_mut(p.node);
            let _ = h.poll_timeout();
            while h.poll_diag().is_some() {}
            while h.poll_event().is_some() {}
        }
        // A's memory is only ever read (the WRITEs' source), and READ responses to READs it
        // never posted must not land in it (unless a hostile WRITE to A was legitimate: a UC
        // WRITE FIRST / ONLY at any PSN, or an RC one at A's expected PSN, with a key that
        // happens to be A's).
        let writes_to_a = packets.iter().any(|h| {
            h.to_requester
                && (qp_type == hca::QpType::Uc
                    || h.psn_delta == 0xff_fff0u32.wrapping_sub(A_PSN))
        });
        prop_assert!(writes_to_a || a.read(0, 1 << 20).iter().all(|&x| x == 0));
    }
}
