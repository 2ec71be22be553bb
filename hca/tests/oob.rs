//! The out-of-band exchanges against scripted peers that behave like the C tools: every message
//! is read with a single read(2) that must return exactly the message's size (as
//! `pp_*_exch_dest` in rdma-core's pingpong examples and `ethernet_read_keys` /
//! `ethernet_read_data` in perftest do), and every expected byte is checked against the formats
//! of those sources. Unlike the unit tests (our client against our server), a mistake made the
//! same way on both sides shows up here.
#![cfg(feature = "std")]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use hca::tools::oob::perftest::{
    BwReport, KeyFormat, PerftestConn, PerftestDest, PerftestListener, PerftestTest, VERSION,
};
use hca::tools::oob::pingpong::{self, PingpongDest, PingpongServer};
use hca::tools::oob::{OobError, OobTimeouts};
use roce::{Gid, PathMtu};

fn timeouts() -> OobTimeouts {
    OobTimeouts {
        connect: Duration::from_secs(5),
        accept: Duration::from_secs(5),
        io: Duration::from_secs(5),
    }
}

fn mapped(ip: Ipv4Addr) -> Gid {
    let mut b = [0u8; 16];
    b[10] = 0xff;
    b[11] = 0xff;
    b[12..].copy_from_slice(&ip.octets());
    Gid::from_bytes(b)
}

/// A peer that reads like the C tools: one read(2) per message, which must return it whole.
struct CPeer {
    s: TcpStream,
}

impl CPeer {
    fn new(s: TcpStream) -> CPeer {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        CPeer { s }
    }

    /// `read(fd, buf, n) != n` is an error in the tools.
    fn read(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n + 64];
        let got = self.s.read(&mut buf[..n]).unwrap();
        assert_eq!(
            got, n,
            "a single read(2) must return the whole {n}-byte message"
        );
        buf.truncate(n);
        buf
    }

    fn write(&mut self, bytes: &[u8]) {
        assert_eq!(self.s.write(bytes).unwrap(), bytes.len());
    }
}

fn key(d: &PerftestDest) -> Vec<u8> {
    d.encode(KeyFormat::WithGid).unwrap()
}

fn version_msg(v: &str) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..v.len()].copy_from_slice(v.as_bytes());
    m
}

/// Our client against a C-like `ib_write_bw` server (1 QP): preamble, the hand-shakes before and
/// after connecting, the end-of-test hand-shake, the bandwidth report and `ctx_close_connection`.
#[test]
fn perftest_client_against_c_like_write_bw_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ours = PerftestDest {
        lid: 0,
        out_reads: 16,
        qpn: 0x11,
        psn: 0x123456,
        rkey: 0x1234,
        vaddr: 0x7f12_3456_7000,
        gid: mapped(Ipv4Addr::new(127, 0, 0, 1)),
        srqn: 0,
    };
    let theirs = PerftestDest {
        qpn: 0x2a,
        psn: 0xabcdef,
        rkey: 0x99,
        vaddr: 0x5555_0000_0000,
        gid: mapped(Ipv4Addr::new(127, 0, 0, 2)),
        ..ours
    };
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut p = CPeer::new(s);
        // exchange_versions: server reads then writes (16 bytes each).
        assert_eq!(p.read(16), version_msg("6.06"));
        p.write(&version_msg("6.06"));
        // check_sys_data: cycle_buffer then cache_line_size, 4-byte big-endian ints.
        assert_eq!(p.read(4), 4096i32.to_be_bytes());
        p.write(&16384i32.to_be_bytes());
        assert_eq!(p.read(4), 64i32.to_be_bytes());
        p.write(&64i32.to_be_bytes());
        // check_mtu: "%d" of enum ibv_mtu, 2 bytes.
        assert_eq!(p.read(2), b"5\0");
        p.write(b"3\0");
        // One hand-shake per QP before ctx_connect, one per QP after, one more (QP 0), one at the
        // end of the test: 4 x 108 bytes each way.
        for _ in 0..4 {
            assert_eq!(p.read(108), key(&ours));
            p.write(&key(&theirs));
        }
        // xchg_bw_reports: size, iters (8-byte big-endian), 3 big-endian doubles.
        let mut fields = Vec::new();
        for _ in 0..5 {
            fields.push(p.read(8));
            p.write(&[0u8; 8]);
        }
        // ctx_close_connection: a hand-shake, then "done\0".
        assert_eq!(p.read(108), key(&ours));
        p.write(&key(&theirs));
        p.write(b"done\0");
        assert_eq!(p.read(5), b"done\0");
        fields
    });
    let mut c = PerftestConn::connect("127.0.0.1", port, KeyFormat::WithGid, &timeouts()).unwrap();
    let pre = c.preamble(4096, 64, PathMtu::Mtu4096).unwrap();
    assert_eq!(
        (pre.remote_version.as_str(), pre.cycle_buffer, pre.mtu),
        (VERSION, 16384, PathMtu::Mtu1024)
    );
    assert_eq!(
        c.exchange_dests(PerftestTest::WriteBw, &[ours]).unwrap(),
        [theirs]
    );
    assert_eq!(
        c.sync_after_connect(PerftestTest::WriteBw, &[ours])
            .unwrap(),
        [theirs]
    );
    assert_eq!(c.hand_shake(&ours).unwrap(), theirs);
    let rep = BwReport {
        size: 65536,
        iters: 5000,
        bw_peak: 11.25,
        bw_avg: 10.5,
        msg_rate_avg: 0.168,
        ..BwReport::default()
    };
    c.exchange_bw_report(&rep, false).unwrap();
    c.close(&ours).unwrap();
    let fields = server.join().unwrap();
    assert_eq!(fields[0], 65536u64.to_be_bytes());
    assert_eq!(fields[1], 5000u64.to_be_bytes());
    // perftest's hton_double is a byte swap of the IEEE bits on little-endian hosts: 11.25 is
    // 0x4026800000000000, sent as 40 26 80 00 00 00 00 00 (printed by gcc on x86-64).
    assert_eq!(fields[2], [0x40, 0x26, 0x80, 0, 0, 0, 0, 0]);
    assert_eq!(fields[3], 10.5f64.to_bits().to_be_bytes());
}

