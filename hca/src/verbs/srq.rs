//! Shared receive queues.
//!
//! A shared receive queue (SRQ, IBTA vol. 1 ch. 10, ibv_create_srq(3)) is one pool of receive
//! WQEs that many QPs draw from, so a server with thousands of connections need not post buffers
//! to each. A QP created with an SRQ has no receive queue of its own (post_recv on it fails).
//!
//! An SRQ may be *armed* with a limit (ibv_modify_srq(3), IBV_SRQ_LIMIT): when the number of posted
//! WQEs drops below the limit, the HCA raises `IBV_EVENT_SRQ_LIMIT_REACHED` once and disarms
//! (limit back to 0), so the program can refill in time.

use bitflags::bitflags;

use crate::verbs::cq::rxe_queue_capacity;
use crate::verbs::device::DeviceAttr;
use crate::verbs::error::Cause;
use crate::verbs::pd::PdHandle;
use crate::verbs::recv_queue::{RecvQueue, RecvWqe};
use crate::verbs::table::Handle;
use crate::verbs::wr::RecvWr;

/// Handle of an [`Srq`] in a [`crate::Context`].
pub type SrqHandle = Handle<Srq>;

/// SRQ attributes (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Capacity in WQEs (at create: the minimum wanted; rounded up as rxe does).
    pub max_wr: u32,
    /// Most SGEs per WQE (fixed at create).
    pub max_sge: u32,
    /// The limit: 0 disarmed, otherwise raise SRQ_LIMIT_REACHED when fewer WQEs are posted.
    pub srq_limit: u32,
}

bitflags! {
    /// Which attributes ibv_modify_srq(3) changes (`enum ibv_srq_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize to `max_wr` (`IBV_SRQ_MAX_WR`).
        const MAX_WR = 1 << 0;
        /// Arm with `srq_limit` (`IBV_SRQ_LIMIT`).
        const LIMIT = 1 << 1;
    }
}

