//! Two ranks of one process connected over the transport: the connection info, addresses,
//! credits, aborts, forged writes, misuse, zero-copy registration and a dead peer.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;

use hca::soft::Progress;
use hca::{PathMtu, SendOp, Sge};

use super::channel::{WR_CREDIT, WR_DATA};
use super::connector::wire_imm;
use super::device::lock;
use super::env::choose_address;
use super::*;
use crate::bootstrap::BusinessCard;
use crate::transport::wait::WaitPolicy;
use crate::transport::CollKind;
use crate::transport::{AbortReason, Imm, OpDesc, SlotHeader, WaitFor};
use crate::DataType;

fn cards(n: usize) -> Vec<BusinessCard> {
    (0..n)
        .map(|rank| BusinessCard::local(rank, TransportKind::Roce))
        .collect()
}

fn ctx<'a>(rank: usize, cards: &'a [BusinessCard], nslots: usize) -> SetupContext<'a> {
    SetupContext {
        rank,
        nranks: cards.len(),
        nchannels: 1,
        nslots,
        slot_bytes: 64,
        tag: 0x5eed,
        cards,
        wait: WaitPolicy::OVERSUBSCRIBED,
        bootstrap_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    }
}

fn env(qp_timeout: u8, retry_cnt: u8) -> RoceEnv {
    RoceEnv {
        verbs: None,
        xdp: None,
        addrs: Vec::new(),
        port: 0,
        qp_timeout,
        retry_cnt,
        progress: Progress::Caller,
        window: None,
        ack_delay: None,
    }
}

struct Side {
    t: RoceTransport,
    c: PeerConnectors,
}

impl Side {
    fn ch(&self) -> Arc<Channel> {
        self.t.channels[0].upgrade().expect("channel alive")
    }
}

/// Ranks 0 and 1 of a two-rank communicator in this thread, connected over RoCE with
/// `nslots` slots of 64 bytes (one channel). Every run gets its own device ports; the
/// addresses are 127.0.0.1 and 127.0.0.2 (shared with concurrent tests, told apart by port).
fn pair(nslots: usize, e: RoceEnv) -> (Side, Side) {
    let cards = cards(2);
    let mut t0 = RoceTransport::new();
    let mut t1 = RoceTransport::new();
    t0.env = Some(e.clone());
    t1.env = Some(e);
    let infos = vec![
        t0.setup(&ctx(0, &cards, nslots), &[1]).unwrap(),
        t1.setup(&ctx(1, &cards, nslots), &[0]).unwrap(),
    ];
    let c0 = t0
        .connect(&ctx(0, &cards, nslots), &[1], &infos)
        .unwrap()
        .pop()
        .unwrap();
    let c1 = t1
        .connect(&ctx(1, &cards, nslots), &[0], &infos)
        .unwrap()
        .pop()
        .unwrap();
    t0.finish().unwrap();
    t1.finish().unwrap();
    (Side { t: t0, c: c0 }, Side { t: t1, c: c1 })
}

fn desc() -> OpDesc {
    OpDesc::new(0, CollKind::Broadcast, DataType::U8, None, Some(0), 5)
}

const T: Duration = Duration::from_secs(20);