/// Our server against a C-like `ib_read_lat` client (2 QPs): the latency tests' extra first
/// hand-shake, and the server closing right after the post-RTR hand-shake.
#[test]
fn perftest_server_against_c_like_read_lat_client() {
    let l = PerftestListener::bind("127.0.0.1:0".parse().unwrap(), timeouts()).unwrap();
    let port = l.local_addr().port();
    let mine = [
        PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 0x100,
            psn: 7,
            rkey: 1,
            vaddr: 0x1000,
            gid: mapped(Ipv4Addr::LOCALHOST),
            srqn: 0,
        },
        PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 0x101,
            psn: 8,
            rkey: 2,
            vaddr: 0x2000,
            gid: mapped(Ipv4Addr::LOCALHOST),
            srqn: 0,
        },
    ];
    let client_dests = [
        PerftestDest {
            qpn: 0x200,
            ..mine[0]
        },
        PerftestDest {
            qpn: 0x201,
            ..mine[1]
        },
    ];
    let cd = client_dests;
    let client = thread::spawn(move || {
        let mut p = CPeer::new(TcpStream::connect(("127.0.0.1", port)).unwrap());
        p.write(&version_msg("6.06"));
        assert_eq!(p.read(16), version_msg(VERSION));
        p.write(&4096i32.to_be_bytes());
        assert_eq!(p.read(4), 4096i32.to_be_bytes());
        p.write(&64i32.to_be_bytes());
        assert_eq!(p.read(4), 64i32.to_be_bytes());
        p.write(b"4\0");
        assert_eq!(p.read(2), b"4\0");
        // Latency tests: one extra hand-shake (QP 0), then one per QP; after connect one per QP
        // and one more (QP 0); then ctx_close_connection after the test: hand-shake + done.
        let order = [0usize, 0, 1, 0, 1, 0, 0];
        for &q in &order {
            p.write(&key(&cd[q]));
            assert_eq!(p.read(108), key(&mine[q]));
        }
        p.write(b"done\0");
        assert_eq!(p.read(5), b"done\0");
    });
    let mut c = l.accept(KeyFormat::WithGid).unwrap();
    let pre = c.preamble(4096, 64, PathMtu::Mtu2048).unwrap();
    assert_eq!(pre.mtu, PathMtu::Mtu2048);
    assert_eq!(
        c.exchange_dests(PerftestTest::ReadLat, &mine).unwrap(),
        client_dests
    );
    assert_eq!(
        c.sync_after_connect(PerftestTest::ReadLat, &mine).unwrap(),
        client_dests
    );
    c.close(&mine[0]).unwrap();
    client.join().unwrap();
}

