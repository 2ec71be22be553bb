//! Socket control messages (`struct cmsghdr`, cmsg(3)) built and parsed as plain bytes.
//!
//! A control buffer is a sequence of messages, each a header (`cmsg_len: size_t`, `cmsg_level:
//! int`, `cmsg_type: int`) followed by its data, every message starting at a multiple of
//! `sizeof(size_t)` (glibc's `CMSG_ALIGN`). `cmsg_len` counts the header and the data, not the
//! trailing padding (`CMSG_LEN`); a message takes `CMSG_SPACE` bytes of the buffer. Doing this with
//! byte slices instead of the `CMSG_*` macros keeps the link free of pointer arithmetic: the kernel
//! copies the buffer in and out, so its alignment in memory does not matter to it.

use core::mem::size_of;

/// Alignment of control messages: `sizeof(size_t)`.
const ALIGN: usize = size_of::<usize>();

/// `CMSG_ALIGN(len)`: `len` rounded up to a multiple of `sizeof(size_t)`.
pub(crate) const fn align(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// Bytes of a `struct cmsghdr` (16 on 64-bit Linux).
const HDR: usize = size_of::<libc::cmsghdr>();

/// `CMSG_LEN(data_len)`: the `cmsg_len` of a message with `data_len` data bytes.
pub(crate) const fn len(data_len: usize) -> usize {
    align(HDR) + data_len
}

/// `CMSG_SPACE(data_len)`: bytes of buffer a message with `data_len` data bytes occupies.
pub(crate) const fn space(data_len: usize) -> usize {
    align(HDR) + align(data_len)
}

/// Appends control messages to a byte buffer.
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub(crate) fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, len: 0 }
    }

    /// Bytes written so far (the `msg_controllen` to pass).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends a message with `data`; `false` (and nothing written) when it does not fit.
    pub(crate) fn push(&mut self, level: libc::c_int, ty: libc::c_int, data: &[u8]) -> bool {
        let need = space(data.len());
        let Some(msg) = self.buf.get_mut(self.len..self.len + need) else {
            return false;
        };
        msg.fill(0);
        msg[..ALIGN].copy_from_slice(&len(data.len()).to_ne_bytes());
        msg[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        msg[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        msg[align(HDR)..align(HDR) + data.len()].copy_from_slice(data);
        self.len += need;
        true
    }

    /// Appends a message whose data is a C `int`.
    pub(crate) fn push_int(&mut self, level: libc::c_int, ty: libc::c_int, value: i32) -> bool {
        self.push(level, ty, &value.to_ne_bytes())
    }

    /// Appends a message whose data is a C `__u16`.
    pub(crate) fn push_u16(&mut self, level: libc::c_int, ty: libc::c_int, value: u16) -> bool {
        self.push(level, ty, &value.to_ne_bytes())
    }
}

/// One parsed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message<'a> {
    /// `cmsg_level` (`IPPROTO_IP`, `IPPROTO_IPV6`, `SOL_UDP`, `SOL_SOCKET`).
    pub(crate) level: libc::c_int,
    /// `cmsg_type`.
    pub(crate) ty: libc::c_int,
    /// The data bytes (`cmsg_len - CMSG_LEN(0)` of them).
    pub(crate) data: &'a [u8],
}

impl Message<'_> {
    /// The data as a C `int`, if it is exactly 4 bytes.
    pub(crate) fn int(&self) -> Option<i32> {
        Some(i32::from_ne_bytes(self.data.try_into().ok()?))
    }

    /// The data as one byte (IPv4 `IP_TOS` is delivered as a single byte, ip(7)) or as an `int`.
    pub(crate) fn byte_or_int(&self) -> Option<u8> {
        match self.data.len() {
            1 => Some(self.data[0]),
            4 => self.int().map(|v| v as u8),
            _ => None,
        }
    }
}

