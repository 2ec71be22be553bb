//! The UDP link's drop hook (`hca::link::udp::DropHook`; from `ROCE_LINK_DROP_PPM` through
//! `hca::tools::fault`): the seeded loss that the conformance matrix's fault case
//! (`tests/guest/matrix.sh`) puts between this project's stack and Linux rxe. Drops on send and on
//! receive at the asked rate, the same datagrams for the same seed, counted, GSO and GRO off while
//! it is on; a malformed environment value is refused naming the variable; the socket link itself
//! never reads the environment. Loopback only (127.0.0.1, ports picked by the kernel); every wait
//! is bounded.
#![cfg(feature = "std")]

use std::collections::BTreeSet;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hca::link::udp::{DropDirections, DropHook, RoceSocket, RoceSocketConfig, SendDatagram};
use hca::tools::fault;

const N: u32 = 400;

/// No drops.
const NONE: DropHook = DropHook {
    ppm: 0,
    seed: 0,
    directions: DropDirections::Both,
};

fn link(drop: DropHook) -> RoceSocket {
    let mut c = RoceSocketConfig::new("127.0.0.1:0".parse().unwrap());
    c.drop = Some(drop);
    c.recv_buffer_bytes = Some(4 << 20);
    RoceSocket::bind(c).unwrap()
}

/// Sends datagrams 0 .. N (each carrying its number) from `a` to `b`, one at a time, and returns
/// the numbers `b` received.
fn run(a: &mut RoceSocket, b: &mut RoceSocket) -> BTreeSet<u32> {
    let dst: SocketAddr = b.local_addr();
    let mut batch = b.new_recv_batch();
    let mut got = BTreeSet::new();
    for i in 0..N {
        let bytes = i.to_be_bytes();
        let parts = [IoSlice::new(&bytes)];
        let deadline = Instant::now() + Duration::from_secs(3);
        while a.send(&[SendDatagram::new(dst, &parts)]).unwrap() == 0 {
            assert!(Instant::now() < deadline, "send stalled at {i}");
            a.wait(true, None, Duration::from_millis(20)).unwrap();
        }
        // Drain what arrived so far (the receiver's decisions follow arrival order).
        while b.recv(&mut batch).unwrap() > 0 {
            got.extend(
                batch
                    .iter()
                    .map(|d| u32::from_be_bytes(d.payload.try_into().unwrap())),
            );
        }
    }
    // Everything sent is on loopback by now; a last bounded drain.
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        if b.recv(&mut batch).unwrap() == 0 {
            b.wait(false, None, Duration::from_millis(20)).unwrap();
            continue;
        }
        got.extend(
            batch
                .iter()
                .map(|d| u32::from_be_bytes(d.payload.try_into().unwrap())),
        );
    }
    got
}

#[test]
fn drops_on_send_at_the_rate_and_reproducibly() {
    let hook = DropHook {
        ppm: 200_000,
        seed: 42,
        directions: DropDirections::Both,
    };
    let mut sets = Vec::new();
    for _ in 0..2 {
        let mut a = link(hook);
        let mut b = link(NONE);
        assert!(
            !a.offloads().gso && !a.offloads().gro,
            "GSO/GRO off with the hook"
        );
        let got = run(&mut a, &mut b);
        let dropped = u64::from(N) - got.len() as u64;
        assert_eq!(
            a.counters().tx_hook_drops,
            dropped,
            "every missing one counted"
        );
        assert_eq!(a.counters().tx_datagrams, got.len() as u64);
        // 20% of 400 = 80; a seeded draw stays well inside 40 ..= 120.
        assert!((40..=120).contains(&dropped), "dropped {dropped} of {N}");
        sets.push(got);
    }
    assert_eq!(sets[0], sets[1], "the same seed drops the same datagrams");
    let mut a = link(DropHook {
        ppm: 200_000,
        seed: 43,
        directions: DropDirections::Both,
    });
    let mut b = link(NONE);
    assert_ne!(
        run(&mut a, &mut b),
        sets[0],
        "another seed, other datagrams"
    );
}

#[test]
fn drops_on_receive_and_counts() {
    let mut a = link(NONE);
    let mut b = link(DropHook {
        ppm: 500_000,
        seed: 9,
        directions: DropDirections::Both,
    });
    let got = run(&mut a, &mut b);
    let c = *b.counters();
    assert_eq!(c.rx_hook_drops + c.rx_datagrams, u64::from(N));
    assert_eq!(c.rx_datagrams, got.len() as u64);
    assert!((120..=280).contains(&c.rx_hook_drops), "{c:?}");
}

