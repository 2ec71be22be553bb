//! Little-endian encoding of the small records the bootstrap exchanges (business cards,
//! connection infos, rendezvous frames). Decoding never panics: a short or malformed record is a
//! [`Truncated`] error that the caller turns into its own error naming the peer.

use core::fmt;

/// A record ended before a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// The field that did not fit.
    pub field: &'static str,
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "record truncated at field '{}'", self.field)
    }
}

/// Appends fields to a byte vector.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u32 length, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads fields from a byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], Truncated> {
        if self.buf.len() < n {
            return Err(Truncated { field });
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, Truncated> {
        Ok(self.take(1, field)?[0])
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, Truncated> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, field: &'static str) -> Result<u64, Truncated> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], Truncated> {
        let n = self.u32(field)? as usize;
        self.take(n, field)
    }

    pub fn str(&mut self, field: &'static str) -> Result<String, Truncated> {
        Ok(String::from_utf8_lossy(self.bytes(field)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = Writer::default();
        w.u8(1).u32(2).u64(3).str("héllo").bytes(&[9, 8]);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u8("a"), Ok(1));
        assert_eq!(r.u32("b"), Ok(2));
        assert_eq!(r.u64("c"), Ok(3));
        assert_eq!(r.str("d").unwrap(), "héllo");
        assert_eq!(r.bytes("e").unwrap(), &[9, 8]);
        assert_eq!(r.u8("f"), Err(Truncated { field: "f" }));
        // A length prefix larger than the record.
        let mut r = Reader::new(&[0xff, 0xff, 0, 0, 1]);
        assert_eq!(r.bytes("g"), Err(Truncated { field: "g" }));
    }
}