#[test]
fn connection_info_round_trips_and_garbage_is_refused() {
    let (a, _b) = pair(2, env(14, 7));
    let cards = cards(2);
    // What rank 0 published, as rank 1 parsed it in `connect`.
    let mut t = RoceTransport::new();
    t.env = Some(env(14, 7));
    let info = t.setup(&ctx(0, &cards, 4), &[1]).unwrap();
    let p = PeerInfo::parse(&info).unwrap();
    assert_eq!(p.gid.to_ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(p.port, t.local_addr().unwrap().port());
    assert_eq!(p.mtu, PathMtu::Mtu4096, "loopback: PMTU 4096");
    assert_eq!(
        p.layout,
        Layout {
            nchannels: 1,
            nslots: 4,
            slot_bytes: 64
        }
    );
    assert_eq!(p.peers.len(), 1);
    assert_eq!(p.peers[0].0, 1);
    assert_eq!(
        p.peers[0].1[0].ring, p.region.0,
        "the only ring starts the region"
    );
    for cut in 0..info.len() {
        assert!(PeerInfo::parse(&info[..cut]).is_err(), "cut at {cut}");
    }
    let mut bad = info.clone();
    bad[0] ^= 1;
    assert!(PeerInfo::parse(&bad).unwrap_err().contains("magic"));
    // A peer count the record cannot hold (the field before the one peer's 4 + 16 bytes) is
    // refused before anything is allocated for it.
    let count_at = info.len() - 20 - 4;
    assert_eq!(info[count_at..count_at + 4], 1u32.to_le_bytes());
    for count in [2u32, 1 << 20, u32::MAX] {
        let mut bad = info.clone();
        bad[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        let e = PeerInfo::parse(&bad).unwrap_err();
        assert!(e.contains(&format!("{count} peers in 20 bytes")), "{e}");
    }
    drop(a);
}

#[test]
fn addresses_follow_the_environment_then_the_bootstrap_route() {
    let cards = cards(3);
    let mut c = ctx(2, &cards, 2);
    assert_eq!(
        choose_address(&c, &env(14, 7)).unwrap(),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
        "loopback rendezvous: 127.0.0.<rank + 1>"
    );
    c.bootstrap_addr = Some("10.1.2.3".parse().unwrap());
    assert_eq!(
        choose_address(&c, &env(14, 7)).unwrap(),
        "10.1.2.3".parse::<IpAddr>().unwrap()
    );
    let mut e = env(14, 7);
    e.addrs = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
    // Rank 2 is the third rank of this host: entry 2 % 2.
    assert_eq!(
        choose_address(&c, &e).unwrap(),
        "10.0.0.1".parse::<IpAddr>().unwrap()
    );
    c.bootstrap_addr = None;
    assert!(choose_address(&c, &env(14, 7)).is_err());
}

#[test]
fn credits_bound_the_sender_and_data_flows_in_order() {
    credits_bound_the_sender(env(14, 7));
}

#[test]
fn credits_bound_the_sender_with_a_progress_thread() {
    credits_bound_the_sender(RoceEnv {
        progress: Progress::Thread,
        ..env(14, 7)
    });
}

fn credits_bound_the_sender(e: RoceEnv) {
    let (mut a, mut b) = pair(2, e);
    let t = Duration::from_millis(50);
    for k in 0..2u8 {
        let slot = a.c.send[0].wait_slot(t).unwrap();
        slot[..3].copy_from_slice(&[k, k, k]);
        a.c.send[0].post(3, k as u16, &desc()).unwrap();
    }
    // Two slots, two posts, no release: the third step has no credit.
    let e = a.c.send[0].wait_slot(t).unwrap_err();
    assert!(
        matches!(
            e,
            TransportError::Timeout {
                peer: 1,
                waiting_for: WaitFor::Credit,
                ..
            }
        ),
        "{e}"
    );
    for k in 0..2u8 {
        let c = b.c.recv[0].wait(T).unwrap();
        assert_eq!(c.data, &[k, k, k]);
        assert_eq!(
            c.imm,
            Imm {
                step: k as u16,
                chunk: k as u16
            }
        );
        assert_eq!(c.desc, desc());
        b.c.recv[0].release().unwrap();
    }
    assert!(b.c.recv[0].release().is_err(), "nothing held");
    a.c.send[0].drain(T).unwrap();
    // Closing the receiver ends the sender's wait with an error naming it.
    drop(b);
    let e = a.c.send[0].drain(T);
    assert!(e.is_ok(), "nothing outstanding: {e:?}");
    for k in 2..4 {
        a.c.send[0].wait_slot(T).unwrap();
        a.c.send[0].post(0, k, &desc()).unwrap();
    }
    let e = a.c.send[0].wait_slot(T).unwrap_err();
    assert!(
        matches!(e, TransportError::PeerAborted { peer: 1, abort } if abort.reason == AbortReason::Closed),
        "{e}"
    );
}

#[test]
fn data_posted_before_close_is_still_delivered() {
    let (mut a, mut b) = pair(2, env(14, 7));
    a.c.send[0].wait_slot(T).unwrap()[0] = 42;
    a.c.send[0].post(1, 0, &desc()).unwrap();
    drop(a);
    assert_eq!(b.c.recv[0].wait(T).unwrap().data, &[42]);
    b.c.recv[0].release().unwrap();
    let e = b.c.recv[0].wait(T).unwrap_err();
    assert!(
        matches!(e, TransportError::PeerAborted { peer: 0, abort } if abort.origin == 0),
        "{e}"
    );
}

/// With caller-driven progress a rank that does not call into the transport still
/// acknowledges (the keepalive thread runs its device): its peer, with an ACK timeout of
/// 34 ms and two retries, would otherwise fail with `RETRY_EXC_ERR` after about 100 ms.
#[test]
fn an_idle_rank_still_acknowledges() {
    let (mut a, mut b) = pair(2, env(13, 2));
    for k in 0..3u16 {
        // `b` sends, `a` returns the credit (a SEND that `b` must acknowledge) and `b` sees
        // it: its last round received the credit and owes the ACK.
        b.c.send[0].wait_slot(T).unwrap()[0] = k as u8;
        b.c.send[0].post(1, k, &desc()).unwrap();
        assert_eq!(a.c.recv[0].wait(T).unwrap().data, &[k as u8]);
        a.c.recv[0].release().unwrap();
        b.c.send[0].drain(T).unwrap();
        // `b` leaves the transport alone for a while: only its keepalive thread runs, and
        // `a` keeps polling its CQ meanwhile.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            let e = a.c.send[0].drain(Duration::from_millis(1));
            assert!(e.is_ok(), "round {k}: {e:?}");
        }
    }
}

/// 70 000 steps through eight slots: the 16-bit step of the immediate wraps, credits keep
/// coming, every payload arrives in order.
#[test]
fn the_step_counter_wraps_the_immediate() {
    let (mut a, mut b) = pair(8, env(14, 7));
    const N: u32 = 70_000;
    let sender = std::thread::spawn(move || {
        for k in 0..N {
            let slot = a.c.send[0].wait_slot(T).unwrap();
            slot[..4].copy_from_slice(&k.to_le_bytes());
            a.c.send[0].post(4, k as u16, &desc()).unwrap();
        }
        a.c.send[0].drain(T).unwrap();
        a
    });
    for k in 0..N {
        let c = b.c.recv[0].wait(T).unwrap();
        assert_eq!(c.data, &k.to_le_bytes());
        assert_eq!(c.imm.step, k as u16);
        b.c.recv[0].release().unwrap();
    }
    let a = sender.join().unwrap();
    let ch = a.ch();
    let st = ch.state();
    assert_eq!((st.credit, st.data_done, st.posted), (N, N, N));
}

/// Posts a WRITE_WITH_IMM into the peer's slot of `step` as a hostile peer would.
fn forge(ch: &Channel, step: u32, imm: u32, header: &SlotHeader, len: u32) {
    let off = ch.send_off;
    let b = header.encode();
    // SAFETY: staging slot 0 of a channel this test does not otherwise use for sending.
    unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), ch.send.ptr(off), b.len()) };
    let sge = [Sge {
        addr: ch.send.iova(off),
        length: len,
        lkey: ch.send.mr.lkey(),
    }];
    let stride = ch.layout.stride() as u64;
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: ch.remote_ring + (step as u64 % ch.layout.nslots as u64) * stride,
        rkey: ch.rkey,
        imm_data: imm,
    };
    ch.post_send(&mut ch.state(), WR_DATA, &sge, op).unwrap();
}

