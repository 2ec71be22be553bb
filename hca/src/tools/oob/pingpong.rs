//! The TCP exchange of rdma-core's pingpong examples: `ibv_rc_pingpong`, `ibv_uc_pingpong`,
//! `ibv_ud_pingpong` (and `ibv_srq_pingpong`, which sends one message per QP).
//!
//! Source: rdma-core `libibverbs/examples/rc_pingpong.c` (`pp_client_exch_dest`,
//! `pp_server_exch_dest`; identical in `uc_pingpong.c` and `ud_pingpong.c`) and
//! `libibverbs/examples/pingpong.c` (`gid_to_wire_gid`, `wire_gid_to_gid`), rdma-core v44 (Debian
//! bookworm's `ibverbs-utils` 44.0) through current master.
//!
//! # The message
//! `sprintf(msg, "%04x:%06x:%06x:%s", lid, qpn, psn, gid)`, sent as the whole 52-byte buffer
//! `char msg[sizeof "0000:000000:000000:00000000000000000000000000000000"]`: 51 characters and the
//! terminating NUL. On RoCE the LID is 0. The GID is 32 lowercase hex digits: `gid_to_wire_gid`
//! loads each 4-byte group as a host-order `uint32_t` and prints `htobe32` of it with `%08x`, which
//! on either byte order prints the GID's bytes in network order. So `::ffff:127.0.0.1` is
//! `00000000000000000000ffff7f000001` (verified by compiling the same formats with gcc on x86-64).
//! Without `-g`, the tools send the all-zero GID.
//!
//! # The order
//! 1. The client connects and writes its message.
//! 2. The server reads it, **brings its QP to RTR and RTS first** (`pp_connect_ctx`), then writes
//!    its own message.
//! 3. The client reads the server's message and writes `"done"` with its NUL (5 bytes).
//! 4. The server reads the `done` (it checks only that 5 bytes came) and both close; the client
//!    connects its QP after the exchange.
//!
//! No other TCP traffic follows: the tools' pingpong itself runs over RDMA only.
//!
//! # Bounds on what the peer sends
//! Nothing: each side reads exactly [`MSG_LEN`] bytes (then [`DONE`]'s 5) into a fixed buffer,
//! whatever the peer writes, and the message's fields are bounded by their widths (LID 16 bits,
//! QPN and PSN 24, GID 128). No value of it sizes an allocation, a memory lock or a wait: the
//! buffer size, receive depth and iterations are each side's own options (see the
//! [`oob`](super) module docs).

use std::net::SocketAddr;

use roce::Gid;

use super::{
    connect, parse_hex, printable, stderr_logger, FirstMessage, OobError, OobListener, OobLogger,
    OobStream, OobTimeouts,
};

/// Bytes of a pingpong address message: `"LLLL:QQQQQQ:PPPPPP:"` (19), the 32-digit GID, NUL.
pub const MSG_LEN: usize = 52;

/// The client's final message: `"done"` and its NUL, 5 bytes.
pub const DONE: &[u8; 5] = b"done\0";

const WHAT: &str = "pingpong address";

/// One side's address in a pingpong exchange (`struct pingpong_dest` of the examples).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PingpongDest {
    /// Local identifier, 16 bits (0 on RoCE).
    pub lid: u16,
    /// Queue pair number, 24 bits.
    pub qpn: u32,
    /// Initial packet sequence number, 24 bits (the tools pick `lrand48() & 0xffffff`).
    pub psn: u32,
    /// The GID (all zero when the tool was not given `-g`).
    pub gid: Gid,
}

/// The 32 lowercase hex digits of a GID, bytes in network order (`gid_to_wire_gid`).
pub fn gid_to_wire(gid: &Gid) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in gid.as_bytes().iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    out
}

/// The GID of 32 hex digits (either case), bytes in network order (`wire_gid_to_gid`); `None`
/// unless `text` is exactly 32 hex digits.
pub fn wire_to_gid(text: &[u8]) -> Option<Gid> {
    if text.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        bytes[i] = parse_hex(pair, 2)? as u8;
    }
    Some(Gid::from_bytes(bytes))
}