#[test]
fn no_hook_drops_nothing_and_all_drops_everything() {
    let mut a = link(NONE);
    let mut b = link(NONE);
    assert_eq!(run(&mut a, &mut b).len(), N as usize);
    assert_eq!(a.counters().tx_hook_drops + b.counters().rx_hook_drops, 0);
    let mut a = link(DropHook {
        ppm: 1_000_000,
        seed: 1,
        directions: DropDirections::Both,
    });
    let mut b = link(NONE);
    assert!(run(&mut a, &mut b).is_empty());
    assert_eq!(a.counters().tx_hook_drops, u64::from(N));
}

#[test]
fn environment_sets_the_hook_and_bad_values_are_refused() {
    // The only test in this binary that touches the environment (the tools read it through
    // `fault::drop_hook_from_env`; the socket link never does).
    let bind = |drop| {
        let mut c = RoceSocketConfig::new("127.0.0.1:0".parse().unwrap());
        c.drop = drop;
        RoceSocket::bind(c)
    };
    std::env::set_var(fault::PPM_VAR, "1000000");
    std::env::set_var(fault::SEED_VAR, "3");
    assert_eq!(
        fault::drop_hook_from_env(),
        Ok(Some(DropHook {
            ppm: 1_000_000,
            seed: 3,
            directions: DropDirections::Both,
        }))
    );
    let l = bind(fault::drop_hook_from_env().unwrap()).unwrap();
    assert!(!l.offloads().gro, "the environment's hook is on");
    // The socket link does not read the environment: without a hook nothing is dropped.
    let (mut a, mut b) = (bind(None).unwrap(), bind(None).unwrap());
    assert_eq!(
        run(&mut a, &mut b).len(),
        N as usize,
        "no hook given: the environment's rate is not applied by the link"
    );
    std::env::set_var(fault::PPM_VAR, "lots");
    match fault::drop_hook_from_env() {
        Err(reason) => assert!(reason.contains("ROCE_LINK_DROP_PPM")),
        other => panic!("expected a refusal naming the variable, got {other:?}"),
    }
    std::env::set_var(fault::PPM_VAR, "1000001");
    assert!(fault::drop_hook_from_env().is_err());
    // An explicit hook wins over the environment; rate 0 is no hook.
    assert!(bind(Some(DropHook {
        ppm: 1,
        seed: 1,
        directions: DropDirections::Both,
    }))
    .is_ok());
    std::env::set_var(fault::PPM_VAR, "1000000");
    let (mut a, mut b) = (link(NONE), link(NONE));
    assert_eq!(
        run(&mut a, &mut b).len(),
        N as usize,
        "rate 0 given: no drops"
    );
    for (value, directions) in [
        ("send", Some(DropDirections::Send)),
        (" receive ", Some(DropDirections::Receive)),
        ("both", Some(DropDirections::Both)),
        ("sideways", None),
    ] {
        std::env::set_var(fault::DIRECTIONS_VAR, value);
        match (fault::drop_hook_from_env(), directions) {
            (Ok(Some(h)), Some(d)) => assert_eq!(h.directions, d, "{value}"),
            (Err(e), None) => assert!(e.contains("ROCE_LINK_DROP_DIRECTIONS"), "{e}"),
            other => panic!("{value}: {other:?}"),
        }
    }
    std::env::remove_var(fault::DIRECTIONS_VAR);
    std::env::set_var(fault::PPM_VAR, "0");
    assert_eq!(fault::drop_hook_from_env(), Ok(None));
    std::env::remove_var(fault::PPM_VAR);
    std::env::remove_var(fault::SEED_VAR);
}

/// A hook for one direction drops only there: every datagram with a send-only hook on the
/// sender, none with a receive-only one; the receiver's receive-only hook drops them all.
#[test]
fn directions_limit_what_is_dropped() {
    let all = |directions| DropHook {
        ppm: 1_000_000,
        seed: 1,
        directions,
    };
    let mut a = link(all(DropDirections::Send));
    let mut b = link(NONE);
    assert!(run(&mut a, &mut b).is_empty());
    assert_eq!(a.counters().tx_hook_drops, u64::from(N));
    let mut a = link(all(DropDirections::Receive));
    let mut b = link(all(DropDirections::Send));
    assert_eq!(run(&mut a, &mut b).len(), N as usize, "sent, and received");
    assert_eq!(a.counters().tx_hook_drops + b.counters().rx_hook_drops, 0);
    let mut a = link(NONE);
    let mut b = link(all(DropDirections::Receive));
    assert!(run(&mut a, &mut b).is_empty());
    assert_eq!(b.counters().rx_hook_drops, u64::from(N));
}