#[test]
fn forged_writes_and_credits_are_protocol_errors() {
    let header = |step: u16, len: u32| SlotHeader {
        len,
        imm: Imm { step, chunk: 0 },
        desc: desc(),
    };
    let cases: [(u32, SlotHeader, u32, &str); 5] = [
        // Step 5 where step 0 is expected.
        (wire_imm(5, 0, true), header(5, 0), 64, "step"),
        // The header disagrees with the immediate.
        (
            wire_imm(0, 0, true),
            SlotHeader {
                imm: Imm { step: 0, chunk: 9 },
                ..header(0, 0)
            },
            64,
            "immediate",
        ),
        // A payload length beyond the slot.
        (wire_imm(0, 0, true), header(0, 65), 64, "slot"),
        // A byte count that is not header + payload.
        (wire_imm(0, 0, true), header(0, 10), 64, "bytes"),
        // A write without a header before any header on the channel (no descriptor known).
        (wire_imm(0, 0, false), header(0, 0), 8, "no header"),
    ];
    for (imm, h, len, what) in cases {
        let (a, mut b) = pair(2, env(14, 7));
        forge(&a.ch(), 0, imm, &h, len);
        let e = b.c.recv[0].wait(T).unwrap_err();
        assert!(
            matches!(e, TransportError::Protocol { peer: 0, .. }),
            "{what}: {e}"
        );
    }
    // A credit for a step never posted.
    let (mut a, b) = pair(2, env(14, 7));
    let bch = b.ch();
    bch.post_send(
        &mut bch.state(),
        WR_CREDIT,
        &[],
        SendOp::SendWithImm { imm_data: 7 },
    )
    .unwrap();
    let e = a.c.send[0].drain(T).and_then(|()| {
        a.c.send[0].wait_slot(T)?;
        a.c.send[0].post(0, 0, &desc())?;
        a.c.send[0].drain(T)
    });
    assert!(
        matches!(e, Err(TransportError::Protocol { peer: 1, .. })),
        "{e:?}"
    );
}