impl PingpongDest {
    /// The 52-byte message (text and NUL).
    ///
    /// Errors: [`OobError::OutOfRange`] for a QPN or PSN above 24 bits (the C format would print
    /// more digits than the fixed-size message holds).
    pub fn encode(&self) -> Result<[u8; MSG_LEN], OobError> {
        for (field, value) in [("QPN", self.qpn), ("PSN", self.psn)] {
            if value > 0xff_ffff {
                return Err(OobError::OutOfRange {
                    what: WHAT,
                    field,
                    value: u64::from(value),
                    max: 0xff_ffff,
                });
            }
        }
        let text = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        let mut msg = [0u8; MSG_LEN];
        msg[..19].copy_from_slice(text.as_bytes());
        msg[19..51].copy_from_slice(&gid_to_wire(&self.gid));
        Ok(msg)
    }

    /// Parses a message: up to the first NUL, `LID:QPN:PSN:GID` with LID at most 4 hex digits,
    /// QPN and PSN at most 6, and a GID of exactly 32 (what `sscanf("%x:%x:%x:%s")` and
    /// `wire_gid_to_gid` accept from a well-behaved peer).
    ///
    /// Errors: [`OobError::Malformed`] (without a peer) saying which part is wrong.
    pub fn decode(msg: &[u8]) -> Result<PingpongDest, OobError> {
        let bad = |reason| OobError::Malformed {
            peer: None,
            what: WHAT,
            reason,
            text: printable(msg),
        };
        let end = msg
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("no terminating NUL"))?;
        let mut fields = msg[..end].split(|&b| b == b':');
        let mut next = |name| fields.next().ok_or_else(|| bad(name));
        let lid = next("missing LID")?;
        let qpn = next("missing QPN")?;
        let psn = next("missing PSN")?;
        let gid = next("missing GID")?;
        if fields.next().is_some() {
            return Err(bad("more than four fields"));
        }
        Ok(PingpongDest {
            lid: parse_hex(lid, 4).ok_or_else(|| bad("LID is not 1-4 hex digits"))? as u16,
            qpn: parse_hex(qpn, 6).ok_or_else(|| bad("QPN is not 1-6 hex digits"))? as u32,
            psn: parse_hex(psn, 6).ok_or_else(|| bad("PSN is not 1-6 hex digits"))? as u32,
            gid: wire_to_gid(gid).ok_or_else(|| bad("GID is not 32 hex digits"))?,
        })
    }
}

/// The client side (`pp_client_exch_dest`): connects to `host:port` (retrying until
/// `timeouts.connect`), sends `local`, reads the server's address, sends [`DONE`] and closes.
/// Connect the QP to the returned address afterwards.
///
/// Errors: [`OobError::Resolve`], [`OobError::Connect`], [`OobError::OutOfRange`] (bad `local`,
/// checked before connecting), [`OobError::Write`] / [`OobError::Read`] / [`OobError::Timeout`] /
/// [`OobError::Closed`], [`OobError::Malformed`] for the server's message.
pub fn client_exchange(
    host: &str,
    port: u16,
    local: &PingpongDest,
    timeouts: &OobTimeouts,
) -> Result<PingpongDest, OobError> {
    let msg = local.encode()?;
    let stream = connect(host, port, timeouts)?;
    let mut s = OobStream::new(stream, timeouts.io)?;
    s.write_msg(WHAT, &msg)?;
    let mut reply = [0u8; MSG_LEN];
    s.read_msg(WHAT, &mut reply)?;
    let remote = PingpongDest::decode(&reply).map_err(|e| e.with_peer(s.peer))?;
    s.write_msg("done message", DONE)?;
    s.finish(std::time::Duration::from_millis(200));
    Ok(remote)
}

/// The server side (`pp_server_exch_dest`): listens until one client sends a valid address.
pub struct PingpongServer {
    listener: OobListener,
    timeouts: OobTimeouts,
    log: OobLogger,
}

impl std::fmt::Debug for PingpongServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PingpongServer")
            .field("listener", &self.listener)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// The check of a client's first message: a well-formed address ([`PingpongDest::decode`]).
