//! The transport's connection info (see the [transport docs](super#connection-info-the-bootstrap-record-of-this-transport-little-endian)):
//! what a rank publishes through the bootstrap, and the parser of a peer's.

use hca::{Gid, PathMtu};

use super::layout::Layout;
use crate::codec::Reader;

/// "COLLROC1".
pub(super) const INFO_MAGIC: u64 = u64::from_le_bytes(*b"COLLROC1");
pub(super) const INFO_VERSION: u32 = 1;

/// A peer's connection info, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PeerInfo {
    pub(super) gid: Gid,
    pub(super) port: u16,
    pub(super) mtu: PathMtu,
    pub(super) layout: Layout,
    pub(super) region: (u64, u64),
    pub(super) rkey: u32,
    /// Per peer of theirs: rank, and per channel its QP.
    pub(super) peers: Vec<(usize, Vec<RemoteQp>)>,
}

/// A peer's QP of one channel, as its connection info describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RemoteQp {
    pub(super) qpn: u32,
    /// Its first send PSN (our receive PSN).
    pub(super) psn: u32,
    /// The ring it receives this rank's writes in (iova).
    pub(super) ring: u64,
}

impl PeerInfo {
    pub(super) fn parse(info: &[u8]) -> Result<PeerInfo, String> {
        let mut r = Reader::new(info);
        let e = |t: crate::codec::Truncated| t.to_string();
        if r.u64("magic").map_err(e)? != INFO_MAGIC {
            return Err("not RoCE connection info (bad magic)".into());
        }
        let version = r.u32("version").map_err(e)?;
        if version != INFO_VERSION {
            return Err(format!(
                "RoCE connection info version {version}, this build speaks {INFO_VERSION}"
            ));
        }
        let g = r.bytes("gid").map_err(e)?;
        let gid = Gid::from_bytes(
            g.try_into()
                .map_err(|_| format!("a GID of {} bytes", g.len()))?,
        );
        let port = u16::try_from(r.u32("udp port").map_err(e)?)
            .map_err(|_| "UDP port out of range".to_string())?;
        let code = r.u32("mtu").map_err(e)?;
        let mtu = [
            PathMtu::Mtu256,
            PathMtu::Mtu512,
            PathMtu::Mtu1024,
            PathMtu::Mtu2048,
            PathMtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| u32::from(m.code()) == code)
        .ok_or_else(|| format!("unknown MTU code {code}"))?;
        let layout = Layout {
            nchannels: r.u32("nchannels").map_err(e)? as usize,
            nslots: r.u32("nslots").map_err(e)? as usize,
            slot_bytes: r.u64("slot_bytes").map_err(e)? as usize,
        };
        let region = (
            r.u64("region iova").map_err(e)?,
            r.u64("region length").map_err(e)?,
        );
        let rkey = r.u32("rkey").map_err(e)?;
        let npeers = r.u32("peer count").map_err(e)? as usize;
        // Each peer takes a rank and 16 bytes per channel (at most 64 read): a count the rest of
        // the record cannot hold is refused before anything is allocated for it, so the peer
        // list is never larger than the record (itself at most the rendezvous's MAX_FRAME).
        let per_peer = 4 + 16 * layout.nchannels.min(64);
        if npeers > r.remaining() / per_peer {
            return Err(format!(
                "{npeers} peers in {} bytes ({per_peer} bytes each)",
                r.remaining()
            ));
        }
        let mut peers = Vec::with_capacity(npeers);
        for _ in 0..npeers {
            let rank = r.u32("peer rank").map_err(e)? as usize;
            let mut chans = Vec::new();
            for _ in 0..layout.nchannels.min(64) {
                chans.push(RemoteQp {
                    qpn: r.u32("qpn").map_err(e)?,
                    psn: r.u32("psn").map_err(e)?,
                    ring: r.u64("ring iova").map_err(e)?,
                });
            }
            peers.push((rank, chans));
        }
        Ok(PeerInfo {
            gid,
            port,
            mtu,
            layout,
            region,
            rkey,
            peers,
        })
    }
}