/// A peer that sends garbage instead of a pingpong_dest gets a one-line error naming it.
#[test]
fn perftest_malformed_hand_shake_is_a_clear_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut p = CPeer::new(s);
        p.read(108);
        let mut junk = [b'z'; 108];
        junk[107] = 0;
        p.write(&junk);
    });
    let mut c = PerftestConn::connect("127.0.0.1", port, KeyFormat::WithGid, &timeouts()).unwrap();
    let d = PerftestDest {
        lid: 0,
        out_reads: 0,
        qpn: 1,
        psn: 1,
        rkey: 1,
        vaddr: 1,
        gid: Gid::from_bytes([0; 16]),
        srqn: 0,
    };
    let e = c.hand_shake(&d).unwrap_err();
    assert!(
        matches!(e, OobError::Malformed { peer: Some(_), .. }),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with("malformed perftest pingpong_dest from 127.0.0.1:"),
        "{text}"
    );
    assert!(!text.contains('\n'));
    server.join().unwrap();
}

/// Our pingpong client against a C-like `ibv_rc_pingpong` server, and our server against a C-like
/// client: 52-byte messages, the client's "done".
#[test]
fn pingpong_both_roles_against_c_like_peers() {
    let ours = PingpongDest {
        lid: 0,
        qpn: 0x11,
        psn: 0x3c2d1e,
        gid: mapped(Ipv4Addr::LOCALHOST),
    };
    let theirs = PingpongDest {
        lid: 0,
        qpn: 0x22,
        psn: 0x000abc,
        gid: mapped(Ipv4Addr::new(127, 0, 0, 2)),
    };
    // Our client, their server.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut p = CPeer::new(s);
        assert_eq!(
            &p.read(52)[..],
            b"0000:000011:3c2d1e:00000000000000000000ffff7f000001\0"
        );
        p.write(b"0000:000022:000abc:00000000000000000000ffff7f000002\0");
        // The server reads up to sizeof msg and wants exactly sizeof "done".
        let mut buf = [0u8; 52];
        assert_eq!(p.s.read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"done\0");
    });
    let got = pingpong::client_exchange("127.0.0.1", port, &ours, &timeouts()).unwrap();
    assert_eq!(got, theirs);
    server.join().unwrap();

    // Our server, their client.
    let srv = PingpongServer::bind("127.0.0.1:0".parse().unwrap(), timeouts()).unwrap();
    let port = srv.local_addr().port();
    let client = thread::spawn(move || {
        let mut p = CPeer::new(TcpStream::connect(("127.0.0.1", port)).unwrap());
        p.write(b"0000:000022:000abc:00000000000000000000ffff7f000002\0");
        let reply = p.read(52);
        p.write(b"done\0");
        reply
    });
    let pending = srv.accept().unwrap();
    assert_eq!(*pending.remote(), theirs);
    pending.reply(&ours).unwrap();
    assert_eq!(
        &client.join().unwrap()[..],
        b"0000:000011:3c2d1e:00000000000000000000ffff7f000001\0"
    );
}

/// A client that connects and never sends is refused when its first-message deadline (the I/O
/// timeout, 200 ms here) passes, in one log line naming it; the server then waits on for a valid
/// client until its accept timeout and says how many it refused.
#[test]
fn pingpong_server_refuses_a_silent_client() {
    let t = OobTimeouts {
        io: Duration::from_millis(200),
        accept: Duration::from_secs(1),
        ..timeouts()
    };
    let mut srv = PingpongServer::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let keep = lines.clone();
    srv.set_log(std::sync::Arc::new(move |l: &str| {
        keep.lock().unwrap().push(l.to_owned())
    }));
    let port = srv.local_addr().port();
    let hold = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let e = srv.accept().unwrap_err();
    assert!(
        matches!(e, OobError::AcceptTimeout { refused: 1, .. }),
        "{e}"
    );
    assert_eq!(
        *lines.lock().unwrap(),
        [format!(
            "refused the connection from {}: sent 0 of the 52 bytes of its pingpong address \
             within 0.2 s",
            hold.local_addr().unwrap()
        )]
    );
    drop(hold);
}