fn check_address(msg: &[u8]) -> Result<PingpongDest, String> {
    PingpongDest::decode(msg).map_err(|e| e.to_string())
}

impl PingpongServer {
    /// Listens on `addr` (`0.0.0.0:18515` or `[::]:18515` as the tools do; port 0 picks one).
    ///
    /// Errors: [`OobError::Listen`] (port in use, address not local).
    pub fn bind(addr: SocketAddr, timeouts: OobTimeouts) -> Result<PingpongServer, OobError> {
        PingpongServer::new(OobListener::bind(addr)?, timeouts)
    }

    /// Listens on `port` of every local address, IPv4 and IPv6 alike: `[::]` with
    /// `IPV6_V6ONLY` off, or `0.0.0.0` on a host without IPv6 (port 0 picks one).
    ///
    /// Errors: [`OobError::Listen`], for `[::]:PORT` when the port is in use.
    pub fn bind_any(port: u16, timeouts: OobTimeouts) -> Result<PingpongServer, OobError> {
        PingpongServer::new(OobListener::bind_any(port)?, timeouts)
    }

    fn new(listener: OobListener, timeouts: OobTimeouts) -> Result<PingpongServer, OobError> {
        let log = stderr_logger(format!("pingpong server {}", listener.local_addr()));
        Ok(PingpongServer {
            listener,
            timeouts,
            log,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Where refused connections are logged (default: stderr, each line prefixed with
    /// `pingpong server ADDRESS: `).
    pub fn set_log(&mut self, log: OobLogger) {
        self.log = log;
    }

    /// Waits (up to `timeouts.accept`) for the client and reads its address: serves every
    /// connection concurrently until one sends a well-formed address (its first and only
    /// message before the reply), and takes that one; every other connection is closed with one
    /// log line naming its address and the reason (rules and bounds in the
    /// [`oob`](super#who-is-the-client) module docs). Bring the QP to RTR and RTS with
    /// [`PendingReply::remote`], then [`PendingReply::reply`].
    ///
    /// Errors: [`OobError::AcceptTimeout`] (no valid client in time), [`OobError::Accept`].
    pub fn accept(&self) -> Result<PendingReply, OobError> {
        let first = FirstMessage {
            what: WHAT,
            len: MSG_LEN,
            check: &check_address,
        };
        let a = self
            .listener
            .accept_client(&self.timeouts, &first, &self.log)?;
        let stream = OobStream::new(a.stream, self.timeouts.io)?;
        Ok(PendingReply {
            stream,
            remote: a.value,
        })
    }
}

/// A client whose address has been read and who waits for the server's.
#[derive(Debug)]
pub struct PendingReply {
    stream: OobStream,
    remote: PingpongDest,
}

impl PendingReply {
    /// The client's address.
    pub fn remote(&self) -> &PingpongDest {
        &self.remote
    }

    /// The client's TCP address.
    pub fn peer(&self) -> SocketAddr {
        self.stream.peer
    }

    /// This side's address of the TCP connection: the local address the client reached, which
    /// a server without a configured device address can use as its GID.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.stream.stream.local_addr().ok()
    }

    /// Sends `local` and waits for the client's [`DONE`].
    ///
    /// Errors: [`OobError::OutOfRange`] (bad `local`; nothing sent), write and read errors,
    /// [`OobError::Malformed`] if the 5 bytes are not `"done\0"`.
    pub fn reply(mut self, local: &PingpongDest) -> Result<(), OobError> {
        let msg = local.encode()?;
        self.stream.write_msg(WHAT, &msg)?;
        let mut done = [0u8; DONE.len()];
        self.stream.read_msg("done message", &mut done)?;
        if &done != DONE {
            return Err(OobError::Malformed {
                peer: Some(self.stream.peer),
                what: "done message",
                reason: "expected \"done\" and a NUL",
                text: printable(&done),
            });
        }
        self.stream.finish(std::time::Duration::from_millis(200));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    fn mapped(ip: Ipv4Addr) -> Gid {
        let mut b = [0u8; 16];
        b[10] = 0xff;
        b[11] = 0xff;
        b[12..].copy_from_slice(&ip.octets());
        Gid::from_bytes(b)
    }

    /// Goldens printed by gcc with the tools' format and `gid_to_wire_gid` (x86-64).
    const GOLDEN_V4: &[u8; MSG_LEN] = b"0000:000011:3c2d1e:00000000000000000000ffff7f000001\0";
    const GOLDEN_V6: &[u8; MSG_LEN] = b"1234:abcdef:000001:fe80000000000000021122fffe334455\0";

    fn v6_dest() -> PingpongDest {
        PingpongDest {
            lid: 0x1234,
            qpn: 0xabcdef,
            psn: 1,
            gid: Gid::from_bytes([
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
            ]),
        }
    }

    #[test]
    fn golden_messages() {
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x3c2d1e,
            gid: mapped(Ipv4Addr::LOCALHOST),
        };
        assert_eq!(&d.encode().unwrap(), GOLDEN_V4);
        assert_eq!(PingpongDest::decode(GOLDEN_V4).unwrap(), d);
        assert_eq!(&v6_dest().encode().unwrap(), GOLDEN_V6);
        assert_eq!(PingpongDest::decode(GOLDEN_V6).unwrap(), v6_dest());
    }

    #[test]
    fn decode_accepts_what_sscanf_accepts_from_sane_peers() {
        // Upper case and short fields (sscanf %x does not care about width).
        let d = PingpongDest::decode(b"0:ABCDEF:1:FE80000000000000021122FFFE334455\0").unwrap();
        assert_eq!(
            d,
            PingpongDest {
                lid: 0,
                ..v6_dest()
            }
        );
        // Trailing bytes after the NUL are ignored.
        let mut m = *GOLDEN_V6;
        m[51] = 0;
        assert!(PingpongDest::decode(&m).is_ok());
    }

    #[test]
    fn decode_rejects_malformed() {
        for (msg, reason) in [
            (
                &b"0000:000011:3c2d1e:00000000000000000000ffff7f000001"[..],
                "NUL",
            ),
            (b"0000:000011:3c2d1e\0", "GID"),
            (
                b"0000:000011:3c2d1e:00000000000000000000ffff7f00000\0",
                "32 hex",
            ),
            (
                b"0000:000011:3c2d1e:00000000000000000000ffff7f0000011\0",
                "32 hex",
            ),
            (
                b"0000:0000111:3c2d1e:00000000000000000000ffff7f000001\0",
                "QPN",
            ),
            (
                b"00000:000011:3c2d1e:00000000000000000000ffff7f000001\0",
                "LID",
            ),
            (
                b"0000:000011:3c2d1x:00000000000000000000ffff7f000001\0",
                "PSN",
            ),
            (
                b"0000:000011:3c2d1e:00000000000000000000ffff7f000001:\0",
                "four",
            ),
            (b"\0", "missing QPN"),
            (b"", "NUL"),
        ] {
            let e = PingpongDest::decode(msg).unwrap_err();
            assert!(e.to_string().contains(reason), "{e} (wanted {reason})");
        }
    }

    #[test]
    fn encode_refuses_fields_that_overflow_the_format() {
        let d = PingpongDest {
            qpn: 0x100_0000,
            ..v6_dest()
        };
        let e = d.encode().unwrap_err();
        assert!(
            e.to_string().contains("QPN 0x1000000 is above 0xffffff"),
            "{e}"
        );
    }

    #[test]
    fn loopback_client_and_server() {
        let t = OobTimeouts {
            connect: Duration::from_secs(5),
            accept: Duration::from_secs(5),
            io: Duration::from_secs(5),
        };
        let server = PingpongServer::bind("127.0.0.1:0".parse().unwrap(), t).unwrap();
        let port = server.local_addr().port();
        let server_dest = v6_dest();
        let h = std::thread::spawn(move || {
            let pending = server.accept().unwrap();
            let client = *pending.remote();
            pending.reply(&server_dest).unwrap();
            client
        });
        let client_dest = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0x3c2d1e,
            gid: mapped(Ipv4Addr::LOCALHOST),
        };
        let got = client_exchange("127.0.0.1", port, &client_dest, &t).unwrap();
        assert_eq!(got, server_dest);
        assert_eq!(h.join().unwrap(), client_dest);
    }
}