/// The slot header goes only with the first step of each operation on a channel (see
/// `connector`'s module docs): steps of alternating descriptors, staged and from user memory,
/// each arrive with their own descriptor and bytes; a header-less step leaves the header area
/// of its slot as the last header write left it; a header-less write longer than a slot is a
/// protocol error.
#[test]
fn the_header_goes_only_when_the_descriptor_changes() {
    let (mut a, mut b) = pair(2, env(14, 7));
    let other = OpDesc::new(1, CollKind::AllReduce, DataType::F32, None, None, 16);
    let user: Vec<u8> = (0..64u8).collect();
    // (descriptor, sent from user memory, header expected)
    let plan = [
        (desc(), false, true),
        (desc(), true, false),
        (desc(), false, false),
        (other, true, true),
        (other, false, false),
        (desc(), false, true),
    ];
    for (k, &(d, from_user, header)) in plan.iter().enumerate() {
        let len = 8 + k;
        if from_user {
            // SAFETY: `user` outlives the drain below and is not written.
            unsafe { a.c.send[0].post_from(&user[k..k + len], &user, k as u16, &d, T) }.unwrap();
        } else {
            let slot = a.c.send[0].wait_slot(T).unwrap();
            slot[..len].copy_from_slice(&user[k..k + len]);
            a.c.send[0].post(len, k as u16, &d).unwrap();
        }
        let bch = b.ch();
        let c = b.c.recv[0].wait(T).unwrap();
        assert_eq!(
            (c.desc, c.imm.chunk, c.data),
            (d, k as u16, &user[k..k + len])
        );
        // The header area of the slot: this step's header, or an older step's.
        let mut raw = [0u8; SlotHeader::LEN];
        let at = bch.recv_off + (k % 2) * bch.layout.stride();
        // SAFETY: the receive slot of a step we hold, inside the receive region.
        unsafe { core::ptr::copy_nonoverlapping(bch.recv.ptr(at), raw.as_mut_ptr(), raw.len()) };
        let h = SlotHeader::decode(&raw);
        assert_eq!(h.imm.step == k as u16, header, "step {k}: {h:?}");
        b.c.recv[0].release().unwrap();
    }
    a.c.send[0].drain(T).unwrap();
    // A header-less write of more than a slot (64 bytes) after a valid header.
    let (a, mut b) = pair(2, env(14, 7));
    let h = SlotHeader {
        len: 0,
        imm: Imm { step: 0, chunk: 0 },
        desc: desc(),
    };
    forge(&a.ch(), 0, wire_imm(0, 0, true), &h, 64);
    b.c.recv[0].wait(T).unwrap();
    b.c.recv[0].release().unwrap();
    forge(&a.ch(), 1, wire_imm(1, 0, false), &h, 65);
    let e = b.c.recv[0].wait(T).unwrap_err();
    assert!(matches!(e, TransportError::Protocol { peer: 0, .. }), "{e}");
}

