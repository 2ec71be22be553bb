//! Errors of the socket link ([`super::udp`]) and its waker ([`super::wake`]).

use std::fmt;
use std::io;
use std::net::SocketAddr;

/// A failed operation of a [`RoceSocket`](super::udp::RoceSocket) or a [`Waker`](super::wake::Waker):
/// one variant per operation, naming the link's local address (and the destination, for a send)
/// and keeping the OS error (`errno` and its text) as the source.
///
/// The usual causes of [`LinkError::Bind`] are `EADDRINUSE` (another device or program holds that
/// address and port: [`io::ErrorKind::AddrInUse`]) and `EADDRNOTAVAIL` (no interface of this host
/// has the address: [`io::ErrorKind::AddrNotAvailable`]); see ip(7) and ipv6(7).
#[derive(Debug)]
pub enum LinkError {
    /// The [`RoceSocketConfig`](super::udp::RoceSocketConfig) is unusable (unspecified address, batch
    /// size 0 or above the limit, ...); nothing was opened.
    Config {
        /// The local address asked for.
        local: SocketAddr,
        /// What is wrong.
        reason: &'static str,
    },
    /// socket(2) failed.
    Socket {
        /// The local address the socket was for.
        local: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// setsockopt(2) / getsockopt(2) of a required option failed.
    SetOption {
        /// The link's local address.
        local: SocketAddr,
        /// The option, as named in udp(7) / ip(7) / ipv6(7) / socket(7).
        option: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// bind(2) to the local address failed.
    Bind {
        /// The address.
        local: SocketAddr,
        /// The OS error (`AddrInUse`, `AddrNotAvailable`, `PermissionDenied` for ports below
        /// 1024 without `CAP_NET_BIND_SERVICE`...).
        source: io::Error,
    },
    /// recvmmsg(2) failed (other than "nothing to receive").
    Recv {
        /// The link's local address.
        local: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// sendmmsg(2) refused datagram `index` of the slice passed to
    /// [`RoceSocket::send`](super::udp::RoceSocket::send): the datagrams before it were sent, it was
    /// not (and will not be: the error is not transient), the ones after it were not tried.
    Send {
        /// The link's local address.
        local: SocketAddr,
        /// The datagram's destination.
        dst: SocketAddr,
        /// Index of the refused datagram in the slice passed to `send`.
        index: usize,
        /// The OS error (`EMSGSIZE` for a datagram above the path MTU with Don't Fragment,
        /// `ENETUNREACH`, `EACCES`, ...).
        source: io::Error,
    },
    /// Datagram `index` of the slice passed to [`RoceSocket::send`](super::udp::RoceSocket::send) is
    /// malformed and was not sent (the datagrams before it were).
    InvalidDatagram {
        /// The link's local address.
        local: SocketAddr,
        /// The datagram's destination.
        dst: SocketAddr,
        /// Index of the datagram in the slice passed to `send`.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// poll(2) failed.
    Poll {
        /// The link's local address.
        local: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// An eventfd(2) operation of a [`Waker`](super::wake::Waker) failed.
    Waker {
        /// `"eventfd"`, `"write"`, `"read"` or `"poll"`.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl LinkError {
    /// The OS error behind this error, if there is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            LinkError::Config { .. } | LinkError::InvalidDatagram { .. } => None,
            LinkError::Socket { source, .. }
            | LinkError::SetOption { source, .. }
            | LinkError::Bind { source, .. }
            | LinkError::Recv { source, .. }
            | LinkError::Send { source, .. }
            | LinkError::Poll { source, .. }
            | LinkError::Waker { source, .. } => Some(source),
        }
    }
}

/// A hint for the common bind(2) failures.
fn bind_hint(source: &io::Error) -> &'static str {
    match source.kind() {
        io::ErrorKind::AddrInUse => {
            " (another device or program already uses this address and port)"
        }
        io::ErrorKind::AddrNotAvailable => " (no interface of this host has this address)",
        io::ErrorKind::PermissionDenied => " (ports below 1024 need CAP_NET_BIND_SERVICE)",
        _ => "",
    }
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Config { local, reason } => {
                write!(f, "UDP link on {local}: invalid configuration: {reason}")
            }
            LinkError::Socket { local, source } => {
                write!(f, "UDP link on {local}: socket(2) failed: {source}")
            }
            LinkError::SetOption {
                local,
                option,
                source,
            } => write!(
                f,
                "UDP link on {local}: setsockopt({option}) failed: {source}"
            ),
            LinkError::Bind { local, source } => write!(
                f,
                "UDP link on {local}: bind(2) failed: {source}{}",
                bind_hint(source)
            ),
            LinkError::Recv { local, source } => {
                write!(f, "UDP link on {local}: recvmmsg(2) failed: {source}")
            }
            LinkError::Send {
                local,
                dst,
                index,
                source,
            } => write!(
                f,
                "UDP link on {local}: sendmmsg(2) of datagram {index} to {dst} failed: {source}"
            ),
            LinkError::InvalidDatagram {
                local,
                dst,
                index,
                reason,
            } => write!(
                f,
                "UDP link on {local}: datagram {index} to {dst} not sent: {reason}"
            ),
            LinkError::Poll { local, source } => {
                write!(f, "UDP link on {local}: poll(2) failed: {source}")
            }
            LinkError::Waker { op, source } => write!(f, "link waker: {op} failed: {source}"),
        }
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.io_error()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_address_call_and_errno_text() {
        let e = LinkError::Bind {
            local: "127.0.0.2:4791".parse().unwrap(),
            source: io::Error::from_raw_os_error(libc::EADDRINUSE),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("UDP link on 127.0.0.2:4791: bind(2) failed: "),
            "{s}"
        );
        assert!(
            s.contains("os error 98") && s.contains("already uses"),
            "{s}"
        );
        assert_eq!(e.io_error().unwrap().kind(), io::ErrorKind::AddrInUse);
        let e = LinkError::Send {
            local: "[::1]:4791".parse().unwrap(),
            dst: "[::1]:9".parse().unwrap(),
            index: 3,
            source: io::Error::from_raw_os_error(libc::EMSGSIZE),
        };
        assert!(e.to_string().contains("datagram 3 to [::1]:9"));
        assert!(std::error::Error::source(&e).is_some());
    }
}