/// Iterates over the messages of a control buffer as the kernel filled it. Stops at the first
/// malformed header (a `cmsg_len` shorter than a header or running past the buffer), so a bad
/// buffer yields fewer messages, never a panic.
pub(crate) struct Iter<'a> {
    buf: &'a [u8],
}

impl<'a> Iter<'a> {
    /// Messages of `buf` (the first `msg_controllen` bytes of the control buffer).
    pub(crate) fn new(buf: &'a [u8]) -> Iter<'a> {
        Iter { buf }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = Message<'a>;

    fn next(&mut self) -> Option<Message<'a>> {
        if self.buf.len() < HDR {
            return None;
        }
        let cmsg_len = usize::from_ne_bytes(self.buf[..ALIGN].try_into().ok()?);
        let level = i32::from_ne_bytes(self.buf[ALIGN..ALIGN + 4].try_into().ok()?);
        let ty = i32::from_ne_bytes(self.buf[ALIGN + 4..ALIGN + 8].try_into().ok()?);
        if cmsg_len < align(HDR) || cmsg_len > self.buf.len() {
            self.buf = &[];
            return None;
        }
        let data = &self.buf[align(HDR)..cmsg_len];
        self.buf = self.buf.get(align(cmsg_len)..).unwrap_or(&[]);
        Some(Message { level, ty, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn sizes_match_libc_macros() {
        for n in [0usize, 1, 2, 4, 8, 9, 16] {
            // SAFETY: CMSG_LEN / CMSG_SPACE only do arithmetic on their argument.
            let (l, s) = unsafe { (libc::CMSG_LEN(n as u32), libc::CMSG_SPACE(n as u32)) };
            assert_eq!(len(n), l as usize, "CMSG_LEN({n})");
            assert_eq!(space(n), s as usize, "CMSG_SPACE({n})");
        }
    }

    #[test]
    fn write_then_parse() {
        let mut buf = [0xa5u8; 128];
        let mut w = Writer::new(&mut buf);
        assert!(w.push_int(libc::IPPROTO_IP, libc::IP_TOS, 0x8a));
        assert!(w.push_u16(libc::SOL_UDP, libc::UDP_SEGMENT, 1100));
        assert!(w.push(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &[3]));
        let n = w.len();
        assert_eq!(n, space(4) + space(2) + space(1));
        let msgs: Vec<_> = Iter::new(&buf[..n]).collect();
        assert_eq!(msgs.len(), 3);
        assert_eq!(
            (msgs[0].level, msgs[0].ty, msgs[0].int()),
            (libc::IPPROTO_IP, libc::IP_TOS, Some(0x8a))
        );
        assert_eq!(msgs[1].data, &1100u16.to_ne_bytes());
        assert_eq!(msgs[2].byte_or_int(), Some(3));
        assert_eq!(msgs[1].byte_or_int(), None);
    }

    #[test]
    fn full_buffer_refuses() {
        let mut buf = [0u8; 20];
        let mut w = Writer::new(&mut buf);
        assert!(!w.push_int(1, 2, 3), "24 bytes do not fit 20");
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn malformed_headers_stop_iteration() {
        // cmsg_len shorter than a header.
        let mut buf = [0u8; 32];
        buf[..ALIGN].copy_from_slice(&3usize.to_ne_bytes());
        assert_eq!(Iter::new(&buf).count(), 0);
        // cmsg_len past the end.
        buf[..ALIGN].copy_from_slice(&1000usize.to_ne_bytes());
        assert_eq!(Iter::new(&buf).count(), 0);
        // Truncated trailing bytes after a good message are ignored.
        let mut good = [0u8; 40];
        let mut w = Writer::new(&mut good);
        assert!(w.push_int(0, 1, 7));
        assert_eq!(Iter::new(&good[..space(4) + 5]).count(), 1);
        // Random bytes never panic.
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut b = [0u8; 64];
            for byte in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *byte = x as u8;
            }
            for m in Iter::new(&b) {
                let _ = (m.int(), m.byte_or_int());
            }
        }
    }
}