#[test]
fn misuse_is_refused() {
    let (mut a, _b) = pair(2, env(14, 7));
    assert!(matches!(
        a.c.send[0].post(0, 0, &desc()),
        Err(TransportError::Usage { .. })
    ));
    a.c.send[0].wait_slot(T).unwrap();
    assert!(matches!(
        a.c.send[0].post(65, 0, &desc()),
        Err(TransportError::Usage { .. })
    ));
    // SAFETY: refused before anything reads `src`.
    let e = unsafe { a.c.send[0].post_from(&[0; 8], &[], 0, &desc(), T) };
    assert!(matches!(e, Err(TransportError::Usage { .. })), "{e:?}");
}

/// Zero-copy sends: the payload goes from the user buffer (registered once, as a whole:
/// the later sends from other pages of the same buffer hit the registration cache) into the
/// peer's slot; a region that does not contain the source registers the source alone.
#[test]
fn post_from_reads_user_memory_and_registers_it_once() {
    let (mut a, mut b) = pair(2, env(14, 7));
    let mut buf = vec![0u8; 4 * RegCache::PAGE];
    let off = buf.as_ptr().align_offset(RegCache::PAGE);
    // Three pages; the sources below lie in different pages of it.
    let user = &mut buf[off..off + 3 * RegCache::PAGE];
    for (i, b) in user.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let user = &*user;
    for k in 0..3u16 {
        let at = k as usize * (RegCache::PAGE + 50);
        let src = &user[at..at + 64];
        // SAFETY: `user` outlives the drain below and is not written.
        unsafe { a.c.send[0].post_from(src, user, k, &desc(), T) }.unwrap();
        let c = b.c.recv[0].wait(T).unwrap();
        assert_eq!(c.data, src);
        assert_eq!(c.imm.chunk, k);
        b.c.recv[0].release().unwrap();
    }
    a.c.send[0].drain(T).unwrap();
    {
        let hca = a.t.hca.as_ref().unwrap();
        let regs = lock(&hca.regs);
        assert_eq!((regs.registrations, regs.hits), (1, 2));
        assert_eq!(hca.user_wrs.load(Ordering::Acquire), 0);
    }
    // A region that does not hold the source: the source's page is registered, not the
    // region (which would not cover the SGE).
    let other = vec![7u8; 64];
    let src = &user[..64];
    // SAFETY: as above.
    unsafe { a.c.send[0].post_from(src, &other, 3, &desc(), T) }.unwrap();
    let c = b.c.recv[0].wait(T).unwrap();
    assert_eq!(c.data, src);
    b.c.recv[0].release().unwrap();
    a.c.send[0].drain(T).unwrap();
    let hca = a.t.hca.as_ref().unwrap();
    let regs = lock(&hca.regs);
    assert_eq!(
        (regs.registrations, regs.hits),
        (1, 3),
        "inside the first registration"
    );
}

