//! Classic libpcap capture files, for looking at frames with Wireshark / tshark.
//!
//! The classic pcap format (pcap-savefile(5); draft-ietf-opsawg-pcap) is a 24-byte global header
//! followed by records, each a 16-byte record header and the captured bytes of one frame:
//!
//! ```text
//! global header: magic 0xa1b2c3d4 | version 2.4 | thiszone 0 | sigfigs 0 | snaplen | linktype
//! record:        ts_sec | ts_usec | incl_len | orig_len | incl_len bytes of the frame
//! ```
//!
//! Fields are in the byte order of the writer; readers detect it from the magic. This writer always uses
//! little-endian (the output does not depend on the host), microsecond timestamps, snaplen 65535 and
//! link type 1 (`LINKTYPE_ETHERNET`: each record is an Ethernet II frame starting at the destination MAC,
//! without preamble and FCS). Frames longer than the snaplen are cut to it, with `orig_len` telling the
//! full length, as libpcap does.

use std::io::{self, Read, Write};
use std::time::Duration;
use std::vec::Vec;

/// The classic pcap magic number for microsecond timestamps (pcap-savefile(5)).
pub const MAGIC: u32 = 0xA1B2_C3D4;
/// Format version major.minor = 2.4.
pub const VERSION: (u16, u16) = (2, 4);
/// The largest number of bytes stored per frame.
pub const SNAPLEN: u32 = 65_535;
/// Link type of Ethernet II frames (tcpdump.org link-layer header types: `LINKTYPE_ETHERNET` = 1).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Length of the global file header in bytes.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Length of each record header in bytes.
pub const RECORD_HEADER_LEN: usize = 16;

/// Writes Ethernet frames into a classic pcap file (see the module docs for the format).
///
/// Wrap a file in a `std::io::BufWriter`: every frame is two `write_all` calls.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    writer: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the 24-byte global header to `writer` and returns the writer.
    ///
    /// # Errors
    /// Any error of `writer`.
    pub fn new(mut writer: W) -> io::Result<Self> {
        let mut header = [0u8; GLOBAL_HEADER_LEN];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..6].copy_from_slice(&VERSION.0.to_le_bytes());
        header[6..8].copy_from_slice(&VERSION.1.to_le_bytes());
        // thiszone (GMT offset) and sigfigs stay 0.
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        writer.write_all(&header)?;
        Ok(PcapWriter { writer })
    }

    /// Appends one Ethernet frame captured at `timestamp` (time since the Unix epoch; stored in seconds and
    /// microseconds, the nanoseconds below a microsecond are dropped). Frames over [`SNAPLEN`] bytes are
    /// stored cut to [`SNAPLEN`] bytes with their full length in `orig_len`.
    ///
    /// # Errors
    /// `InvalidInput` if the timestamp's seconds or the frame length do not fit the 32-bit fields
    /// (nothing is written then); otherwise any error of the writer.
    pub fn write_packet(&mut self, timestamp: Duration, frame: &[u8]) -> io::Result<()> {
        let ts_sec = u32::try_from(timestamp.as_secs()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "pcap timestamp beyond 2106 does not fit 32 bits",
            )
        })?;
        let orig_len = u32::try_from(frame.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame longer than 4 GiB does not fit a pcap record",
            )
        })?;
        let incl_len = orig_len.min(SNAPLEN);
        let mut header = [0u8; RECORD_HEADER_LEN];
        header[0..4].copy_from_slice(&ts_sec.to_le_bytes());
        header[4..8].copy_from_slice(&timestamp.subsec_micros().to_le_bytes());
        header[8..12].copy_from_slice(&incl_len.to_le_bytes());
        header[12..16].copy_from_slice(&orig_len.to_le_bytes());
        self.writer.write_all(&header)?;
        // incl_len <= frame.len(), so the slice is in bounds.
        self.writer.write_all(&frame[..incl_len as usize])
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.writer
    }

    /// The underlying writer, mutably (writing to it directly corrupts the file).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.writer
    }

    /// Flushes the underlying writer.
    ///
    /// # Errors
    /// Any error of the writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Returns the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.writer
    }
}