/// What [`Srq::pop`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqPop {
    /// The `wr_id` of the consumed WQE.
    pub wr_id: u64,
    /// Whether this consumption dropped the SRQ below its armed limit: the caller must raise
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` (the SRQ is now disarmed).
    pub limit_reached: bool,
}

/// A shared receive queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srq {
    pd: PdHandle,
    rq: RecvQueue,
    limit: u32,
    pub(crate) users: u32,
}

impl Srq {
    /// Creates an SRQ in `pd` (rxe `rxe_srq_chk_init`, `rxe_srq_from_init`): `max_wr` is rounded
    /// up to a power of two minus one, `max_sge` 0 becomes 1, `srq_limit` arms the SRQ at once.
    ///
    /// # Errors
    /// [`Cause::InvalidValue`] for `max_wr` 0; [`Cause::OutOfRange`] for `max_wr` above
    /// `max_srq_wr`, `max_sge` above `max_srq_sge`, or `srq_limit` above the capacity.
    pub fn new(pd: PdHandle, init: &SrqAttr, device: &DeviceAttr) -> Result<Self, Cause> {
        check_max_wr(init.max_wr, device)?;
        if init.max_sge > device.max_srq_sge {
            return Err(Cause::OutOfRange {
                attr: "max_sge",
                value: init.max_sge.into(),
                max: device.max_srq_sge.into(),
            });
        }
        let max_wr = rxe_queue_capacity(init.max_wr);
        check_limit(init.srq_limit, max_wr)?;
        Ok(Srq {
            pd,
            rq: RecvQueue::new(max_wr, init.max_sge.max(1)),
            limit: init.srq_limit,
            users: 0,
        })
    }

    /// The protection domain.
    pub fn pd(&self) -> PdHandle {
        self.pd
    }

    /// How many QPs use this SRQ.
    pub fn users(&self) -> u32 {
        self.users
    }

    /// Current attributes (ibv_query_srq(3)).
    pub fn query(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.rq.max_wr(),
            max_sge: self.rq.max_sge(),
            srq_limit: self.limit,
        }
    }

    /// Resizes and/or arms the SRQ (ibv_modify_srq(3); rxe `rxe_srq_chk_attr`). Checks both
    /// attributes before changing either.
    ///
    /// # Errors
    /// [`Cause::InvalidValue`] / [`Cause::OutOfRange`] for a `max_wr` of 0, above `max_srq_wr`,
    /// below the armed limit or below the posted WQEs; [`Cause::OutOfRange`] for a limit above
    /// the capacity; [`Cause::InvalidValue`] (`srq_attr_mask`) for unknown mask bits.
    pub fn modify(
        &mut self,
        attr: &SrqAttr,
        mask: SrqAttrMask,
        device: &DeviceAttr,
    ) -> Result<(), Cause> {
        if mask.bits() & !SrqAttrMask::all().bits() != 0 {
            return Err(Cause::InvalidValue {
                attr: "srq_attr_mask",
                value: mask.bits().into(),
            });
        }
        let mut max_wr = self.rq.max_wr();
        if mask.contains(SrqAttrMask::MAX_WR) {
            check_max_wr(attr.max_wr, device)?;
            let limit = if mask.contains(SrqAttrMask::LIMIT) {
                attr.srq_limit
            } else {
                self.limit
            };
            if attr.max_wr < limit {
                return Err(Cause::OutOfRange {
                    attr: "srq_limit",
                    value: limit.into(),
                    max: attr.max_wr.into(),
                });
            }
            max_wr = rxe_queue_capacity(attr.max_wr);
            if (max_wr as usize) < self.rq.len() {
                return Err(Cause::OutOfRange {
                    attr: "max_wr",
                    value: self.rq.len() as u64,
                    max: max_wr.into(),
                });
            }
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            check_limit(attr.srq_limit, max_wr)?;
        }
        if mask.contains(SrqAttrMask::MAX_WR) {
            self.rq.set_max_wr(max_wr)?;
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            self.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Posts a receive WR (ibv_post_srq_recv(3)); nothing is queued on error.
    ///
    /// # Errors
    /// As [`RecvQueue::post`].
    pub fn post_recv(&mut self, wr: &RecvWr<'_>, max_msg_sz: u64) -> Result<(), Cause> {
        self.rq.post(wr, max_msg_sz)
    }

    /// The oldest WQE.
    pub fn front(&self) -> Option<RecvWqe<'_>> {
        self.rq.front()
    }

    /// Posted WQEs.
    pub fn len(&self) -> usize {
        self.rq.len()
    }

    /// Whether no WQE is posted.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }

    /// Removes the oldest WQE, for a QP that took it. Reports (once) when the count fell below the
    /// armed limit, and disarms (ibv_modify_srq(3)).
    pub fn pop(&mut self) -> Option<SrqPop> {
        let wr_id = self.rq.pop()?;
        let limit_reached = self.limit != 0 && (self.rq.len() as u64) < u64::from(self.limit);
        if limit_reached {
            self.limit = 0;
        }
        Some(SrqPop {
            wr_id,
            limit_reached,
        })
    }

    /// Removes every WQE, yielding their `wr_id`s (SRQ error: complete them with
    /// `IBV_WC_WR_FLUSH_ERR`).
    pub fn drain(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.rq.drain()
    }
}

fn check_max_wr(max_wr: u32, device: &DeviceAttr) -> Result<(), Cause> {
    if max_wr == 0 {
        return Err(Cause::InvalidValue {
            attr: "max_wr",
            value: 0,
        });
    }
    if max_wr > device.max_srq_wr {
        return Err(Cause::OutOfRange {
            attr: "max_wr",
            value: max_wr.into(),
            max: device.max_srq_wr.into(),
        });
    }
    Ok(())
}

fn check_limit(limit: u32, max_wr: u32) -> Result<(), Cause> {
    if limit > max_wr {
        return Err(Cause::OutOfRange {
            attr: "srq_limit",
            value: limit.into(),
            max: max_wr.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::wr::Sge;

    const PD: PdHandle = Handle::from_raw(1, 0);

    fn attr(max_wr: u32, max_sge: u32, srq_limit: u32) -> SrqAttr {
        SrqAttr {
            max_wr,
            max_sge,
            srq_limit,
        }
    }

    fn post(srq: &mut Srq, wr_id: u64) -> Result<(), Cause> {
        let sg = [Sge {
            addr: 0,
            length: 64,
            lkey: 0x100,
        }];
        srq.post_recv(
            &RecvWr {
                wr_id,
                sg_list: &sg,
            },
            1 << 31,
        )
    }

    #[test]
    fn create_checks_and_rounding() {
        let dev = DeviceAttr::default();
        let s = Srq::new(PD, &attr(10, 0, 0), &dev).unwrap();
        assert_eq!(s.query(), attr(15, 1, 0));
        assert!(matches!(
            Srq::new(PD, &attr(0, 1, 0), &dev),
            Err(Cause::InvalidValue { attr: "max_wr", .. })
        ));
        assert!(matches!(
            Srq::new(PD, &attr(dev.max_srq_wr + 1, 1, 0), &dev),
            Err(Cause::OutOfRange { attr: "max_wr", .. })
        ));
        assert!(matches!(
            Srq::new(PD, &attr(4, 28, 0), &dev),
            Err(Cause::OutOfRange {
                attr: "max_sge",
                ..
            })
        ));
        assert!(matches!(
            Srq::new(PD, &attr(4, 1, 8), &dev),
            Err(Cause::OutOfRange {
                attr: "srq_limit",
                ..
            })
        ));
    }

    #[test]
    fn limit_event_fires_once_below_the_limit() {
        let dev = DeviceAttr::default();
        let mut s = Srq::new(PD, &attr(7, 1, 0), &dev).unwrap();
        for i in 0..5 {
            post(&mut s, i).unwrap();
        }
        s.modify(&attr(0, 0, 3), SrqAttrMask::LIMIT, &dev).unwrap();
        assert_eq!(s.query().srq_limit, 3);
        assert!(!s.pop().unwrap().limit_reached, "4 left");
        assert!(!s.pop().unwrap().limit_reached, "3 left");
        let p = s.pop().unwrap();
        assert_eq!(p.wr_id, 2);
        assert!(p.limit_reached, "2 left < 3");
        assert_eq!(s.query().srq_limit, 0, "disarmed");
        assert!(!s.pop().unwrap().limit_reached);
    }

    #[test]
    fn modify_validates_before_changing() {
        let dev = DeviceAttr::default();
        let mut s = Srq::new(PD, &attr(7, 1, 0), &dev).unwrap();
        for i in 0..6 {
            post(&mut s, i).unwrap();
        }
        let before = s.clone();
        assert!(s.modify(&attr(3, 0, 0), SrqAttrMask::MAX_WR, &dev).is_err());
        assert!(s
            .modify(
                &attr(31, 0, 32),
                SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT,
                &dev
            )
            .is_err());
        assert!(s.modify(&attr(0, 0, 8), SrqAttrMask::LIMIT, &dev).is_err());
        assert!(s
            .modify(&attr(0, 0, 0), SrqAttrMask::from_bits_retain(4), &dev)
            .is_err());
        assert_eq!(s, before);
        s.modify(
            &attr(20, 0, 10),
            SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT,
            &dev,
        )
        .unwrap();
        assert_eq!(s.query(), attr(31, 1, 10));
        for i in 6..31 {
            post(&mut s, i).unwrap();
        }
        assert_eq!(post(&mut s, 99), Err(Cause::QueueFull { max_wr: 31 }));
        assert_eq!(s.drain().count(), 31);
    }
}