/// A peer whose device is gone (no abort message, no process to watch: it shares ours) is
/// found by the QP: a data WRITE to it, and a probe from a rank waiting for it, end with
/// `IBV_WC_RETRY_EXC_ERR`, reported as the peer's death.
#[test]
fn a_dead_peer_is_found_by_the_qp() {
    // 4.096 us * 2^10 = 4 ms ACK timeout, one retry.
    let (mut a, b) = pair(2, env(10, 1));
    b.ch().hca.dev.close();
    let e = a.c.recv[0].wait(T).unwrap_err();
    assert!(
        matches!(e, TransportError::PeerDied { peer: 1, .. }),
        "a probe finds it: {e}"
    );
    let (mut a, b) = pair(2, env(10, 1));
    b.ch().hca.dev.close();
    a.c.send[0].wait_slot(T).unwrap();
    a.c.send[0].post(0, 0, &desc()).unwrap();
    let e = a.c.send[0].drain(T).unwrap_err();
    assert!(
        matches!(e, TransportError::PeerDied { peer: 1, .. }),
        "the write finds it: {e}"
    );
    assert!(e.to_string().contains("peer rank 1"), "{e}");
    drop(b);
}

/// The wait and pipelining counters (`COLL_ROCE_STATS=1`) count what happened: posts and the
/// steps in flight at each, a sender blocked by the slot window (not the HCA's), waits for data.
#[test]
fn wait_counters_name_what_blocked() {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut a, mut b) = pair(2, env(14, 7));
    let t = Duration::from_millis(30);
    for k in 0..2u8 {
        let slot = a.c.send[0].wait_slot(t).unwrap();
        slot[0] = k;
        a.c.send[0].post(1, k as u16, &desc()).unwrap();
    }
    let sa = &a.ch().hca.stats;
    assert_eq!(sa.posts.load(Relaxed), 2);
    assert_eq!(
        sa.inflight_max.load(Relaxed),
        2,
        "two steps posted, none credited"
    );
    assert_eq!(sa.inflight_sum.load(Relaxed), 1 + 2);
    assert_eq!(sa.blocked_credit.load(Relaxed), 0);
    // No credit for the third step: the wait counts one credit block, and it slept.
    assert!(a.c.send[0].wait_slot(t).is_err());
    assert_eq!(sa.blocked_credit.load(Relaxed), 1);
    assert_eq!(sa.blocked_ack.load(Relaxed), 0);
    assert_eq!(sa.credit.waits.load(Relaxed), 3);
    assert_eq!(sa.credit.slept.load(Relaxed), 1);
    assert!(sa.credit.sleeps.load(Relaxed) >= 1);
    for _ in 0..2u8 {
        b.c.recv[0].wait(T).unwrap();
        b.c.recv[0].release().unwrap();
    }
    let sb = &b.ch().hca.stats;
    assert_eq!(sb.data.waits.load(Relaxed), 2);
    assert_eq!(sb.posts.load(Relaxed), 0, "credits are not data posts");
    // The credits arrive: the held step can go.
    a.c.send[0].wait_slot(T).unwrap();
    a.c.send[0].post(1, 2, &desc()).unwrap();
    assert_eq!(sa.posts.load(Relaxed), 3);
    let text = sa.to_string();
    assert!(
        text.contains("blocked_credit: 1") && text.contains("posts: 3"),
        "{text}"
    );
}

/// The last credit of a rank leaves before its connectors are gone: the receiver consumes the
/// last step and releases it (the credit is deferred to the rank's next post or poll, and there
/// is none), then drops its connectors while its device stays open; the sender's final drain
/// gets that credit, not the abort that follows it (`Channel::settle` waits for both to be
/// acknowledged). In one process the abort's own post sends the credit too, so this passes
/// without the settle as well; what the settle fixed shows only with processes that exit
/// (`tests/coll_perf.rs` under load: 8 failures in 34 runs before, 0 in 16 after).
#[test]
fn the_last_deferred_credit_leaves_with_the_channel() {
    let (mut a, mut b) = pair(2, env(14, 7));
    a.c.send[0].wait_slot(T).unwrap();
    a.c.send[0].post(3, 0, &desc()).unwrap();
    let c = b.c.recv[0].wait(T).unwrap();
    assert_eq!(c.imm.step, 0);
    b.c.recv[0].release().unwrap();
    let Side {
        t: _device_kept_open,
        c,
    } = b;
    drop(c);
    let e = a.c.send[0].drain(T);
    assert!(e.is_ok(), "the credit was lost: {e:?}");
}
