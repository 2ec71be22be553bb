//! Protection domains.
//!
//! A protection domain (PD, IBTA vol. 1 ch. 10, ibv_alloc_pd(3)) groups the objects that may be
//! used together: a QP may only use memory regions and address handles of its own PD, so a key
//! leaked from one application's PD is useless on another's QPs. A PD holds nothing itself; it is a
//! name that MRs, QPs, SRQs and AHs carry. It cannot be deallocated while any of them still exists
//! (`EBUSY`, ibv_dealloc_pd(3)).

use crate::verbs::table::Handle;

/// A protection domain. Its only state is how many objects (MRs, QPs, SRQs, AHs) refer to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pd {
    pub(crate) users: u32,
}

impl Pd {
    /// How many MRs, QPs, SRQs and AHs belong to this PD.
    pub fn users(&self) -> u32 {
        self.users
    }
}

/// Handle of a [`Pd`] in a [`crate::Context`].
pub type PdHandle = Handle<Pd>;