/// Reads frames from a classic pcap file: either byte order, microsecond or nanosecond timestamps
/// (magic 0xa1b2c3d4 / 0xa1b23c4d, pcap-savefile(5)). Only the Ethernet link type is accepted, since
/// every frame here is an Ethernet frame. pcapng files are refused with a clear error.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    reader: R,
    little_endian: bool,
    nanos: bool,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, std::format!("pcap: {what}"))
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the global header.
    ///
    /// # Errors
    /// `InvalidData` for an unknown magic (including pcapng) or a link type other than Ethernet; any
    /// I/O error of the reader.
    pub fn new(mut reader: R) -> io::Result<Self> {
        let mut header = [0u8; GLOBAL_HEADER_LEN];
        reader.read_exact(&mut header)?;
        let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let (little_endian, nanos) = match magic {
            0xA1B2_C3D4 => (true, false),
            0xA1B2_3C4D => (true, true),
            0xD4C3_B2A1 => (false, false),
            0x4D3C_B2A1 => (false, true),
            0x0A0D_0D0A => return Err(invalid("pcapng files are not supported; save as pcap")),
            _ => return Err(invalid("not a pcap file (unknown magic)")),
        };
        let this = PcapReader {
            reader,
            little_endian,
            nanos,
        };
        let linktype = this.u32_at(&header, 20);
        if linktype != LINKTYPE_ETHERNET {
            return Err(invalid("link type is not Ethernet (1)"));
        }
        Ok(this)
    }

    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if self.little_endian {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        }
    }

    /// The next frame and its timestamp, or `None` at a clean end of file.
    ///
    /// # Errors
    /// `UnexpectedEof` when the file ends inside a record; `InvalidData` for a record longer than the
    /// snaplen limit of 256 KiB (a corrupt length); any I/O error of the reader.
    pub fn next_packet(&mut self) -> io::Result<Option<(Duration, Vec<u8>)>> {
        let mut header = [0u8; RECORD_HEADER_LEN];
        let mut got = 0;
        while got < header.len() {
            match self.reader.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let secs = u64::from(self.u32_at(&header, 0));
        let frac = self.u32_at(&header, 4);
        let incl_len = self.u32_at(&header, 8) as usize;
        if incl_len > 256 * 1024 {
            return Err(invalid("record length over 256 KiB"));
        }
        let mut frame = std::vec![0u8; incl_len];
        self.reader.read_exact(&mut frame)?;
        let timestamp = if self.nanos {
            Duration::new(secs, frac.min(999_999_999))
        } else {
            Duration::new(secs, frac.min(999_999).saturating_mul(1000))
        };
        Ok(Some((timestamp, frame)))
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn two_frames_bytes() {
        let mut pcap = PcapWriter::new(Vec::new()).unwrap();
        pcap.write_packet(Duration::new(1_700_000_000, 123_456_789), &[1, 2, 3])
            .unwrap();
        pcap.write_packet(Duration::from_micros(1), &[0xAA; 2])
            .unwrap();
        let bytes = pcap.into_inner();
        #[rustfmt::skip]
        let expected: &[u8] = &[
            // global header
            0xD4, 0xC3, 0xB2, 0xA1, // magic
            0x02, 0x00, 0x04, 0x00, // version 2.4
            0, 0, 0, 0,             // thiszone
            0, 0, 0, 0,             // sigfigs
            0xFF, 0xFF, 0x00, 0x00, // snaplen 65535
            0x01, 0x00, 0x00, 0x00, // LINKTYPE_ETHERNET
            // record 1
            0x00, 0xF1, 0x53, 0x65, // ts_sec 1_700_000_000 = 0x6553F100
            0x40, 0xE2, 0x01, 0x00, // ts_usec 123456 = 0x1E240
            3, 0, 0, 0,             // incl_len
            3, 0, 0, 0,             // orig_len
            1, 2, 3,
            // record 2
            0, 0, 0, 0,
            1, 0, 0, 0,
            2, 0, 0, 0,
            2, 0, 0, 0,
            0xAA, 0xAA,
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn long_frame_is_cut_to_snaplen() {
        let mut pcap = PcapWriter::new(Vec::new()).unwrap();
        let frame = vec![0x5A; 70_000];
        pcap.write_packet(Duration::ZERO, &frame).unwrap();
        let bytes = pcap.into_inner();
        let rec = &bytes[GLOBAL_HEADER_LEN..];
        assert_eq!(&rec[8..12], &SNAPLEN.to_le_bytes());
        assert_eq!(&rec[12..16], &70_000u32.to_le_bytes());
        assert_eq!(rec.len(), RECORD_HEADER_LEN + SNAPLEN as usize);
    }

    #[test]
    fn timestamp_overflow_is_an_error() {
        let mut pcap = PcapWriter::new(Vec::new()).unwrap();
        let err = pcap
            .write_packet(Duration::from_secs(1 << 32), &[0])
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(pcap.get_ref().len(), GLOBAL_HEADER_LEN);
    }

    #[test]
    fn reader_reads_back_what_the_writer_wrote() {
        let mut w = PcapWriter::new(Vec::new()).expect("header");
        w.write_packet(Duration::from_micros(1_500_001), &[1, 2, 3])
            .expect("frame");
        w.write_packet(Duration::from_secs(7), &[]).expect("frame");
        let bytes = w.into_inner();
        let mut r = PcapReader::new(&bytes[..]).expect("header");
        assert_eq!(
            r.next_packet().expect("read"),
            Some((Duration::from_micros(1_500_001), std::vec![1, 2, 3]))
        );
        assert_eq!(
            r.next_packet().expect("read"),
            Some((Duration::from_secs(7), Vec::new()))
        );
        assert_eq!(r.next_packet().expect("eof"), None);
        // A file cut inside a record is an error, not a silent end.
        let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).expect("header");
        r.next_packet().expect("first");
        assert!(r.next_packet().is_err());
        // pcapng and junk are refused.
        assert!(PcapReader::new(&[0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0][..]).is_err());
        let mut junk = bytes.clone();
        junk[0] ^= 0xff;
        assert!(PcapReader::new(&junk[..]).is_err());
    }
}
